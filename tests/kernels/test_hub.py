"""
The kernel hub's own loop, spoken to over its pipes as the daemon speaks
to it: a bad command is answered and the hub goes on, a command line over
its bound ends it with a last word, a kernel that never answers is given
up after the open's timeout, and a closed stdin ends it cleanly; what an
execution says on its way waits a moment for its end, so the daemon wakes
once for a short cell.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, SynchronousTestCase, TestCase

from sandboxd.kernels.hub import (
    HOLD_SECONDS,
    IDLE_GRACE_SECONDS,
    MAX_COMMAND_BYTES,
    Hub,
    Kernel,
    Numbers,
    Pending,
)
from tests.helpers import refusing_port


class HubProcess(ProcessProtocol):
    """A hub child: its event lines as they come, its end."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.ended: Deferred[int | None] = Deferred()
        self._buffer = b""
        self._waiting: list[tuple[str, Deferred[dict[str, Any]]]] = []

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            event = json.loads(line)
            self.events.append(event)
            for waiting in list(self._waiting):
                if waiting[0] == event["ev"]:
                    self._waiting.remove(waiting)
                    waiting[1].callback(event)

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))

    def next(self, ev: str) -> Deferred[dict[str, Any]]:
        """The next event named ``ev``."""
        waiting: Deferred[dict[str, Any]] = Deferred()
        self._waiting.append((ev, waiting))
        return waiting

    def send(self, command: dict[str, Any]) -> None:
        """One command line."""
        assert self.transport is not None
        self.transport.write(json.dumps(command).encode() + b"\n")


def need_code_extra() -> None:
    """Skip where the hub's own dependencies are not installed."""
    try:
        import jupyter_client  # noqa: F401
        import zmq  # noqa: F401
    except ImportError:
        raise SkipTest(
            "the code extra (jupyter_client, pyzmq) is not installed"
        ) from None


class HoldTests(SynchronousTestCase):
    """The hub's lines to the daemon, as a turn of its loop leaves them."""

    def setUp(self) -> None:
        need_code_extra()
        self.hub = Hub()
        self.addCleanup(self.hub.context.term)
        read, write = os.pipe()
        os.set_blocking(read, False)
        self.addCleanup(os.close, read)
        self.hub.out._out = os.fdopen(write, "wb")
        self.addCleanup(self.hub.out._out.close)
        self.read = lambda: self._read(read)

    def _read(self, fd: int) -> bytes:
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            return b""

    def test_progress_waits_for_the_end(self) -> None:
        """
        An execution's ``started`` and output, sent in turns before its
        ``done``, cross the pipe with it in one write.
        """
        out = self.hub.out
        out.send({"ev": "started"}, hold=True)
        self.hub._flush()
        self.assertEqual(self.read(), b"")
        out.send({"ev": "stream"}, [b"two"], hold=True)
        self.hub._flush()
        self.assertEqual(self.read(), b"")
        out.send({"ev": "done"})
        self.hub._flush()
        self.assertEqual(
            self.read(),
            b'{"ev":"started"}\n{"ev":"stream","bytes":3}\ntwo{"ev":"done"}\n',
        )

    def test_held_lines_leave_in_time(self) -> None:
        """Held lines alone leave within ``HOLD_SECONDS``, on the loop's timer."""
        self.hub.out.send({"ev": "started"}, hold=True)
        self.hub._flush()
        self.assertEqual(self.read(), b"")
        wait = self.hub._wait()
        assert wait is not None
        self.assertLessEqual(wait, HOLD_SECONDS * 1000)
        time.sleep(HOLD_SECONDS)
        self.hub._due()
        self.assertEqual(self.read(), b'{"ev":"started"}\n')
        self.assertIsNone(self.hub._wait())


class EndTests(SynchronousTestCase):
    """
    What ends an execution and what is said when output cannot be kept:
    a kernel's iopub messages (``idle`` among them) may be dropped on the
    way, its reply may not.
    """

    def setUp(self) -> None:
        need_code_extra()
        self.hub = Hub(buffer_bytes=100)
        self.addCleanup(self.hub.context.term)
        read, write = os.pipe()
        os.set_blocking(read, False)
        self.addCleanup(os.close, read)
        self.hub.out._out = os.fdopen(write, "wb")
        self.addCleanup(self.hub.out._out.close)
        self.read_fd = read
        self.kernel = Kernel.__new__(Kernel)
        self.kernel.hub, self.kernel.cid, self.kernel.closed = self.hub, "c1", False
        self.kernel.pending = {"m1": Pending("x1")}
        self.kernel.numbers = Numbers()

    def events(self) -> list[dict[str, Any]]:
        """The event lines written so far (payloads skipped)."""
        self.hub.out.flush()
        data = b""
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                break
            data += chunk
        found = []
        while data:
            line, _, data = data.partition(b"\n")
            event = json.loads(line)
            data = data[event.get("bytes", 0) :]
            found.append(event)
        return found

    def message(self, kind: str, content: dict[str, Any]) -> dict[str, Any]:
        """A kernel message of ``kind`` for the execution under way."""
        return {"msg_type": kind, "parent_header": {"msg_id": "m1"}, "content": content}

    def test_reply_without_idle_ends_it(self) -> None:
        """
        With the reply in and no ``idle``, the execution ends once iopub
        has been quiet about it for the grace (was: it waited for ``idle``
        until the daemon's timeout restarted the kernel), and says so.
        """
        self.kernel._shell(self.message("execute_reply", {"status": "ok"}))
        self.assertEqual(self.events(), [])
        self.kernel.pending["m1"].heard -= IDLE_GRACE_SECONDS
        call = self.hub._timers[0][2]
        call()
        done = self.events()
        self.assertEqual(done[-1]["ev"], "done")
        self.assertEqual((done[-1]["status"], done[-1]["idle_lost"]), ("ok", True))
        self.assertEqual(self.kernel.pending, {})

    def test_output_still_coming_waited_for(self) -> None:
        """While iopub still brings the execution's output, its end waits for it."""
        self.kernel._shell(self.message("execute_reply", {"status": "ok"}))
        self.kernel._iopub(self.message("stream", {"name": "stdout", "text": "a\n"}))
        self.hub._timers[0][2]()
        self.assertEqual([e["ev"] for e in self.events()], ["stream"])
        self.assertIn("m1", self.kernel.pending)

    def test_dropped_output_counted(self) -> None:
        """
        Past the hub's buffer, output is dropped and counted, and a
        ``dropped`` line says how much before the execution's next line.
        """
        out = self.hub.out
        out.send(
            {"ev": "stream", "cid": "c1", "xid": "x1", "name": "stdout"},
            [b"x" * 200],
            True,
        )
        out.send(
            {"ev": "stream", "cid": "c1", "xid": "x1", "name": "stdout"},
            [b"y" * 7],
            True,
        )
        out.send(
            {"ev": "stream", "cid": "c1", "xid": "x1", "name": "stderr"},
            [b"z" * 3],
            True,
        )
        out.send({"ev": "display", "cid": "c1", "xid": "x1", "data": {}}, None, True)
        out.send({"ev": "done", "cid": "c1", "xid": "x1"})
        events = self.events()
        self.assertEqual([e["ev"] for e in events], ["stream", "dropped", "done"])
        self.assertEqual(
            events[1],
            {
                "ev": "dropped",
                "cid": "c1",
                "xid": "x1",
                "stdout": 7,
                "stderr": 3,
                "displays": 1,
            },
        )


class NumbersTests(SynchronousTestCase):
    """The kernel's messages counted by number, to count those ZMQ dropped."""

    def test_gaps_counted_once_settled(self) -> None:
        """
        A number never received is lost once settled past; one that comes
        out of order is not; ids not numbered as ``jupyter_client`` does
        (another kernel's, another session's) are left alone.
        """
        numbers = Numbers()
        for n in (5, 7, 6, 9, 12):
            self.assertEqual(numbers.saw(f"abc-def_4242_{n}"), n)
        self.assertIsNone(numbers.saw("not-numbered"))
        self.assertIsNone(numbers.saw("other_4242_10"))
        numbers.settle(9)
        self.assertEqual(numbers.untold(), 1)  # 8
        numbers.settle(12)
        self.assertEqual(numbers.untold(), 2)  # 10, 11
        self.assertEqual(numbers.untold(), 0)
        numbers.saw("abc-def_4242_13")
        numbers.settle(13)
        self.assertEqual(numbers.untold(), 0)

    def test_start_over(self) -> None:
        """What was missed before the kernel answered is not counted lost."""
        numbers = Numbers()
        numbers.saw("s_1_3")
        numbers.saw("s_1_7")
        numbers.start_over()
        numbers.saw("s_1_8")
        numbers.settle(8)
        self.assertEqual(numbers.untold(), 0)


class HubLoopTests(TestCase):
    """The hub's command loop, without a daemon."""

    timeout = 60

    def setUp(self) -> None:
        need_code_extra()
        self.hub = HubProcess()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.process = reactor.spawnProcess(  # type: ignore[attr-defined]
            self.hub,
            sys.executable,
            [sys.executable, "-m", "sandboxd.kernels.hub"],
            env=env,
        )
        self.addCleanup(self._stop)

    def _stop(self) -> Deferred[int | None] | None:
        if self.hub.ended.called:
            return None
        self.process.signalProcess("KILL")
        return self.hub.ended

    async def test_bad_commands_answered(self) -> None:
        """
        A line that is not JSON and a command for no open context are each
        answered with ``bad_command``; the hub goes on, and ends cleanly
        once its stdin closes.
        """
        self.process.write(b"not json\n")
        first = await self.hub.next("bad_command")
        self.assertIsNone(first["cid"])
        self.hub.send({"op": "execute", "cid": "c1", "xid": "x1", "code": "1+1"})
        second = await self.hub.next("bad_command")
        self.assertEqual(
            (second["cid"], second["xid"], second["message"]),
            ("c1", "x1", "no such context"),
        )
        self.hub.send({"op": "close", "cid": "c1"})
        closed = await self.hub.next("closed")
        self.assertEqual(closed["cid"], "c1")
        self.process.closeStdin()
        self.assertEqual(await self.hub.ended, 0)

    async def test_command_too_long(self) -> None:
        """A command line over the bound ends the hub with a last word."""
        self.process.write(b"x" * (MAX_COMMAND_BYTES + 1))
        fatal = await self.hub.next("fatal")
        self.assertEqual(fatal["message"], "a command line is too long")
        await self.hub.ended

    async def test_kernel_never_answers(self) -> None:
        """
        A kernel that does not answer ``kernel_info`` (nothing listens on
        its ports) is given up after the open's timeout, while the hub
        answers other commands meanwhile.
        """
        shell, iopub, stdin, control, hb = (refusing_port(self) for _ in range(5))
        conn = {
            "transport": "tcp",
            "ip": "127.0.0.1",
            "shell_port": shell,
            "iopub_port": iopub,
            "stdin_port": stdin,
            "control_port": control,
            "hb_port": hb,
            "key": "k" * 32,
            "signature_scheme": "hmac-sha256",
        }
        started = reactor.seconds()  # type: ignore[attr-defined]
        self.hub.send({"op": "open", "cid": "c1", "conn": conn, "timeout": 2.5})
        self.hub.send({"op": "execute", "cid": "c2", "xid": "x1", "code": "1+1"})
        other = await self.hub.next("bad_command")
        self.assertEqual(other["cid"], "c2")
        failed = await self.hub.next("failed")
        took = reactor.seconds() - started  # type: ignore[attr-defined]
        self.assertEqual(
            (failed["cid"], failed["message"]),
            ("c1", "the kernel did not answer within 2.5 s"),
        )
        self.assertGreaterEqual(took, 2.4)
        self.hub.send({"op": "execute", "cid": "c1", "xid": "x2", "code": "1+1"})
        gone = await self.hub.next("bad_command")
        self.assertEqual((gone["cid"], gone["message"]), ("c1", "no such context"))
        self.process.closeStdin()
        self.assertEqual(await self.hub.ended, 0)
