"""
Code contexts (stateful kernels) against a real daemon and a real
ipykernel: state kept between executions, output as it comes, rich
results, errors, interrupts, restarts, deaths, ownership and bounds.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import signal
import sys
import threading
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SkipTest
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.kernels.kernelspecs import find_kernelspecs
from sandboxd.libc import QuietTrim
from sandboxd.policy.defaults import CODE_KEPT_EXECUTIONS
from sandboxd.testing import SSEReader
from tests.client.base import ClientCase
from tests.helpers import DaemonTestCase, alive, group_nice, need_autogroups


def need_ipykernel() -> None:
    """Skip (saying why) where no python3 kernelspec is installed."""
    if "python3" not in find_kernelspecs(os.environ):
        raise SkipTest("no python3 kernelspec (ipykernel is not installed)")
    if not all(importlib.util.find_spec(m) for m in ("jupyter_client", "zmq")):
        raise SkipTest("the code extra (jupyter_client, pyzmq) is not installed")


#: A kernel start (the hub, then ipykernel importing itself) runs at the
#: children's nice value, 10: on two cores shared with the suite's other
#: worker and a browser at nice 0 it gets a tenth of a core, and has been
#: seen to take most of the daemon's default 30 s, and more with other
#: work on the machine.  The code cases give a start this much room ...
KERNEL_START_SECONDS = 60
#: ... a client's call that may wait for a start this long ...
KERNEL_CALL_SECONDS = 75.0
#: ... and a case that starts a kernel or two this long in all.
KERNEL_CASE_SECONDS = 180
#: The policy fragment that gives a kernel start its room.
KERNEL_START: dict[str, Any] = {
    "endpoints": {
        "group:code": {"limits": {"start_timeout_seconds": KERNEL_START_SECONDS}}
    }
}


def code_policy(**group: Any) -> dict[str, Any]:
    """
    The code group on, with an optional ``group:code`` rule (a kernel start
    gets :data:`KERNEL_START_SECONDS` unless the rule says otherwise).
    """
    limits = {"start_timeout_seconds": KERNEL_START_SECONDS, **group.get("limits", {})}
    return {
        "groups": {"code": True},
        "endpoints": {"group:code": {**group, "limits": limits}},
    }


class CodeTestCase(DaemonTestCase):
    """A daemon with the code group on."""

    timeout = KERNEL_CASE_SECONDS
    policy = code_policy()

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def context(self, **body: Any) -> Any:
        """Create a context; its document."""
        reply = yield self.request("POST", "/code/contexts", body)
        self.assertEqual(reply.status, 201, reply.body)
        return reply.json()

    @inlineCallbacks
    def execute(self, cid: str, code: str, **body: Any) -> Any:
        """Execute and wait; the result document."""
        reply = yield self.request(
            "POST", f"/code/contexts/{cid}/execute", {"code": code, **body}
        )
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def stream(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """Open an SSE response; its reader."""
        import json
        from io import BytesIO

        from twisted.web.client import FileBodyProducer

        hdrs = Headers()
        for k, v in (headers or {}).items():
            hdrs.addRawHeader(k, v)
        producer = None
        method = b"GET"
        if body is not None:
            method = b"POST"
            hdrs.addRawHeader("Content-Type", "application/json")
            producer = FileBodyProducer(BytesIO(json.dumps(body).encode()))
        response = yield Agent(reactor).request(
            method, (self.daemon.url + path).encode(), hdrs, producer
        )
        self.assertEqual(response.code, 200)
        client = SSEReader()
        response.deliverBody(client)
        self.addCleanup(
            lambda: client.transport.stopProducing() if not client.done.called else None
        )
        return client


#: A cell that updates a display 50 times, and one that clears what it showed.
UPDATES_CODE = (
    "from IPython.display import display, HTML, clear_output\n"
    "h = display(HTML('<b>0</b>'), display_id=True)\n"
    "for i in range(50):\n    h.update(HTML(f'<b>{i + 1}</b>'))\n"
    "'done'"
)
CLEAR_CODE = (
    "from IPython.display import display, clear_output\n"
    "display('gone'); print('gone too')\nclear_output()\n"
    "print('after'); display('kept')\nclear_output(wait=True)\ndisplay('last')"
)


class KernelScenarios:
    """
    What every kernel does alike, run once per kernel (a subclass names it
    with :attr:`kernel` and is also a :class:`CodeTestCase`).
    """

    #: The kernelspec the scenarios run on.
    kernel = "python3"

    def context_body(self) -> dict[str, Any]:
        """The create body (a PATH whose python3 is this venv's: matplotlib)."""
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        return {"kernel": self.kernel, "env": {"PATH": path}}

    @inlineCallbacks
    def test_state_kept_between_executions(self: Any) -> Any:
        """A variable set by one execution is there for the next; the count grows; the last value is the result."""
        ctx = yield self.context(**self.context_body())
        self.assertEqual((ctx["kernel"], ctx["state"]), (self.kernel, "idle"))
        first = yield self.execute(ctx["id"], "x = 41\nprint('set')")
        self.assertEqual((first["state"], first["stdout"]), ("ok", "set\n"))
        second = yield self.execute(ctx["id"], "x + 1")
        self.assertEqual(second["state"], "ok")
        self.assertEqual(second["results"][0]["data"]["text/plain"], "42")
        self.assertTrue(second["results"][0]["is_result"])
        self.assertEqual(second["execution_count"], first["execution_count"] + 1)

    @inlineCallbacks
    def test_error_with_traceback(self: Any) -> Any:
        """An exception ends the execution ``error`` with name, value and traceback; stderr kept apart."""
        ctx = yield self.context(**self.context_body())
        result = yield self.execute(
            ctx["id"], "import sys\nprint('e', file=sys.stderr)\n1/0"
        )
        self.assertEqual(result["state"], "error")
        self.assertEqual(result["stderr"], "e\n")
        self.assertEqual(result["error"]["ename"], "ZeroDivisionError")
        self.assertIn("division by zero", result["error"]["evalue"])
        self.assertTrue(result["error"]["traceback"])

    @inlineCallbacks
    def test_matplotlib_png(self: Any) -> Any:
        """A matplotlib figure comes back as one PNG display item."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SkipTest("matplotlib is not installed") from None
        ctx = yield self.context(**self.context_body())
        result = yield self.execute(
            ctx["id"],
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        )
        self.assertEqual(result["state"], "ok", result)
        pngs = [
            r["data"]["image/png"]
            for r in result["results"]
            if "image/png" in r["data"]
        ]
        self.assertEqual(len(pngs), 1)
        self.assertTrue(base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n"))

    @inlineCallbacks
    def test_input(self: Any) -> Any:
        """input() asks (``input.requested``) and takes one answer; refused without allow_stdin."""
        ctx = yield self.context(**self.context_body())
        refused = yield self.execute(ctx["id"], "input('name? ')")
        self.assertEqual(refused["state"], "error")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "who = input('name? ')\nprint('hi', who)",
                "allow_stdin": True,
                "wait": 0,
            },
        )
        xid = reply.json()["execution_id"]
        reader = yield self.stream(reply.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "input.requested")
        asked = next(e for e in reader.events if e["event"] == "input.requested")
        self.assertEqual(asked["data"]["prompt"], "name? ")
        answered = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/executions/{xid}/input",
            {"value": "ada"},
        )
        self.assertEqual(answered.status, 200, answered.body)
        events = yield reader.done
        self.assertEqual(events[-1]["data"]["state"], "ok")
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}/executions/{xid}")
        self.assertEqual(got.json()["stdout"], "hi ada\n")
        again = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/executions/{xid}/input", {"value": "x"}
        )
        self.assertEqual(again.json()["code"], "already_resolved")

    @inlineCallbacks
    def test_interrupt_then_delete(self: Any) -> Any:
        """Interrupting a busy loop ends it ``interrupted`` (KeyboardInterrupt), the state survives; delete ends the kernel."""
        ctx = yield self.context(**self.context_body())
        yield self.execute(ctx["id"], "kept = 7")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "while True: pass", "wait": 0},
        )
        xid = reply.json()["execution_id"]
        yield deferLater(reactor, 0.5, lambda: None)
        stop = yield self.request("POST", f"/code/contexts/{ctx['id']}/interrupt", {})
        self.assertEqual(stop.json()["execution_id"], xid)
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=10"
        )
        self.assertEqual(got.json()["state"], "interrupted")
        self.assertEqual(got.json()["error"]["ename"], "KeyboardInterrupt")
        after = yield self.execute(ctx["id"], "kept")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "7")
        yield self.request("DELETE", f"/code/contexts/{ctx['id']}")
        self.assertFalse(alive(ctx["pid"]))


class IPykernelScenarios(KernelScenarios, CodeTestCase):
    """The shared scenarios on a real ipykernel (``python3``)."""


class _SetAside:
    """
    Modules of some packages taken out of ``sys.modules`` until
    :meth:`restore`, so that whether something imports them meanwhile
    shows (:meth:`imported`).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.hidden = {
            name: module for name, module in sys.modules.items() if self._ours(name)
        }
        for name in self.hidden:
            del sys.modules[name]

    def _ours(self, name: str) -> bool:
        return name.partition(".")[0] in self.names

    def imported(self) -> list[str]:
        """The packages' modules imported since this was made."""
        return sorted(name for name in sys.modules if self._ours(name))

    def restore(self) -> None:
        """The set-aside modules back (they win over any imported since)."""
        sys.modules.update(self.hidden)


class ContextTests(CodeTestCase):
    """The native API with a real ipykernel."""

    @inlineCallbacks
    def test_no_zmq_in_the_daemon(self) -> Any:
        """
        The daemon (this process) speaks to an ipykernel without importing
        ZMQ (another case in this test process may have imported it: its
        modules are set aside for the case, so an import shows).
        """
        aside = _SetAside(("zmq", "jupyter_client", "tornado"))
        self.addCleanup(aside.restore)
        ctx = yield self.context()
        self.assertEqual(ctx["kernel"], "python3")
        result = yield self.execute(ctx["id"], "41 + 1")
        self.assertEqual(result["results"][0]["data"]["text/plain"], "42")
        self.assertEqual(aside.imported(), [])

    @inlineCallbacks
    def test_stream_events(self) -> Any:
        """``stream: true`` answers SSE: started, stdout as it comes, ended last."""
        ctx = yield self.context()
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import time\nprint('a', flush=True)\ntime.sleep(0.3)\nprint('b')",
                "stream": True,
            },
        )
        events = yield reader.done
        names = [e["event"] for e in events]
        self.assertEqual(names[0], "execution.started")
        self.assertEqual(names[-1], "execution.ended")
        self.assertEqual(events[-1]["data"]["state"], "ok")
        out = "".join(e["data"]["text"] for e in events if e["event"] == "stdout")
        self.assertEqual(out, "a\nb\n")
        self.assertEqual([e["id"] for e in events], list(range(1, len(events) + 1)))

    @inlineCallbacks
    def test_stream_big_output(self) -> Any:
        """
        Output of hundreds of KiB streams whole (its events sent from their
        escaped parts): quotes, backslashes, tabs and non-ASCII text as
        printed, the same as the document says.
        """
        ctx = yield self.context()
        code = "s = ('x\"y\\\\z\\t\\u00e9' * 100000)[:600000]\nprint(s)"
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute", {"code": code, "stream": True}
        )
        events = yield reader.done
        self.assertEqual(events[-1]["data"]["state"], "ok")
        out = "".join(e["data"]["text"] for e in events if e["event"] == "stdout")
        expected = ('x"y\\z\t\u00e9' * 100000)[:600000] + "\n"
        self.assertEqual(out, expected)
        xid = events[-1]["data"]["execution_id"]
        document = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}"
        )
        self.assertEqual(document.json()["stdout"], expected)

    @inlineCallbacks
    def test_resume_mid_execution(self) -> Any:
        """202 with the id, then the events resumed after an id: no loss, no repeat."""
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.1)",
                "wait": 0,
            },
        )
        self.assertEqual(reply.status, 202, reply.body)
        xid = reply.json()["execution_id"]
        events_url = reply.json()["events_url"]
        first = yield self.stream(events_url)
        yield first.wait_for_event(
            lambda e: e["event"] == "stdout" and e["data"]["text"].startswith("1")
        )
        last_id = [e for e in first.events if e["event"] == "stdout"][-1]["id"]
        first.disconnect()
        second = yield self.stream(events_url, headers={"Last-Event-ID": str(last_id)})
        events = yield second.done
        self.assertEqual(events[0]["id"], last_id + 1)
        before = [e for e in first.events if e["id"] <= last_id]
        text = "".join(
            e["data"]["text"] for e in before + events if e["event"] == "stdout"
        )
        self.assertEqual(text, "".join(f"{i}\n" for i in range(6)))
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}/executions/{xid}")
        self.assertEqual(got.json()["state"], "ok")

    @inlineCallbacks
    def test_disconnect_drops_a_queued_execution(self) -> Any:
        """on_disconnect: interrupt on a queued execution: it never starts (``started: false``)."""
        ctx = yield self.context()
        first = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\ntime.sleep(1.5)", "wait": 0},
        )
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "print('never')", "stream": True, "on_disconnect": "interrupt"},
        )
        yield reader.wait_for_event(lambda e: e["event"] == "execution.queued")
        xid = reader.events[0]["data"]["execution_id"]
        reader.disconnect()
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=5"
        )
        self.assertEqual(got.json()["state"], "interrupted")
        self.assertFalse(got.json()["started"])
        done = yield self.request(
            "GET",
            f"/code/contexts/{ctx['id']}/executions/{first.json()['execution_id']}?wait=10",
        )
        self.assertEqual(done.json()["state"], "ok")

    @inlineCallbacks
    def test_thread_output_between_cells_kept(self) -> Any:
        """
        What a cell's thread prints while no execution runs is not lost:
        the next execution starts with it, after a stderr line saying
        where it came from (was: dropped, as output of an ended cell).
        """
        ctx = yield self.context()
        yield self.execute(
            ctx["id"],
            "import threading, time\ngo = threading.Event()\n"
            "def bg():\n    go.wait()\n    time.sleep(0.3)\n    for i in range(3):\n"
            "        print('bg', i, flush=True)\n"
            "threading.Thread(target=bg).start()",
        )
        second = yield self.execute(ctx["id"], "go.set()")
        self.assertEqual(second["stdout"], "")
        yield deferLater(reactor, 1.5, lambda: None)
        third = yield self.execute(ctx["id"], "print('own')")
        self.assertEqual(third["stdout"], "bg 0\nbg 1\nbg 2\nown\n")
        self.assertIn("printed while no execution ran", third["stderr"])
        fourth = yield self.execute(ctx["id"], "print('clean')")
        self.assertEqual((fourth["stdout"], fourth["stderr"]), ("clean\n", ""))

    @inlineCallbacks
    def test_display_updates_and_clear_folded(self) -> Any:
        """
        The result document shows what a notebook would: an updated display
        once, in its last state (was: one item per update), and nothing of
        what a ``clear_output`` cleared (was: kept); the events carry each
        ``display.update`` and ``clear_output`` as they came.
        """
        ctx = yield self.context()
        updated = yield self.execute(ctx["id"], UPDATES_CODE)
        self.assertEqual(
            [(r["data"].get("text/html"), r["is_result"]) for r in updated["results"]],
            [("<b>50</b>", False), (None, True)],
        )
        self.assertTrue(updated["results"][0]["display_id"])
        cleared = yield self.execute(ctx["id"], CLEAR_CODE)
        self.assertEqual(cleared["stdout"], "")
        self.assertEqual(
            [r["data"]["text/plain"] for r in cleared["results"]], ["'last'"]
        )
        events = yield self.request(
            "GET",
            f"/code/contexts/{ctx['id']}/executions/{updated['execution_id']}/events",
        )
        self.assertEqual(events.body.count(b"event: display.update"), 50)

    @inlineCallbacks
    def test_restart_loses_state(self) -> Any:
        """A restart gives a fresh kernel (new pid): the old names are gone."""
        ctx = yield self.context()
        yield self.execute(ctx["id"], "gone = 1")
        reply = yield self.request("POST", f"/code/contexts/{ctx['id']}/restart", {})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotEqual(reply.json()["pid"], ctx["pid"])
        self.assertFalse(alive(ctx["pid"]))
        result = yield self.execute(ctx["id"], "gone")
        self.assertEqual(result["error"]["ename"], "NameError")

    @inlineCallbacks
    def test_delete_kills_the_kernel(self) -> Any:
        """Deleting a context ends its kernel; it is then 404."""
        ctx = yield self.context()
        reply = yield self.request("DELETE", f"/code/contexts/{ctx['id']}")
        self.assertEqual(reply.json(), {"id": ctx["id"], "state": "closed"})
        self.assertFalse(alive(ctx["pid"]))
        again = yield self.request("GET", f"/code/contexts/{ctx['id']}")
        self.assertEqual(again.status, 404)

    @inlineCallbacks
    def test_kernels_listed(self) -> Any:
        """``/code/kernels`` lists python3 as allowed."""
        reply = yield self.request("GET", "/code/kernels")
        names = {k["name"]: k for k in reply.json()["kernels"]}
        self.assertTrue(names["python3"]["allowed"])
        self.assertEqual(names["python3"]["language"], "python")

    @inlineCallbacks
    def test_env_with_quotes(self) -> Any:
        """A per-execution env value with quotes round-trips and is gone after."""
        ctx = yield self.context()
        value = "a'b\"c\\d"
        result = yield self.execute(
            ctx["id"], "import os\nprint(os.environ['Q'])", env={"Q": value}
        )
        self.assertEqual(result["stdout"], value + "\n")
        after = yield self.execute(ctx["id"], "import os\nprint(os.environ.get('Q'))")
        self.assertEqual(after["stdout"], "None\n")


#: Two identities with the code scopes, for ownership.
TWO_USERS = {
    "groups": {"code": True},
    **KERNEL_START,
    "auth": {
        "tokens": [
            {
                "id": "alice",
                "token_env": "ALICE",
                "scopes": ["code:read", "code:run", "code:manage"],
            },
            {
                "id": "bob",
                "token_env": "BOB",
                "scopes": ["code:read", "code:run", "code:manage"],
            },
        ]
    },
}


class InterruptTests(CodeTestCase):
    """A timeout that the kernel heeds: interrupted, not restarted."""

    # The kernel (at nice 10) must take the SIGINT and say it is idle
    # within the grace, or it is restarted and the state is gone: on two
    # busy shared cores that has taken over the 1 s DeathTests allow.
    policy = code_policy(limits={"interrupt_grace_seconds": 30})

    @inlineCallbacks
    def test_timeout_interrupts(self) -> Any:
        """Past its timeout a busy loop is interrupted: ``timeout``, and the state is kept."""
        ctx = yield self.context()
        yield self.execute(ctx["id"], "kept = 3")
        result = yield self.execute(ctx["id"], "while True: pass", timeout=1)
        self.assertEqual(result["state"], "timeout")
        self.assertTrue(result["started"])
        after = yield self.execute(ctx["id"], "kept")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "3")


class StalledDaemonTests(CodeTestCase):
    """
    A daemon that stops reading the hub for a while (busy, stopped, a
    loaded machine) while a cell floods flushed prints: ipykernel publishes
    them on a socket that never waits for its reader, so the hub must keep
    reading and hold them, not leave them to be dropped with no word.
    """

    #: Lines the cell prints (each flushed: one message each).
    LINES = 20_000

    @inlineCallbacks
    def stalled_flood(self, ctx: dict[str, Any]) -> Any:
        """
        Run the flood while the daemon reads nothing from the hub for 4 s;
        the result document, and how long it took.
        """
        service = self.daemon.context.code.get()
        hub = service.hub().child
        self.addCleanup(hub.resume_reading)
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": f"for i in range({self.LINES}): print(i, flush=True)",
                "timeout": 30,
                "wait": 0,
            },
        )
        self.assertEqual(reply.status, 202, reply.body)
        xid = reply.json()["execution_id"]
        started = reactor.seconds()
        hub.pause_reading()
        yield deferLater(reactor, 4, lambda: None)
        hub.resume_reading()
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=60"
        )
        self.assertEqual(got.status, 200, got.body)
        return got.json(), reactor.seconds() - started

    def assert_kept_or_told(self, result: dict[str, Any]) -> None:
        """
        ``result``'s stdout is the flood's output, every byte of it there or
        counted in ``dropped_bytes``; only when the kernel's own
        socket dropped messages (a machine so busy the hub got no CPU for a
        while: nothing a reader can prevent) is less there, and then its
        stderr says so and it is ``truncated``.
        """
        total = sum(len(f"{i}\n") for i in range(self.LINES))
        kept = len(result["stdout"].encode())
        if "messages never arrived" in result["stderr"]:
            self.assertTrue(result["truncated"])
            self.assertLess(kept + result["dropped_bytes"], total)
        else:
            self.assertEqual(kept + result["dropped_bytes"], total)

    @inlineCallbacks
    def test_every_line_kept(self) -> Any:
        """
        Every line arrives, in order, or the loss is said (was: up to a
        fifth lost with ``truncated: false``); the cell ends once it has
        (was: at its timeout, its ``idle`` dropped, its kernel restarted),
        and the state is kept for the next cell.
        """
        ctx = yield self.context()
        yield self.execute(ctx["id"], "keep = 7")
        result, took = yield self.stalled_flood(ctx)
        self.assertEqual(result["state"], "ok", result["stderr"])
        self.assertLess(took, 25)
        self.assertEqual(result["dropped_bytes"], 0)
        self.assert_kept_or_told(result)
        if not result["truncated"]:
            self.assertEqual(
                result["stdout"], "".join(f"{i}\n" for i in range(self.LINES))
            )
        after = yield self.execute(ctx["id"], "keep")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "7")

    @inlineCallbacks
    def test_small_buffer(self) -> Any:
        """
        With a hub buffer of 64 KiB the flood is left in the kernel's queue,
        which drops what it cannot hold: every byte is there or the loss is
        said, never silent, and the cell still ends on time.
        """
        from sandboxd.policy import defaults

        self.patch(defaults, "CODE_HUB_BUFFER_BYTES", 64 * 1024)
        ctx = yield self.context()
        result, took = yield self.stalled_flood(ctx)
        self.assertEqual(result["state"], "ok", result["stderr"])
        self.assertLess(took, 25)
        self.assert_kept_or_told(result)

    @inlineCallbacks
    def test_loss_told_in_the_document(self) -> Any:
        """
        What the hub says was lost (bytes it dropped, messages that never
        came, an ``idle`` missing) is in the result: ``truncated``,
        ``dropped_bytes``, and a stderr line for each, where it happened.
        """
        from sandboxd.kernels import hubclient

        self.patch(hubclient, "HUB_COMMAND", [sys.executable, FAKE_HUB, "whoami"])
        ctx = yield self.context()
        result = yield self.execute(ctx["id"], "lossy")
        self.assertEqual(result["state"], "ok")
        self.assertEqual(result["stdout"], "head\ntail\n")
        self.assertEqual((result["truncated"], result["dropped_bytes"]), (True, 1000))
        self.assertEqual(
            result["stderr"],
            "\n[sandboxd] 1000 bytes of stdout and 2 display items dropped here:"
            " the kernel printed faster than the daemon read, past the kernel"
            " hub's buffer\n"
            "\n[sandboxd] 3 of the kernel's messages never arrived: its output"
            " socket drops what its reader has not taken (the machine was busy),"
            " so output may be missing\n"
            "\n[sandboxd] the kernel's last messages for this execution did not"
            " arrive (its end was taken from its reply): output may be missing\n",
        )


class PriorityTests(CodeTestCase):
    """A kernel and its hub answer an agent that waits: its level, not the children's."""

    @inlineCallbacks
    def test_kernel_and_hub_at_the_agents_level(self) -> Any:
        """
        The kernel's and the hub's session groups run at ``agents_nice``
        (0 by default), as an attended terminal's; the kernel process
        itself keeps the children's nice value (10).
        """
        need_autogroups()
        ctx = yield self.context()
        hub = self.daemon.context.code.get().hub()
        self.assertEqual(group_nice(ctx["pid"]), 0)
        self.assertEqual(group_nice(hub.pid), 0)
        self.assertEqual(os.getpriority(os.PRIO_PROCESS, ctx["pid"]), 10)


class PriorityLevelTests(CodeTestCase):
    """The kernel's group follows the policy's ``agents_nice``."""

    policy = {**code_policy(), "priority": {"agents_nice": 10}}

    @inlineCallbacks
    def test_level_follows_policy(self) -> Any:
        """``"agents_nice": 10`` puts kernels back with the rest of the sandbox's work."""
        need_autogroups()
        ctx = yield self.context()
        self.assertEqual(group_nice(ctx["pid"]), 10)


class DeathTests(CodeTestCase):
    """Timeouts, kernels killed, trees killed, and the hub killed."""

    policy = code_policy(limits={"interrupt_grace_seconds": 1, "max_contexts": 12})

    @inlineCallbacks
    def test_timeout_restarts_a_deaf_kernel(self) -> Any:
        """Code that ignores SIGINT is ended by a restart after the grace: said by ``context.restarted``."""
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
                "timeout": 1,
                "wait": 0,
            },
        )
        xid = reply.json()["execution_id"]
        events_url = reply.json()["events_url"]
        reader = yield self.stream(events_url)
        events = yield reader.done
        names = [e["event"] for e in events]
        self.assertIn("context.restarted", names)
        self.assertEqual(
            events[names.index("context.restarted")]["data"]["reason"], "timeout"
        )
        self.assertEqual(events[-1]["event"], "execution.ended")
        self.assertEqual(events[-1]["data"]["state"], "timeout")
        self.assertFalse(alive(ctx["pid"]))
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}")
        self.assertEqual(got.json()["restarts"], 1)
        self.assertEqual(got.json()["current_execution"], None)
        del xid
        fresh = yield self.execute(ctx["id"], "1 + 1")
        self.assertEqual(fresh["results"][0]["data"]["text/plain"], "2")

    @inlineCallbacks
    def test_restart_said_in_the_document(self) -> Any:
        """
        A timeout that restarts the kernel, and a kernel killed mid-run,
        are said in the result document itself (its stderr), not only in
        the events: a client that reads the document learns the state is
        gone (was: an empty stderr, then a bare NameError).
        """
        ctx = yield self.context()
        deaf = (
            "import time\nwhile True:\n    try:\n        time.sleep(1)\n"
            "    except KeyboardInterrupt:\n        pass"
        )
        result = yield self.execute(ctx["id"], deaf, timeout=1)
        self.assertEqual(result["state"], "timeout")
        self.assertIn("[sandboxd] timeout after 1 s: interrupting", result["stderr"])
        self.assertIn(
            "[sandboxd] the kernel was restarted (timeout) during this execution:"
            " its state (variables, imports, cwd) is gone",
            result["stderr"],
        )
        fresh = yield self.request("GET", f"/code/contexts/{ctx['id']}")
        running = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "print('working', flush=True)\nimport time\ntime.sleep(30)",
                "wait": 0,
            },
        )
        reader = yield self.stream(running.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "stdout")
        os.kill(fresh.json()["pid"], signal.SIGKILL)
        yield reader.done
        lost = yield self.request(
            "GET",
            f"/code/contexts/{ctx['id']}/executions/{running.json()['execution_id']}",
        )
        self.assertEqual(lost.json()["state"], "lost")
        self.assertIn(
            "[sandboxd] the kernel was restarted (died, exit code -9) during this"
            " execution",
            lost.json()["stderr"],
        )

    @inlineCallbacks
    def test_kernel_killed_mid_run(self) -> Any:
        """A kernel SIGKILLed while running: the execution ends ``lost``, a new kernel serves."""
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import time\nprint('going', flush=True)\ntime.sleep(30)",
                "wait": 0,
            },
        )
        reader = yield self.stream(reply.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "stdout")
        os.kill(ctx["pid"], signal.SIGKILL)
        events = yield reader.done
        restarted = [e for e in events if e["event"] == "context.restarted"]
        self.assertEqual(restarted[0]["data"]["reason"], "died")
        self.assertEqual(restarted[0]["data"]["exit_code"], -9)
        self.assertEqual(events[-1]["data"]["state"], "lost")
        fresh = yield self.execute(ctx["id"], "print('back')")
        self.assertEqual(fresh["stdout"], "back\n")

    @inlineCallbacks
    def test_code_that_ends_its_kernel_ran(self) -> Any:
        """
        Code that ends its own kernel at once (before the kernel's notice
        that it took the code can leave it) is ``lost`` with ``started:
        true``: it ran, so a client must not take it as safe to send again
        (its side effects, here a file, happened).
        """
        ctx = yield self.context()
        mark = os.path.join(self.base_dir, "ran.txt")
        result = yield self.execute(
            ctx["id"], f"open({mark!r}, 'w').close()\nimport os\nos._exit(3)"
        )
        self.assertTrue(os.path.exists(mark))
        self.assertEqual((result["state"], result["started"]), ("lost", True), result)
        fresh = yield self.execute(ctx["id"], "print('back')")
        self.assertEqual(fresh["stdout"], "back\n")

    @inlineCallbacks
    def test_disconnect_escalates_to_a_restart(self) -> Any:
        """
        ``on_disconnect: "interrupt"`` on code that ignores the interrupt:
        ``interrupt_grace_seconds`` later the kernel is restarted (the
        context is free again, its execution ``interrupted``), and the next
        execution says the kernel was restarted before it (was: busy until
        the policy timeout).
        """
        ctx = yield self.context()
        yield self.execute(ctx["id"], "y = 5")
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute",
            {
                "code": "import signal, time\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "print('up', flush=True)\nwhile True:\n    time.sleep(0.2)",
                "stream": True,
                "on_disconnect": "interrupt",
            },
        )
        yield reader.wait_for_event(lambda e: e["event"] == "stdout")
        xid = reader.events[0]["data"]["execution_id"]
        reader.disconnect()
        got = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=15"
        )
        self.assertEqual(got.json()["state"], "interrupted")
        after = yield self.execute(ctx["id"], "y")
        self.assertEqual(after["error"]["ename"], "NameError")
        self.assertIn("the kernel was restarted (disconnected)", after["stderr"])
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}")
        self.assertEqual(got.json()["restarts"], 1)

    @inlineCallbacks
    def test_queued_cells_not_run_after_a_death(self) -> Any:
        """
        Cells queued behind one that kills its kernel do not run in the
        fresh kernel: each ends ``lost``, ``started: false``, after a
        ``context.restarted`` event; the file one would have written is not
        written anywhere (was: they ran in the fresh kernel, in its cwd).
        """
        ctx = yield self.context()
        os.mkdir(os.path.join(self.base_dir, "proj"))
        yield self.execute(ctx["id"], "import os\nos.chdir('proj')\nrows = [1, 2, 3]")
        codes = [
            "import os, time\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)",
            "open('report.txt', 'w').write('written in ' + os.getcwd())",
            "len(rows)",
        ]
        xids = []
        for code in codes:
            reply = yield self.request(
                "POST", f"/code/contexts/{ctx['id']}/execute", {"code": code, "wait": 0}
            )
            self.assertEqual(reply.status, 202, reply.body)
            xids.append(reply.json()["execution_id"])
        for xid in xids[1:]:
            got = yield self.request(
                "GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=15"
            )
            self.assertEqual(
                (got.json()["state"], got.json()["started"]), ("lost", False)
            )
            reader = yield self.stream(
                f"/code/contexts/{ctx['id']}/executions/{xid}/events"
            )
            events = yield reader.done
            self.assertIn("context.restarted", [e["event"] for e in events])
        for where in ("", "proj"):
            path = os.path.join(self.base_dir, where, "report.txt")
            self.assertFalse(os.path.exists(path), path)
        fresh = yield self.execute(ctx["id"], "print('back')")
        self.assertEqual(fresh["stdout"], "back\n")

    @inlineCallbacks
    def test_restart_leaves_no_setsid_survivor(self) -> Any:
        """A cell's child in its own session, deaf to SIGTERM, dies with the restart."""
        ctx = yield self.context()
        result = yield self.execute(
            ctx["id"],
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'], "
            "start_new_session=True)\n"
            "print(p.pid)",
        )
        pid = int(result["stdout"])
        self.assertTrue(alive(pid))
        reply = yield self.request("POST", f"/code/contexts/{ctx['id']}/restart", {})
        self.assertEqual(reply.status, 200)
        for _ in range(100):
            if not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))

    @inlineCallbacks
    def test_ten_contexts_share_nothing(self) -> Any:
        """Ten contexts made and deleted in turn never see each other's names."""
        for i in range(10):
            ctx = yield self.context()
            result = yield self.execute(
                ctx["id"], f"print('leak' in globals())\nleak = {i}"
            )
            self.assertEqual(result["stdout"], "False\n")
            yield self.request("DELETE", f"/code/contexts/{ctx['id']}")
            self.assertFalse(alive(ctx["pid"]))

    # Ten kernel starts in turn, each with a start's room.
    test_ten_contexts_share_nothing.timeout = 10 * KERNEL_START_SECONDS  # type: ignore[attr-defined]

    @inlineCallbacks
    def test_hub_killed(self) -> Any:
        """The hub killed mid-run: the execution ends ``lost``; a new hub serves the same kernel."""
        ctx = yield self.context()
        yield self.execute(ctx["id"], "kept = 'still here'")
        service = self.daemon.context.code.get()
        old_hub = service.hub().pid
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\nprint('x', flush=True)\ntime.sleep(2)", "wait": 0},
        )
        reader = yield self.stream(reply.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "stdout")
        os.kill(old_hub, signal.SIGKILL)
        events = yield reader.done
        self.assertEqual(events[-1]["data"]["state"], "lost")
        # the kernel may still be finishing the sleep: queue behind it
        after = yield self.execute(ctx["id"], "kept")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "'still here'")
        self.assertNotEqual(service.hub().pid, old_hub)
        self.assertTrue(alive(ctx["pid"]))


class RestartClientTests(ClientCase):
    """What ``sb.code.execute`` gives for a cell whose kernel was restarted."""

    timeout = KERNEL_CASE_SECONDS
    policy = {
        "groups": {"code": True},
        "endpoints": {
            "group:code": {
                "limits": {
                    "start_timeout_seconds": KERNEL_START_SECONDS,
                    "interrupt_grace_seconds": 1,
                }
            }
        },
    }

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def test_timeout_restart_shown(self) -> Any:
        """
        ``sb.code.execute`` of a cell that ignores the interrupt returns
        ``timeout`` with the timeout and the restart said on its stderr
        (was: an empty document, the notes only in the events it had read).
        """

        def body(sb: Any) -> Any:
            ctx = sb.code.create_context()
            return sb.code.execute(
                ctx["id"],
                "import time\nwhile True:\n    try:\n        time.sleep(1)\n"
                "    except KeyboardInterrupt:\n        pass",
                timeout=1,
            )

        sandbox = self.sandbox(timeout=KERNEL_CALL_SECONDS)
        result = yield self.in_thread(lambda: body(sandbox))
        self.assertEqual(result["state"], "timeout")
        self.assertIn("timeout after 1 s", result["stderr"])
        self.assertIn(
            "the kernel was restarted (timeout) during this execution",
            result["stderr"],
        )


class DisplayClientTests(ClientCase):
    """What ``sb.code.execute`` assembles from display updates and clears."""

    timeout = KERNEL_CASE_SECONDS
    policy = {"groups": {"code": True}, **KERNEL_START}

    def setUp(self) -> Any:
        need_ipykernel()
        return super().setUp()

    @inlineCallbacks
    def test_folded_as_the_document(self) -> Any:
        """
        ``sb.code.execute`` folds ``display.update`` and ``clear_output`` as
        the daemon's document does (was: each update one more result, a
        clear ignored).
        """

        def body(sb: Any) -> Any:
            ctx = sb.code.create_context()
            return (
                sb.code.execute(ctx["id"], UPDATES_CODE),
                sb.code.execute(ctx["id"], CLEAR_CODE),
            )

        sandbox = self.sandbox(timeout=KERNEL_CALL_SECONDS)
        updated, cleared = yield self.in_thread(lambda: body(sandbox))
        self.assertEqual(
            [r["data"].get("text/html") for r in updated["results"]],
            ["<b>50</b>", None],
        )
        self.assertEqual(cleared["stdout"], "")
        self.assertEqual(
            [r["data"]["text/plain"] for r in cleared["results"]], ["'last'"]
        )


class StuckHubTests(CodeTestCase):
    """A hub that stops answering (SIGSTOP) is replaced, not waited on."""

    @inlineCallbacks
    def test_stopped_hub_is_replaced(self) -> Any:
        """
        With the hub stopped, a restart fails 504 at the start timeout
        instead of hanging; the stuck hub is then ended, and a new context
        gets a new hub that works.
        """
        from sandboxd.policy import defaults

        ctx = yield self.context()
        service = self.daemon.context.code.get()
        hub = service.hub().pid
        self.addCleanup(lambda: alive(hub) and os.kill(hub, signal.SIGCONT))
        # Only the restart's start is to be short (a first start on a
        # loaded machine needs the long one the case gives it).
        service.contexts[ctx["id"]].start_timeout = 2.0
        self.patch(defaults, "CODE_HUB_ANSWER_GRACE_SECONDS", 1.0)
        os.kill(hub, signal.SIGSTOP)
        started = reactor.seconds()
        reply = yield self.request("POST", f"/code/contexts/{ctx['id']}/restart")
        self.assertEqual(reply.status, 504, reply.body)
        self.assertLess(reactor.seconds() - started, 15)
        for _ in range(150):
            if not alive(hub):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(hub))
        fresh = yield self.context()
        ok = yield self.execute(fresh["id"], "1 + 1")
        self.assertEqual(ok["results"][0]["data"]["text/plain"], "2")
        self.assertNotEqual(service.hub().pid, hub)


class StoppedKernelTests(CodeTestCase):
    """A kernel SIGSTOPped mid-run: every control call still answers."""

    @inlineCallbacks
    def test_interrupt_restart_delete_answer(self) -> Any:
        """
        With the kernel stopped in the middle of an execution, interrupt
        answers at once, restart answers (the stopped tree is killed and a
        new kernel serves), and delete answers with the kernel gone.
        """
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\nprint('x', flush=True)\ntime.sleep(60)", "wait": 0},
        )
        reader = yield self.stream(reply.json()["events_url"])
        yield reader.wait_for_event(lambda e: e["event"] == "stdout")
        os.kill(ctx["pid"], signal.SIGSTOP)
        self.addCleanup(
            lambda: alive(ctx["pid"]) and os.kill(ctx["pid"], signal.SIGCONT)
        )
        started = reactor.seconds()
        reply = yield self.request("POST", f"/code/contexts/{ctx['id']}/interrupt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertLess(reactor.seconds() - started, 5)
        reply = yield self.request("POST", f"/code/contexts/{ctx['id']}/restart")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(alive(ctx["pid"]))
        events = yield reader.done
        self.assertEqual(events[-1]["event"], "execution.ended")
        ok = yield self.execute(ctx["id"], "1 + 1")
        self.assertEqual(ok["results"][0]["data"]["text/plain"], "2")
        new_pid = (yield self.request("GET", f"/code/contexts/{ctx['id']}")).json()[
            "pid"
        ]
        os.kill(new_pid, signal.SIGSTOP)
        self.addCleanup(lambda: alive(new_pid) and os.kill(new_pid, signal.SIGCONT))
        started = reactor.seconds()
        reply = yield self.request("DELETE", f"/code/contexts/{ctx['id']}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertLess(reactor.seconds() - started, 15)
        self.assertFalse(alive(new_pid))


class RefusalTests(CodeTestCase):
    """Bad input: clear errors, nothing half-done."""

    policy = TWO_USERS
    environ = {"ALICE": "a-token", "BOB": "b-token"}
    token = "a-token"

    @inlineCallbacks
    def test_unknown_kernel(self) -> Any:
        """An unknown kernel is 400 naming the allowed ones."""
        reply = yield self.request("POST", "/code/contexts", {"kernel": "cobol"})
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["code"], "invalid_param")
        self.assertIn("python3", reply.json()["allowed"])

    @inlineCallbacks
    def test_code_too_large(self) -> Any:
        """Code over max_request_bytes is 413; the context still works."""
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "#" * (1024 * 1024 + 10)},
        )
        self.assertEqual(reply.status, 413)
        self.assertEqual(reply.json()["code"], "payload_too_large")
        ok = yield self.execute(ctx["id"], "1")
        self.assertEqual(ok["state"], "ok")

    @inlineCallbacks
    def test_env_value_with_nul(self) -> Any:
        """
        An ``env`` value holding NUL, at create and per execution, is 400
        saying so (was: "must be a string" for a string); a value that is
        not a string is still refused as such, and nothing is created.
        """
        ctx = yield self.context()
        before = yield self.request("GET", "/code/contexts")
        for path, body in (
            ("/code/contexts", {"env": {"N": "a\x00b"}}),
            (
                f"/code/contexts/{ctx['id']}/execute",
                {"code": "1", "env": {"N": "a\x00b"}},
            ),
        ):
            reply = yield self.request("POST", path, body)
            self.assertEqual(reply.status, 400, path)
            self.assertEqual(reply.json()["code"], "invalid_param")
            self.assertEqual(
                reply.json()["error"], "the value of 'N' must not contain NUL"
            )
        reply = yield self.request("POST", "/code/contexts", {"env": {"N": 1}})
        self.assertEqual(reply.json()["error"], "the value of 'N' must be a string")
        after = yield self.request("GET", "/code/contexts")
        self.assertEqual(after.json(), before.json())

    @inlineCallbacks
    def test_other_identity(self) -> Any:
        """Bob cannot see, run in or delete Alice's context: 404, as if it did not exist."""
        ctx = yield self.context()
        for method, path, body in (
            ("GET", f"/code/contexts/{ctx['id']}", None),
            ("POST", f"/code/contexts/{ctx['id']}/execute", {"code": "1"}),
            ("DELETE", f"/code/contexts/{ctx['id']}", None),
        ):
            reply = yield self.daemon.request(method, path, body, token="b-token")
            self.assertEqual(reply.status, 404, (method, path))
            self.assertEqual(reply.json()["code"], "not_found")
        listed = yield self.daemon.request("GET", "/code/contexts", token="b-token")
        self.assertEqual(listed.json()["contexts"], [])
        mine = yield self.request("GET", "/code/contexts")
        self.assertEqual([c["id"] for c in mine.json()["contexts"]], [ctx["id"]])

    @inlineCallbacks
    def test_busy_without_queue(self) -> Any:
        """A busy context with ``queue: false`` is 409 context_busy; with the queue it waits its turn."""
        ctx = yield self.context()
        first = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\ntime.sleep(1)\nprint('first')", "wait": 0},
        )
        reply = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/execute", {"code": "1", "queue": False}
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "context_busy")
        self.assertEqual(reply.json()["execution_id"], first.json()["execution_id"])
        queued = yield self.execute(ctx["id"], "print('second')")
        self.assertEqual(queued["stdout"], "second\n")
        got = yield self.request(
            "GET",
            f"/code/contexts/{ctx['id']}/executions/{first.json()['execution_id']}",
        )
        self.assertEqual(got.json()["stdout"], "first\n")

    @inlineCallbacks
    def test_too_many_contexts(self) -> Any:
        """Past max_contexts_per_identity: 429 too_many_contexts."""
        for _ in range(4):
            yield self.context()
        reply = yield self.request("POST", "/code/contexts", {})
        self.assertEqual(reply.status, 429)
        self.assertEqual(reply.json()["code"], "too_many_contexts")

    # Four kernel starts in turn, each with a start's room.
    test_too_many_contexts.timeout = 5 * KERNEL_START_SECONDS  # type: ignore[attr-defined]


class BoundsTests(CodeTestCase):
    """Spilled displays, bounded output, idle contexts, the audit line."""

    timeout = 180
    audit = True
    policy = code_policy(
        limits={
            "max_display_bytes": 2000,
            "max_output_bytes": 1024 * 1024,
            "max_event_bytes": 1024 * 1024,
        },
        audit="all",
    )

    @inlineCallbacks
    def test_display_spilled(self) -> Any:
        """
        A display value over max_display_bytes is a ref, served raw with its
        type.  Its directory is made for the first such value and removed
        when the daemon stops.
        """
        code = self.daemon.context.code
        assert code is not None
        service = code.get()
        ctx = yield self.context()
        self.assertIsNone(service.spill_dir)
        result = yield self.execute(
            ctx["id"],
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        )
        item = next(r for r in result["results"] if r.get("refs"))
        self.assertNotIn("image/png", item["data"])
        ref = next(r for r in item["refs"] if r["mime"] == "image/png")
        raw = yield self.request("GET", ref["url"])
        self.assertEqual(raw.status, 200)
        self.assertEqual(raw.header("content-type"), "image/png")
        self.assertEqual(raw.header("x-content-type-options"), "nosniff")
        self.assertEqual(raw.header("content-security-policy"), "sandbox")
        self.assertTrue(raw.body.startswith(b"\x89PNG"))
        spill_dir = service.spill_dir
        assert spill_dir is not None
        self.assertTrue(os.path.isdir(spill_dir))
        yield self.daemon.stop()
        self.assertFalse(os.path.exists(spill_dir))

    @inlineCallbacks
    def test_display_ref_describes_its_download(self) -> Any:
        """
        A spilled image's ref gives the size and sha256 of the bytes its
        URL serves (the decoded PNG), so a client can check its download;
        a spilled text's, of the text's UTF-8.
        """
        ctx = yield self.context()
        result = yield self.execute(
            ctx["id"],
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
            "display('\u00e9' * 3000)",
        )
        refs = [ref for r in result["results"] for ref in r.get("refs") or []]
        self.assertEqual(
            sorted(ref["mime"] for ref in refs), ["image/png", "text/plain"]
        )
        for ref in refs:
            raw = yield self.request("GET", ref["url"])
            self.assertEqual(raw.status, 200)
            self.assertEqual(
                (len(raw.body), hashlib.sha256(raw.body).hexdigest()),
                (ref["bytes"], ref["sha256"]),
            )
            self.assertEqual(raw.header("etag"), f'"{ref["sha256"][:32]}"')
            if ref["mime"] == "image/png":
                self.assertTrue(raw.body.startswith(b"\x89PNG"))

    @inlineCallbacks
    def test_output_read_off_the_reactor(self) -> Any:
        """
        A spilled item is read on a worker thread: a slow read (here a FIFO
        whose writer comes late) holds no other call up.
        """
        ctx = yield self.context()
        code = self.daemon.context.code
        assert code is not None
        fifo = os.path.abspath(self.mktemp())
        os.mkfifo(fifo)
        code.get().outputs["slow"] = (ctx["id"], fifo, "text/plain", 2, "0" * 64)

        def write_late() -> None:
            with open(fifo, "wb") as f:
                f.write(b"ok")

        writer = threading.Timer(1.5, write_late)
        writer.start()
        self.addCleanup(writer.join)
        read = self.request("GET", f"/code/contexts/{ctx['id']}/outputs/slow")
        answered: list[Any] = []
        read.addCallback(lambda raw: answered.append(raw) or raw)
        yield deferLater(reactor, 0.3, lambda: None)
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        self.assertEqual(answered, [])
        raw = yield read
        self.assertEqual((raw.status, raw.body), (200, b"ok"))

    @inlineCallbacks
    def test_display_spill_refused_by_the_disk(self) -> Any:
        """
        A display value over max_display_bytes that the disk cannot take
        (full, or its directory gone) is reported ``dropped``, nothing of it
        is left behind, and the execution ends ``ok``.
        """
        ctx = yield self.context()
        code = self.daemon.context.code
        assert code is not None
        service = code.get()
        blocker = os.path.abspath(self.mktemp())
        with open(blocker, "w"):
            pass
        service.spill_dir = blocker  # a file: every spill is refused
        result = yield self.execute(ctx["id"], "print('before')\ndisplay('x' * 5000)")
        self.assertEqual(result["state"], "ok")
        self.assertEqual(result["stdout"], "before\n")
        item = next(r for r in result["results"] if r.get("refs"))
        self.assertEqual(
            [(r["mime"], r.get("dropped")) for r in item["refs"]],
            [("text/plain", True)],
        )
        self.assertEqual(service.outputs, {})
        self.assertEqual(service.spilled_bytes, 0)

    @inlineCallbacks
    def test_100_mb_of_prints(self) -> Any:
        """100 MB of prints: head and tail kept, the daemon's memory stays bounded."""
        import resource

        ctx = yield self.context()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = yield self.execute(
            ctx["id"],
            "import sys\nline = 'x' * 1023 + '\\n'\nblock = line * 1024\n"
            "for i in range(100):\n    sys.stdout.write(block)\nprint('the end')",
        )
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        self.assertEqual(result["state"], "ok")
        self.assertTrue(result["truncated"])
        self.assertGreater(result["dropped_bytes"], 90 * 1024 * 1024)
        self.assertTrue(result["stdout"].endswith("the end\n"))
        self.assertLess(len(result["stdout"]), 1024 * 1024 + 1)
        self.assertLess(grown, 64, f"the daemon grew by {grown:.0f} MiB")

    @inlineCallbacks
    def test_audit_line(self) -> Any:
        """code_execute's audit line has the code's sha256 and head, never its output."""
        import json

        ctx = yield self.context()
        code = "print('secret-output-7')"
        yield self.execute(ctx["id"], code)
        [record] = [
            r for r in self.audit_lines() if r.get("endpoint") == "code_execute"
        ]
        self.assertEqual(
            record["code_sha256"], hashlib.sha256(code.encode()).hexdigest()
        )
        self.assertEqual(record["code_head"], code)
        self.assertNotIn("secret-output-7\n", json.dumps(self.audit_lines()))


class IdleTests(CodeTestCase):
    """Contexts nobody uses are closed."""

    policy = code_policy(limits={"idle_timeout_seconds": 1})

    @inlineCallbacks
    def test_idle_context_closed(self) -> Any:
        """A context idle past idle_timeout_seconds is closed and its kernel ended."""
        ctx = yield self.context()
        for _ in range(100):
            reply = yield self.request("GET", f"/code/contexts/{ctx['id']}")
            if reply.status == 404:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(reply.status, 404)
        for _ in range(50):
            if not alive(ctx["pid"]):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(ctx["pid"]))


@inlineCallbacks
def killed(case: CodeTestCase, ctx: dict[str, Any]) -> Any:
    """Kill a context's kernel (not restarted); its document once it says ``dead``."""
    os.kill(ctx["pid"], signal.SIGKILL)
    for _ in range(100):
        got = yield case.request("GET", f"/code/contexts/{ctx['id']}")
        if got.json()["state"] == "dead":
            break
        yield deferLater(reactor, 0.1, lambda: None)
    case.assertEqual(got.json()["state"], "dead")
    return got


class NoRestartTests(CodeTestCase):
    """``params.auto_restart: false``: a dead kernel leaves a dead context."""

    policy = code_policy(params={"auto_restart": False})

    @inlineCallbacks
    def test_dead_context(self) -> Any:
        """The kernel killed: 409 context_dead until restarted; the restart serves again."""
        ctx = yield self.context()
        got = yield killed(self, ctx)
        self.assertEqual(got.json()["exit_code"], -9)
        reply = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/execute", {"code": "1"}
        )
        self.assertEqual(reply.status, 409)
        self.assertEqual(reply.json()["code"], "context_dead")
        restarted = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/restart", {}
        )
        self.assertEqual(restarted.json()["state"], "idle")
        ok = yield self.execute(ctx["id"], "1 + 2")
        self.assertEqual(ok["results"][0]["data"]["text/plain"], "3")


class DeadIdleTests(CodeTestCase):
    """A dead context nobody restarts gives its slot back after the idle timeout."""

    policy = code_policy(
        params={"auto_restart": False},
        limits={"idle_timeout_seconds": 1, "max_contexts_per_identity": 1},
    )

    @inlineCallbacks
    def test_dead_context_closed(self) -> Any:
        """
        Dead, the context stays readable for the idle timeout (counted from
        its death), then is closed: a new one may start in its place.
        """
        ctx = yield self.context()
        got = yield killed(self, ctx)
        refused = yield self.request("POST", "/code/contexts", {"language": "python"})
        self.assertEqual(refused.status, 429)
        for _ in range(100):
            got = yield self.request("GET", f"/code/contexts/{ctx['id']}")
            if got.status == 404:
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(got.status, 404)
        yield self.context()


def runnable_by_others(path: str) -> bool:
    """Whether a user other than the owner may run ``path`` (every directory on the way searchable)."""
    import stat

    path = os.path.realpath(path)
    if not os.stat(path).st_mode & stat.S_IXOTH:
        return False
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(parent)
    return True


def _run_as(name: str) -> Any:
    """The :class:`~sandboxd.processes.command.RunAs` of a user."""
    import pwd

    from sandboxd.processes.command import RunAs

    entry = pwd.getpwnam(name)
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def uid_of(pid: int) -> int:
    """A live process's real uid."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("Uid:"))
    return int(line.split()[1])


class UserTests(CodeTestCase):
    """The kernel (and the hub that speaks to it) runs as the request's user (a root daemon only)."""

    policy = code_policy(
        params={
            "users": ["nobody"],
            "kernels": ["python3", "sandboxd-python", "sleepy"],
        }
    )

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise SkipTest("switching users needs a root daemon")
        return super().setUp()

    @inlineCallbacks
    def test_kernel_user(self) -> Any:
        """A context created with user=nobody runs its code as nobody."""
        import pwd

        if not os.access("/usr/bin/python3", os.X_OK):
            raise SkipTest("no /usr/bin/python3 for the user nobody to run")
        # A PATH whose python3 another user may run (not a pyenv shim in /root).
        ctx = yield self.context(
            kernel="sandboxd-python", user="nobody", env={"PATH": "/usr/bin:/bin"}
        )
        self.assertEqual(ctx["user"], "nobody")
        result = yield self.execute(ctx["id"], "import os\nos.getuid()")
        self.assertEqual(
            result["results"][0]["data"]["text/plain"],
            str(pwd.getpwnam("nobody").pw_uid),
        )

    def locked_python(self) -> str:
        """
        A directory only root may enter holding a ``python3`` that is a
        script (as a ``pyenv`` shim under ``/root`` is).
        """
        if not os.access("/usr/bin/python3", os.X_OK):
            raise SkipTest("no /usr/bin/python3 for the user nobody to run")
        locked = os.path.realpath(self.mktemp())
        os.makedirs(locked)
        os.chmod(locked, 0o700)
        shim = os.path.join(locked, "python3")
        with open(shim, "w") as f:
            f.write('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
        os.chmod(shim, 0o755)
        return locked

    @inlineCallbacks
    def test_python_the_user_can_run(self) -> Any:
        """
        The built-in kernel runs the first ``python3`` on its ``PATH`` that
        its user can run: one in a directory only root enters (a root
        daemon's ``pyenv`` shims) is passed over, not run to fail.
        """
        import pwd

        locked = self.locked_python()
        ctx = yield self.context(
            kernel="sandboxd-python",
            user="nobody",
            env={"PATH": f"{locked}:/usr/bin:/bin"},
        )
        result = yield self.execute(
            ctx["id"], "import os, sys\n(os.getuid(), sys.executable)"
        )
        self.assertEqual(
            result["results"][0]["data"]["text/plain"],
            repr((pwd.getpwnam("nobody").pw_uid, "/usr/bin/python3")),
        )

    @inlineCallbacks
    def test_no_python_the_user_can_run(self) -> Any:
        """
        With none on its ``PATH`` (nor the daemon's own) the user can run,
        the start is 503 ``unavailable`` naming the interpreter and the
        user, not a 500 about an exit code.
        """
        from sandboxd.kernels import kernelspecs

        locked = self.locked_python()
        self.patch(kernelspecs.sys, "executable", os.path.join(locked, "python3"))
        reply = yield self.request(
            "POST",
            "/code/contexts",
            {"kernel": "sandboxd-python", "user": "nobody", "env": {"PATH": locked}},
        )
        self.assertEqual(reply.status, 503, reply.body)
        body = reply.json()
        self.assertEqual(body["code"], "unavailable")
        self.assertIn(os.path.join(locked, "python3"), body["error"])
        self.assertIn("'nobody'", body["error"])

    def fake_hubs(self) -> None:
        """
        Kernels of a kernelspec ``sleepy`` (a sleeping stdlib Python) spoken to
        by the ``whoami`` fake hub, both runnable by nobody.
        """
        import json

        from sandboxd.kernels import hubclient

        if not os.access("/usr/bin/python3", os.X_OK):
            raise SkipTest("no /usr/bin/python3 for the user nobody to run")
        jupyter = os.path.realpath(self.mktemp())
        spec_dir = os.path.join(jupyter, "kernels", "sleepy")
        os.makedirs(spec_dir)
        os.chmod(jupyter, 0o755)
        with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
            json.dump(
                {
                    "argv": [
                        "/usr/bin/python3",
                        "-c",
                        "import time; time.sleep(120)",
                        "{connection_file}",
                    ],
                    "display_name": "sleepy",
                    "language": "python",
                },
                f,
            )
        saved = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = jupyter
        self.addCleanup(
            lambda: (
                os.environ.pop("JUPYTER_PATH", None)
                if saved is None
                else os.environ.__setitem__("JUPYTER_PATH", saved)
            )
        )
        self.patch(hubclient, "HUB_COMMAND", ["/usr/bin/python3", FAKE_HUB, "whoami"])

    @inlineCallbacks
    def test_hub_per_user(self) -> Any:
        """
        A context of nobody gets a hub running as nobody, not the root hub;
        its kernel runs as nobody with a 0600 connection file nobody owns.
        """
        import pwd

        self.fake_hubs()
        nobody = pwd.getpwnam("nobody").pw_uid
        mine = yield self.context(kernel="sleepy")
        theirs = yield self.context(kernel="sleepy", user="nobody")
        self.assertEqual(mine["language"], f"uid{os.geteuid()}")
        self.assertEqual(theirs["language"], f"uid{nobody}")
        ran = yield self.execute(theirs["id"], "anything")
        self.assertEqual(ran["results"][0]["data"]["text/plain"], str(nobody))
        self.assertEqual(uid_of(theirs["pid"]), nobody)
        with open(f"/proc/{theirs['pid']}/cmdline", "rb") as f:
            connection_file = f.read().split(b"\0")[-2].decode()
        info = os.stat(connection_file)
        self.assertEqual((info.st_uid, info.st_mode & 0o777), (nobody, 0o600))

    @inlineCallbacks
    def test_hub_speaks_only_for_its_user(self) -> Any:
        """A hub that names another user's context (its pipe is its user's to write) is not heard."""
        self.fake_hubs()
        mine = yield self.context(kernel="sleepy")
        theirs = yield self.context(kernel="sleepy", user="nobody")
        reply = yield self.request(
            "POST",
            f"/code/contexts/{mine['id']}/execute",
            {"code": "hang", "wait": 0},
        )
        xid = reply.json()["execution_id"]
        spoofed = yield self.execute(theirs["id"], f"spoof:{mine['id']}:{xid}")
        self.assertEqual(spoofed["state"], "ok")
        got = yield self.request("GET", f"/code/contexts/{mine['id']}/executions/{xid}")
        self.assertEqual(got.json()["state"], "running")

    @inlineCallbacks
    def test_ipykernel_as_user(self) -> Any:
        """A real ipykernel of user=nobody runs code as nobody."""
        import pwd
        import sys

        if not runnable_by_others(sys.executable):
            raise SkipTest(
                f"this Python ({os.path.realpath(sys.executable)}) is in a"
                " directory the user nobody cannot enter"
            )
        ctx = yield self.context(user="nobody")
        result = yield self.execute(ctx["id"], "import os\nos.getuid()")
        nobody = pwd.getpwnam("nobody").pw_uid
        self.assertEqual(result["results"][0]["data"]["text/plain"], str(nobody))
        self.assertEqual(uid_of(ctx["pid"]), nobody)
        # Its hub runs as nobody too, but is not dumpable: its /proc entries
        # (its pipes to the daemon) are root's, out of the kernel's reach.
        hub = self.daemon.context.code.get().hub(_run_as("nobody"))
        self.assertEqual(uid_of(hub.pid), nobody)
        self.assertEqual(os.stat(f"/proc/{hub.pid}/fd").st_uid, 0)


FAKE_HUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_hub.py")


class BrokenHubTests(CodeTestCase):
    """A hub that breaks its framing or dies: contexts fail cleanly, the daemon serves on."""

    policy = code_policy()

    @inlineCallbacks
    def check(self, mode: str) -> Any:
        from sandboxd.kernels import hubclient

        self.patch(hubclient, "HUB_COMMAND", [sys.executable, FAKE_HUB, mode])
        self.patch(hubclient, "CODE_HUB_MAX_LINE_BYTES", 1000)
        reply = yield self.request("POST", "/code/contexts", {})
        self.assertEqual(reply.status, 503, reply.body)
        self.assertEqual(reply.json()["code"], "unavailable")
        self.assertIn("hub", reply.json()["error"])
        listed = yield self.request("GET", "/code/contexts")
        self.assertEqual(listed.json()["contexts"], [])
        health = yield self.request("GET", "/health")
        self.assertEqual(health.status, 200)
        # The real hub again: a new context works.
        self.patch(
            hubclient, "HUB_COMMAND", [sys.executable, "-m", "sandboxd.kernels.hub"]
        )
        self.patch(hubclient, "CODE_HUB_MAX_LINE_BYTES", 64 * 1024 * 1024)
        ctx = yield self.context()
        ok = yield self.execute(ctx["id"], "1 + 1")
        self.assertEqual(ok["results"][0]["data"]["text/plain"], "2")

    def test_garbage_line(self) -> Any:
        """A line that is not JSON ends the hub; after a few, the start fails 503."""
        return self.check("garbage")

    def test_overlong_line(self) -> Any:
        """A line over the bound ends the hub likewise."""
        return self.check("long")

    def test_hub_exits(self) -> Any:
        """A hub that exits at once: the start fails 503, not a hang."""
        return self.check("exit")


class RetentionTests(CodeTestCase):
    """Finished executions are forgotten oldest first past max_event_bytes."""

    policy = code_policy(limits={"max_event_bytes": 300 * 1024})

    @inlineCallbacks
    def five_big_prints(self, cid: str) -> Any:
        """Five executions printing 100 KiB each: their ids, and the ids still listed."""
        ids = []
        for _ in range(5):
            result = yield self.execute(cid, "print('y' * 100 * 1024)")
            ids.append(result["execution_id"])
        listed = yield self.request("GET", f"/code/contexts/{cid}/executions")
        return ids, [x["execution_id"] for x in listed.json()["executions"]]

    @inlineCallbacks
    def test_old_executions_forgotten(self) -> Any:
        """Each execution prints 100 KiB: the oldest go, the newest stay readable."""
        ctx = yield self.context()
        ids, kept = yield self.five_big_prints(ctx["id"])
        self.assertEqual(kept, ids[-len(kept) :])
        self.assertLess(len(kept), 5)
        gone = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{ids[0]}"
        )
        self.assertEqual(gone.status, 404)
        last = yield self.request(
            "GET", f"/code/contexts/{ctx['id']}/executions/{ids[-1]}"
        )
        self.assertEqual(len(last.json()["stdout"]), 100 * 1024 + 1)

    @inlineCallbacks
    def test_forgotten_after_the_count_bound(self) -> Any:
        """
        Past the 64 executions a context lists, then past its bytes: the
        small ones the count pushed out no longer count, the big ones are
        forgotten oldest first as before.
        """
        ctx = yield self.context()
        for _ in range(CODE_KEPT_EXECUTIONS + 4):
            yield self.execute(ctx["id"], "1+1")
        ids, kept = yield self.five_big_prints(ctx["id"])
        self.assertEqual(kept, ids[-len(kept) :])
        self.assertTrue(1 <= len(kept) < 5, kept)

    @inlineCallbacks
    def test_big_output_trimmed_when_quiet(self) -> Any:
        """
        A big output's end has the heap's free memory given back once no
        other ends for a while; a small output's end alone does not.
        """
        ctx = yield self.context()
        service = self.daemon.context.code.get()
        clock = Clock()
        trims: list[int] = []
        service.heap_trim = QuietTrim(clock, 10.0, trims.append)
        yield self.execute(ctx["id"], "1+1")
        clock.advance(11)
        self.assertEqual(trims, [])
        yield self.execute(ctx["id"], "print('y' * 100 * 1024)")
        clock.advance(5)
        self.assertEqual(trims, [])
        clock.advance(6)
        self.assertEqual(trims, [0])


class HubImportTests(CodeTestCase):
    @inlineCallbacks
    def test_files_in_the_base_dir_are_not_imported(self) -> Any:
        """
        The kernel hub runs in the base directory, where callers write files:
        a ``sandboxd`` package written there is not what it imports.
        """
        planted = os.path.join(self.base_dir, "sandboxd")
        os.makedirs(os.path.join(planted, "kernels"))
        marker = os.path.join(self.base_dir, "planted-code-ran")
        for name in ("__init__.py", "kernels/__init__.py", "kernels/hub.py"):
            with open(os.path.join(planted, name), "w") as f:
                f.write(f"open({marker!r}, 'w').close()\n")
        context = yield self.context()
        result = yield self.execute(context["id"], "1 + 1")
        self.assertEqual(result["results"][0]["data"]["text/plain"], "2")
        self.assertFalse(os.path.exists(marker))
