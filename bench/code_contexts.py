#!/usr/bin/env python3
"""
What a code context costs over driving the same ipykernel with
``jupyter_client`` directly.

Starts a fresh daemon (twistd, the ``code`` group on), creates one context
(a real ipykernel, spawned by sandboxd, spoken to through its hub child),
and, in the same run, starts the same kernelspec with ``jupyter_client``'s
``KernelManager`` and a blocking client. Then, alternating the two so drift
on a shared machine hits both alike:

- ``1+1``: ``--calls`` executions, latency p50/p99 of each; the overhead is
  sandboxd's p50 minus the direct p50 (the issue's target: at most 2 ms);
- a print of ``--mib`` MiB: the time until the whole output is in the
  client's hands (sandboxd: the 200 result document, head and tail within
  max_output_bytes; direct: every iopub ``stream`` message until ``idle``),
  as MB/s (the target: at least 0.8x direct), ``--prints`` times per round;
  ``throughput_ratio`` compares the medians, ``throughput_ratio_paired`` is
  the median of each print's rate over the direct print right after it
  (load that drifts between rounds moves both alike); the document's
  time is split as its client sees it (``*_doc_head_ms``: until the
  answer began, which is once the execution has ended; ``*_doc_read_ms``:
  its body; ``*_doc_parse_ms``: ``json.loads`` of it);
- the same print read as its event stream (``stream: true``, SSE, each
  ``data:`` line decoded as it arrives, as direct's client decodes each
  kernel message while the kernel still prints), as ``sandboxd_sse``: the
  document is what the MCP tool answers, a stream what the events API and
  the E2B door (``/execute``, NDJSON) send;
- the same print as users' code reads it: our client's ``sb.code.execute``
  (``sandboxd_client``; ``sandboxd_client_doc`` is the same call told to
  wait, which reads the result document; ``sandboxd_client_doc_loads`` the
  same call made with ``httpx`` and ``json.loads``, as our client read the
  document before it took the output strings the short way) and
  ``e2b_code_interpreter``'s
  ``Sandbox.run_code`` through the E2B door (``sandboxd_e2b``), each
  against the direct print beside it.

The minor page faults per print of the daemon and of its hub are counted
too (memory each touches afresh: a print that reuses what the last one
freed has next to none). The CPU time the daemon and its hub spend per ``1+1`` and per print is
reported too (all their threads', from the scheduler's nanosecond count:
load stretches it far less than wall time), and per print the client's
own (this process's: reading and decoding the answer, the kernel's
messages for direct). ``--priority children`` (the
default) gives the direct kernel the CPU and I/O priority the daemon gives
its kernels; ``--priority off`` turns the daemon's priority policy off and
starts the direct kernel as it is. ``--tree DIR`` also runs a daemon from
another checkout (``PYTHONPATH``), alternated with the others: an A/B of a
change in one run.

Prints one JSON line per case and round, then a summary line.

    .venv/bin/python bench/code_contexts.py [--calls 300] [--mib 10] [--rounds 2] [--prints 1]
        [--priority children|off] [--tree ../main]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx
from daemon import e2b_sandbox, run_seconds, start_with_door, stop_all

#: The parts of a result document's answer, timed by the client: until its
#: head arrived (the execution; the daemon answers once it has ended),
#: from there to its last byte, and parsing it.
SPLIT = ("head", "read", "parse")


def post(conn: http.client.HTTPConnection, token: str, path: str, body: Any) -> Any:
    conn.request(
        "POST",
        path,
        json.dumps(body),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    reply = conn.getresponse()
    data = reply.read()
    if reply.status not in (200, 201):
        raise SystemExit(f"{path}: {reply.status} {data[:300]!r}")
    return json.loads(data)


def child_priority() -> None:
    """
    In the direct kernel before it execs: the CPU and I/O priority the
    daemon gives its children by default (docs/operations.md), so both
    kernels compete for a loaded machine on the same terms.
    """
    from sandboxd.policy.defaults import CHILD_IO_LEVEL, CHILD_NICE
    from sandboxd.processes import priority

    os.nice(CHILD_NICE)
    priority._set_ioprio(0, priority.best_effort(CHILD_IO_LEVEL))


class Direct:
    """The same kernelspec, driven by jupyter_client's blocking client."""

    def __init__(self, lowered: bool) -> None:
        from jupyter_client.manager import KernelManager

        from sandboxd.policy.defaults import AGENT_NICE

        self.km = KernelManager(kernel_name="python3")
        if lowered:
            self.km.start_kernel(preexec_fn=child_priority)
            pid = self.km.provisioner.process.pid  # type: ignore[union-attr]
            # Its own session, so its own autogroup: weigh it as the
            # daemon weighs its kernels' (at the agents' level).
            try:
                with open(f"/proc/{pid}/autogroup", "w") as f:
                    f.write(str(AGENT_NICE))
            except OSError:
                pass
        else:
            self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str) -> int:
        """Execute; the output characters seen, once the kernel is idle again."""
        msg_id = self.kc.execute(code)
        seen = 0
        while True:
            msg = self.kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                seen += len(msg["content"]["text"])
            elif (
                msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                break
        self.kc.get_shell_msg(timeout=120)
        return seen

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _minor_faults(pid: int) -> int:
    """A process's minor page faults so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _summed(read: Callable[[int], float], pids: list[int]) -> float:
    """``read`` of each process summed; one that has just gone counts as 0."""
    total = 0.0
    for pid in pids:
        try:
            total += read(pid)
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class Daemon:
    """One daemon with one context (``tree``: run from another checkout)."""

    def __init__(self, policy: dict[str, Any], tree: str | None) -> None:
        self.token = secrets.token_hex(16)
        self.base = tempfile.mkdtemp(prefix="bench-code-")
        self.proc, port, self.e2b_port = start_with_door(
            self.base, self.token, policy, "e2b", tree
        )
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        #: The last document's answer: seconds to its head, then to its
        #: last byte, then to parse it.
        self.split = (0.0, 0.0, 0.0)
        ctx = post(self.conn, self.token, "/code/contexts", {})
        self.context_id = ctx["id"]
        self.path = f"/code/contexts/{ctx['id']}/execute"
        from sandboxd.client import Sandbox

        self.client = Sandbox(f"http://127.0.0.1:{port}", token=self.token)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=330)
        from e2b_code_interpreter import Sandbox as CodeSandbox

        self.e2b = e2b_sandbox(CodeSandbox, self.e2b_port, self.token)

    def run(self, code: str) -> Any:
        """
        Execute; the result document. How long its answer took to begin,
        to arrive whole after that, and to be parsed is kept in ``split``.
        """
        t = time.perf_counter()
        self.conn.request(
            "POST",
            self.path,
            json.dumps({"code": code}),
            {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
            },
        )
        reply = self.conn.getresponse()
        head = time.perf_counter()
        data = reply.read()
        body = time.perf_counter()
        if reply.status != 200:
            raise SystemExit(f"execute: {reply.status} {data[:300]!r}")
        document = json.loads(data)
        self.split = (head - t, body - head, time.perf_counter() - body)
        return document

    def run_stream(self, code: str) -> int:
        """
        Execute as an event stream, each event decoded as it arrives; the
        output characters seen once ``execution.ended`` is in.
        """
        self.conn.request(
            "POST",
            self.path,
            json.dumps({"code": code, "stream": True}),
            {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
            },
        )
        reply = self.conn.getresponse()
        if reply.status != 200:
            raise SystemExit(f"stream: {reply.status} {reply.read()[:300]!r}")
        seen = 0
        event = ""
        for line in reply:
            if line.startswith(b"event: "):
                event = line[7:].strip().decode()
            elif line.startswith(b"data: "):
                data = json.loads(line[6:])
                if event in ("stdout", "stderr"):
                    seen += len(data["text"])
                elif event == "execution.ended":
                    assert data["state"] == "ok", data
        reply.close()
        return seen

    def run_client(self, code: str) -> int:
        """Our client's ``sb.code.execute``: the output characters in its result."""
        result = self.client.code.execute(self.context_id, code)
        assert result["state"] == "ok", result["state"]
        return len(result["stdout"])

    def run_client_doc(self, code: str) -> int:
        """The same, told to wait: it reads the result document."""
        result = self.client.code.execute(self.context_id, code, wait=300)
        assert result["state"] == "ok", result["state"]
        return len(result["stdout"])

    def run_client_doc_loads(self, code: str) -> int:
        """
        The same call through ``httpx`` with ``json.loads`` of its document
        (how our client read it before it took the output the short way).
        """
        reply = self.http.post(
            self.path,
            json={"code": code, "wait": 300},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        result = json.loads(reply.content)
        assert result["state"] == "ok", result["state"]
        return len(result["stdout"])

    def run_e2b(self, code: str) -> int:
        """``e2b_code_interpreter``'s ``run_code``: the output characters it holds."""
        execution = self.e2b.run_code(code)
        assert execution.error is None, execution.error
        return sum(len(text) for text in execution.logs.stdout)

    def hubs(self) -> list[int]:
        """The pids of the daemon's kernel hub(s)."""
        found = []
        for pid in _children(self.proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"sandboxd.kernels.hub" in f.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the daemon and by its kernel hub(s)."""
        return run_seconds(self.proc.pid), _summed(run_seconds, self.hubs())

    def faults(self) -> tuple[int, int]:
        """
        The minor page faults so far of the daemon and of its kernel
        hub(s): memory each touches for the first time (or again, after the
        C library gave it back).
        """
        return _minor_faults(self.proc.pid), int(_summed(_minor_faults, self.hubs()))

    def stop(self) -> None:
        self.client.close()
        self.http.close()
        stop_all([self.proc], 30)
        shutil.rmtree(self.base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--mib", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--prints", type=int, default=1, help="prints per round, per side"
    )
    parser.add_argument(
        "--priority",
        choices=("children", "off"),
        default="children",
        help="children: the direct kernel gets the priority the daemon gives"
        " its kernels (the default policy); off: the daemon's priority policy"
        " off and the direct kernel as started",
    )
    parser.add_argument(
        "--tree",
        help="also run a daemon from this checkout (PYTHONPATH), as 'tree'",
    )
    args = parser.parse_args()
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError:
        print(
            json.dumps(
                {"workload": "CODE", "skipped": "ipykernel or jupyter_client missing"}
            )
        )
        return
    policy: dict[str, Any] = {"groups": {"code": True}}
    if args.priority == "off":
        policy["priority"] = False
    daemons = {"sandboxd": Daemon(policy, None)}
    if args.tree:
        daemons["tree"] = Daemon(policy, args.tree)
    direct = Direct(lowered=args.priority == "children")
    runners: dict[str, Any] = {name: d.run for name, d in daemons.items()}
    runners["direct"] = direct.run
    #: The print read as a stream too (not the 1+1 loop).
    streams: dict[str, Any] = {}
    #: Which daemon each print case runs on (its CPU is counted).
    owner: dict[str, Daemon] = dict(daemons)
    for name, d in daemons.items():
        for case, run in (
            ("sse", d.run_stream),
            ("client", d.run_client),
            ("client_doc", d.run_client_doc),
            ("client_doc_loads", d.run_client_doc_loads),
            ("e2b", d.run_e2b),
        ):
            streams[f"{name}_{case}"] = run
            owner[f"{name}_{case}"] = d
    try:
        size = int(args.mib * 1024 * 1024)
        big = f"print('x' * {size - 1})"
        # Warm every side (imports, first compile).
        for _ in range(5):
            for run in [*runners.values(), *streams.values()]:
                run("1+1")
        latency: dict[str, list[float]] = {name: [] for name in runners}
        rates: dict[str, list[float]] = {name: [] for name in [*runners, *streams]}
        cpu_ms: dict[str, dict[str, list[float]]] = {
            name: {"daemon": [], "hub": []} for name in daemons
        }
        paired: dict[str, list[float]] = {name: [] for name in [*daemons, *streams]}
        print_cpu: dict[str, dict[str, list[float]]] = {
            name: {"daemon": [], "hub": []} for name in owner
        }
        client_cpu: dict[str, list[float]] = {name: [] for name in [*runners, *streams]}
        print_faults: dict[str, dict[str, list[int]]] = {
            name: {"daemon": [], "hub": []} for name in owner
        }
        split: dict[str, dict[str, list[float]]] = {
            name: {part: [] for part in SPLIT} for name in daemons
        }
        for round_ in range(args.rounds):
            lat: dict[str, list[float]] = {name: [] for name in runners}
            cpu_before = {name: d.cpu() for name, d in daemons.items()}
            for _ in range(args.calls):
                # Alternate, so drift on a shared machine hits every side.
                for name, run in runners.items():
                    t = time.perf_counter()
                    result = run("1+1")
                    lat[name].append((time.perf_counter() - t) * 1000)
                    if name != "direct":
                        assert result["results"][0]["data"]["text/plain"] == "2"
            for name, values in lat.items():
                latency[name] += values
                row = {
                    "workload": "CODE",
                    "case": f"1+1 {name}",
                    "round": round_,
                    "calls": len(values),
                    "p50_ms": round(statistics.median(values), 3),
                    "p99_ms": round(percentile(values, 99), 3),
                }
                if name in daemons:
                    # CPU per call: the work each side does, which the
                    # machine's load stretches far less than wall time.
                    after = daemons[name].cpu()
                    before = cpu_before[name]
                    for i, part in enumerate(("daemon", "hub")):
                        used = (after[i] - before[i]) * 1000 / len(values)
                        cpu_ms[name][part].append(used)
                        row[f"{part}_cpu_ms_per_call"] = round(used, 3)
                print(json.dumps(row))
            for _ in range(args.prints):
                line: dict[str, Any] = {
                    "workload": "CODE",
                    "case": f"print {args.mib:g} MiB",
                    "round": round_,
                }
                for name, run in [*runners.items(), *streams.items()]:
                    who = owner.get(name)
                    before = who.cpu() if who is not None else (0.0, 0.0)
                    faults = who.faults() if who is not None else (0, 0)
                    # The last case's output (a document holds 10 MiB of
                    # text) let go first: kept alive, it made whichever
                    # case came next read into memory new to this process.
                    result = None
                    t = time.perf_counter()
                    mine = time.process_time()
                    result = run(big)
                    took = time.perf_counter() - t
                    # The client's own CPU (this process: its reading and
                    # decoding), beside the daemon's and the hub's.
                    spent_here = (time.process_time() - mine) * 1000
                    client_cpu[name].append(spent_here)
                    line[f"{name}_client_cpu_ms"] = round(spent_here, 1)
                    if name == "direct" or name in streams:
                        seen = result
                    else:
                        assert result["state"] == "ok", result["state"]
                        seen = len(result["stdout"])
                        line[f"{name}_truncated"] = result["truncated"]
                        # Where the document's time went: until its
                        # answer began (the execution), reading it, parsing it.
                        for part, took_s in zip(
                            SPLIT, daemons[name].split, strict=True
                        ):
                            split[name][part].append(took_s * 1000)
                            line[f"{name}_doc_{part}_ms"] = round(took_s * 1000, 1)
                    if who is not None:
                        now = who.faults()
                        for i, part in enumerate(("daemon", "hub")):
                            faulted = now[i] - faults[i]
                            print_faults[name][part].append(faulted)
                            line[f"{name}_{part}_faults"] = faulted
                        after = who.cpu()
                        for i, part in enumerate(("daemon", "hub")):
                            spent = (after[i] - before[i]) * 1000
                            print_cpu[name][part].append(spent)
                            line[f"{name}_{part}_cpu_ms"] = round(spent, 1)
                    rates[name].append(seen / 1e6 / took)
                    line[f"{name}_mb_s"] = round(seen / 1e6 / took, 1)
                for name in [*daemons, *streams]:
                    # Against the direct print beside it: drift on a busy
                    # machine moves both alike.
                    paired[name].append(rates[name][-1] / rates["direct"][-1])
                print(json.dumps(line))
        d50 = statistics.median(latency["direct"])
        d_rate = statistics.median(rates["direct"])
        summary: dict[str, Any] = {"workload": "CODE", "case": "summary"}
        for name in streams:
            for part, each in print_cpu[name].items():
                summary[f"{name}_{part}_cpu_ms_per_print"] = round(
                    statistics.median(each), 1
                )
            rate = statistics.median(rates[name])
            summary[f"{name}_mb_s"] = round(rate, 1)
            summary[f"{name}_throughput_ratio"] = round(rate / d_rate, 2)
            summary[f"{name}_throughput_ratio_paired"] = round(
                statistics.median(paired[name]), 2
            )
        for name in runners:
            p50 = statistics.median(latency[name])
            rate = statistics.median(rates[name])
            summary[f"{name}_p50_ms"] = round(p50, 3)
            summary[f"{name}_p99_ms"] = round(percentile(latency[name], 99), 3)
            summary[f"{name}_mb_s"] = round(rate, 1)
            if name in split:
                for part, each in split[name].items():
                    summary[f"{name}_doc_{part}_ms"] = round(statistics.median(each), 1)
            if name in cpu_ms:
                for part, per_call in cpu_ms[name].items():
                    summary[f"{name}_{part}_cpu_ms_per_call"] = round(
                        statistics.median(per_call), 3
                    )
                for part, each in print_cpu[name].items():
                    summary[f"{name}_{part}_cpu_ms_per_print"] = round(
                        statistics.median(each), 1
                    )
            if name != "direct":
                prefix = "" if name == "sandboxd" else f"{name}_"
                summary[f"{prefix}p50_overhead_ms"] = round(p50 - d50, 3)
                summary[f"{prefix}throughput_ratio"] = round(rate / d_rate, 2)
                summary[f"{prefix}throughput_ratio_paired"] = round(
                    statistics.median(paired[name]), 2
                )
        for name, by_part in print_faults.items():
            for part, counts in by_part.items():
                summary[f"{name}_{part}_faults_per_print"] = statistics.median(counts)
        for name, each in client_cpu.items():
            summary[f"{name}_client_cpu_ms_per_print"] = round(
                statistics.median(each), 1
            )
        summary["priority"] = args.priority
        summary["loadavg"] = os.getloadavg()[0]
        print(json.dumps(summary))
    finally:
        direct.stop()
        for d in daemons.values():
            d.stop()


if __name__ == "__main__":
    main()
