"""
Code contexts (stateful kernels) against a real daemon and a real
ipykernel: state kept between executions, output as it comes, rich
results, errors, interrupts, restarts, deaths, ownership and bounds.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import sys
import signal
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SkipTest
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.kernels.kernelspecs import find_kernelspecs
from sandboxd.testing import SSEReader
from tests.helpers import DaemonTestCase, alive


def need_ipykernel() -> None:
    """Skip (saying why) where no python3 kernelspec is installed."""
    if "python3" not in find_kernelspecs(os.environ):
        raise SkipTest("no python3 kernelspec (ipykernel is not installed)")
    if not all(importlib.util.find_spec(m) for m in ("jupyter_client", "zmq")):
        raise SkipTest("the code extra (jupyter_client, pyzmq) is not installed")


def code_policy(**group: Any) -> dict[str, Any]:
    """The code group on, with an optional ``group:code`` rule."""
    policy: dict[str, Any] = {"groups": {"code": True}}
    if group:
        policy["endpoints"] = {"group:code": group}
    return policy


class CodeTestCase(DaemonTestCase):
    """A daemon with the code group on."""

    timeout = 60
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
    def stream(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """Open an SSE response; its reader."""
        import json

        from twisted.web.client import FileBodyProducer
        from io import BytesIO

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


class ContextTests(CodeTestCase):
    """The native API with a real ipykernel."""

    @inlineCallbacks
    def test_state_kept_between_executions(self) -> Any:
        """A variable set by one execution is there for the next; the count grows."""
        ctx = yield self.context()
        self.assertEqual(ctx["kernel"], "python3")
        self.assertEqual(ctx["state"], "idle")
        first = yield self.execute(ctx["id"], "x = 41\nprint('set')")
        self.assertEqual(first["state"], "ok")
        self.assertEqual(first["stdout"], "set\n")
        second = yield self.execute(ctx["id"], "x + 1")
        self.assertEqual(second["state"], "ok")
        self.assertEqual(second["results"][0]["data"]["text/plain"], "42")
        self.assertTrue(second["results"][0]["is_result"])
        self.assertEqual(second["execution_count"], first["execution_count"] + 1)
        # The daemon (this process) spoke to the kernel without ZMQ.
        for name in ("zmq", "jupyter_client", "tornado"):
            self.assertNotIn(name, sys.modules)

    @inlineCallbacks
    def test_error_with_traceback(self) -> Any:
        """An exception ends the execution ``error`` with name, value and traceback."""
        ctx = yield self.context()
        result = yield self.execute(ctx["id"], "1/0")
        self.assertEqual(result["state"], "error")
        self.assertEqual(result["error"]["ename"], "ZeroDivisionError")
        self.assertIn("division by zero", result["error"]["evalue"])
        self.assertTrue(result["error"]["traceback"])

    @inlineCallbacks
    def test_matplotlib_png(self) -> Any:
        """A matplotlib figure comes back as a PNG display item."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SkipTest("matplotlib is not installed") from None
        ctx = yield self.context()
        result = yield self.execute(
            ctx["id"],
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        )
        self.assertEqual(result["state"], "ok", result)
        pngs = [r["data"]["image/png"] for r in result["results"] if "image/png" in r["data"]]
        self.assertEqual(len(pngs), 1)
        self.assertTrue(base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n"))

    @inlineCallbacks
    def test_stream_events(self) -> Any:
        """``stream: true`` answers SSE: started, stdout as it comes, ended last."""
        ctx = yield self.context()
        reader = yield self.stream(
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\nprint('a', flush=True)\ntime.sleep(0.3)\nprint('b')", "stream": True},
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
    def test_resume_mid_execution(self) -> Any:
        """202 with the id, then the events resumed after an id: no loss, no repeat."""
        ctx = yield self.context()
        reply = yield self.request(
            "POST",
            f"/code/contexts/{ctx['id']}/execute",
            {"code": "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.1)", "wait": 0},
        )
        self.assertEqual(reply.status, 202, reply.body)
        xid = reply.json()["execution_id"]
        events_url = reply.json()["events_url"]
        first = yield self.stream(events_url)
        yield first.wait_for_event(lambda e: e["event"] == "stdout" and e["data"]["text"].startswith("1"))
        last_id = [e for e in first.events if e["event"] == "stdout"][-1]["id"]
        first.disconnect()
        second = yield self.stream(events_url, headers={"Last-Event-ID": str(last_id)})
        events = yield second.done
        self.assertEqual(events[0]["id"], last_id + 1)
        before = [e for e in first.events if e["id"] <= last_id]
        text = "".join(e["data"]["text"] for e in before + events if e["event"] == "stdout")
        self.assertEqual(text, "".join(f"{i}\n" for i in range(6)))
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}/executions/{xid}")
        self.assertEqual(got.json()["state"], "ok")

    @inlineCallbacks
    def test_interrupt(self) -> Any:
        """Interrupting a busy loop ends it ``interrupted``; the state survives."""
        ctx = yield self.context()
        yield self.execute(ctx["id"], "kept = 7")
        reply = yield self.request(
            "POST", f"/code/contexts/{ctx['id']}/execute", {"code": "while True: pass", "wait": 0}
        )
        xid = reply.json()["execution_id"]
        yield deferLater(reactor, 0.5, lambda: None)
        stop = yield self.request("POST", f"/code/contexts/{ctx['id']}/interrupt", {})
        self.assertEqual(stop.json()["execution_id"], xid)
        got = yield self.request("GET", f"/code/contexts/{ctx['id']}/executions/{xid}?wait=10")
        self.assertEqual(got.json()["state"], "interrupted")
        after = yield self.execute(ctx["id"], "kept")
        self.assertEqual(after["results"][0]["data"]["text/plain"], "7")

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
