"""
The seed SDK's ``pty.*`` methods against a sandboxd daemon, each scenario
run against the seed's own server too.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.test_process import Compared


class TerminalTests(Compared):
    """create, list, get, resize, connect, delete."""

    @inlineCallbacks
    def test_lifecycle(self) -> Any:
        """A session is created, listed, described, resized, attached and deleted."""
        from agent_sandbox.models.server import PtyCreated, PtySessionInfo

        async def scenario(c: Any) -> Any:
            created = await c.pty.create(cols=100, rows=30)
            listed = await c.pty.list()
            got = await c.pty.get(created.session_id)
            resized = await c.pty.resize(created.session_id, 120, 40)
            async with c.pty.connect(created.session_id) as term:
                await term.send("echo pty-$((40+2))\n")
                seen = await term.expect("pty-42", timeout=10)
            await c.pty.delete(created.session_id)
            gone = [s.id for s in await c.pty.list()]
            return (
                type(created),
                bool(created.session_id),
                created.pid is not None,
                [type(s) for s in listed],
                created.session_id in [s.id for s in listed],
                (type(got), got.id == created.session_id, got.cols, got.rows),
                (type(resized), resized.cols, resized.rows),
                "pty-42" in seen,
                created.session_id in gone,
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            (
                PtyCreated,
                True,
                True,
                [PtySessionInfo],
                True,
                (PtySessionInfo, True, 100, 30),
                (PtySessionInfo, 120, 40),
                True,
                False,
            ),
        )

    @inlineCallbacks
    def test_get_unknown(self) -> Any:
        """get() and delete() of an unknown session are ServerAPIError 404."""
        from agent_sandbox.models.errors import ServerAPIError

        async def scenario(c: Any) -> Any:
            out = []
            for call in (c.pty.get, c.pty.delete):
                try:
                    await call("no-such-session")
                except ServerAPIError as e:
                    out.append((type(e), e.status_code))
            return out

        result = yield self.same(scenario)
        self.assertEqual(result, [(ServerAPIError, 404)] * 2)

    @inlineCallbacks
    def test_shell_not_allowed(self) -> Any:
        """
        create() with a shell the server does not allow is ServerAPIError
        400 on both (was PolicyDeniedError, a 403, on sandboxd).
        """

        async def scenario(c: Any) -> Any:
            try:
                await c.pty.create(shell="/usr/bin/python3")
            except Exception as e:
                return type(e).__name__, getattr(e, "status_code", None)
            return "created", None

        result = yield self.same(scenario)
        self.assertEqual(result, ("ServerAPIError", 400))

    @inlineCallbacks
    def test_sync_methods(self) -> Any:
        """create_sync, list_sync, get_sync, resize_sync, delete_sync."""
        pty = self.client().pty
        created = yield self.call(pty.create_sync)
        listed = yield self.call(pty.list_sync)
        self.assertEqual([s.id for s in listed], [created.session_id])
        got = yield self.call(pty.get_sync, created.session_id)
        self.assertEqual((got.cols, got.rows), (80, 24))
        resized = yield self.call(pty.resize_sync, created.session_id, 90, 20)
        self.assertEqual((resized.cols, resized.rows), (90, 20))
        yield self.call(pty.delete_sync, created.session_id)
        listed = yield self.call(pty.list_sync)
        self.assertEqual(listed, [])

    @inlineCallbacks
    def test_connect_bad_token(self) -> Any:
        """connect() with a wrong token is the SDK's ServerAuthError at the handshake."""
        from agent_sandbox.models.errors import ServerAuthError

        created = yield self.drive(lambda c: c.pty.create())

        async def scenario(c: Any) -> Any:
            async with c.pty.connect(created.session_id):
                return "attached"

        error = yield self.outcome(scenario, token="wrong-token")
        self.assertIsInstance(error, ServerAuthError)


class ConnectionTests(Compared):
    """What a PtyConnection sends and receives."""

    @inlineCallbacks
    def test_resize(self) -> Any:
        """A resize message reaches the terminal."""

        async def scenario(c: Any) -> Any:
            created = await c.pty.create()
            async with c.pty.connect(created.session_id) as term:
                await term.resize(132, 43)
                await term.send("stty size\n")
                size = await term.expect("43 132", timeout=10)
            await c.pty.delete(created.session_id)
            return "43 132" in size

        result = yield self.same(scenario)
        self.assertTrue(result)

    @inlineCallbacks
    def test_exit_ends_the_stream(self) -> Any:
        """
        When the shell exits, the connection says ``exited`` and closes, so
        ``async for`` over it ends.  (The seed's server keeps the socket
        open after its shell exits: the loop waits on there.)
        """

        async def scenario(c: Any) -> Any:
            created = await c.pty.create()
            async with c.pty.connect(created.session_id) as term:
                await term.send("exit\n")
                return [m.event async for m in term if m.type == "event"]

        events = yield self.drive(scenario)
        self.assertEqual(events, ["started", "exited"])

    @inlineCallbacks
    def test_signal_interrupts_foreground(self) -> Any:
        """
        ``signal("SIGINT")`` stops the command in the foreground, as Ctrl-C
        would.  (The seed's server signals the shell's own process group,
        which an interactive shell ignores: the command runs on there.)
        """

        async def scenario(c: Any) -> Any:
            created = await c.pty.create()
            async with c.pty.connect(created.session_id) as term:
                # The command says when it runs (the echo of what was typed
                # shows before the shell has forked it; a SIGINT then would
                # reach the prompt instead, on a busy machine).
                await term.send(
                    "sh -c 'echo up-$((3+3)); exec sleep 30'; echo after-$((1+1))\n"
                )
                await term.expect("up-6", timeout=10)
                await term.signal("SIGINT")
                await term.send("echo back-$((2+2))\n")
                seen = await term.expect("back-4", timeout=10)
            return "after-2" in seen

        interrupted = yield self.drive(scenario)
        self.assertFalse(interrupted)


class SyncFaceTests(Compared):
    """The ``*_sync`` twins of ``pty`` give on sandboxd what they give on the seed."""

    @inlineCallbacks
    def test_sync_face_compared(self) -> Any:
        """create, list, get, resize and delete through their twins; unknown ids 404."""
        from agent_sandbox.models.server import PtyCreated, PtySessionInfo

        from tests.seed.sdkcase import Face, outcome

        async def scenario(c: Any) -> Any:
            call = Face(sync=True)
            created = await call(c.pty.create, cols=90, rows=25)
            listed = await call(c.pty.list)
            got = await call(c.pty.get, created.session_id)
            resized = await call(c.pty.resize, created.session_id, 100, 30)
            await call(c.pty.delete, created.session_id)
            gone = await call(c.pty.list)
            missing = await outcome(call(c.pty.get, "no-such-session"))
            return (
                type(created),
                [(type(s), s.id == created.session_id) for s in listed],
                (type(got), got.cols, got.rows),
                (type(resized), resized.cols, resized.rows),
                gone,
                (type(missing).__name__, getattr(missing, "status_code", None)),
            )

        result = yield self.same(scenario)
        self.assertEqual(
            result,
            (
                PtyCreated,
                [(PtySessionInfo, True)],
                (PtySessionInfo, 90, 25),
                (PtySessionInfo, 100, 30),
                [],
                ("ServerAPIError", 404),
            ),
        )


#: Both servers: terminals may start bash alone, by its path.
SHELLS_POLICY = {
    "endpoints": {"pty_create_session": {"params": {"shells": ["/bin/bash"]}}}
}


class PolicyShellsTests(Compared):
    """A policy's own ``shells`` list."""

    policy = SHELLS_POLICY

    @inlineCallbacks
    def reference(self, *extra: str) -> Any:
        """The seed's server, with the same policy."""
        path = os.path.realpath(self.mktemp()) + ".json"
        with open(path, "w") as f:
            json.dump(SHELLS_POLICY, f)
        ref = yield super().reference("--policy", path, *extra)
        return ref

    @inlineCallbacks
    def test_shell_refused_by_policy(self) -> Any:
        """
        create() with a shell the policy's ``shells`` leave out raises
        PolicyDeniedError (403 ``shell_not_allowed``) on both (was
        ServerAPIError, a 400, on sandboxd), so ``except PolicyDeniedError``
        catches it on either.
        """

        async def scenario(c: Any) -> Any:
            try:
                await c.pty.create(shell="/bin/sh")
            except Exception as e:
                return type(e).__name__, e.status_code, e.error_code, e.error_type
            return "created", None, None, None

        result = yield self.same(scenario)
        self.assertEqual(
            result, ("PolicyDeniedError", 403, "shell_not_allowed", "PolicyDenied")
        )
