"""
The E2B door seen by a hostile client: another identity's terminals,
the door's own rule, what ``List`` discloses, who owns what it writes,
malformed input, Content-Types, the audit of what ran, bytes that are
not UTF-8, and big bodies of callers the door refuses.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import re
import select
import socket
import tempfile
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SkipTest

from tests.e2b.sdk import E2BCase, caught, envelope

ALICE, BOB, CAROL, ADMIN = "alice-token", "bob-token", "carol-token", "admin-token"

#: A pid no process has (above the kernel's pid_max).
UNUSED_PID = 4194305


def _start(script: str, **extra: Any) -> dict[str, Any]:
    return {
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", script], **extra},
        "stdin": False,
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _answer(result: Any) -> tuple[int, str, str]:
    """``(status, Connect code, message)`` of a unary or stream answer."""
    status, _, body = result
    if isinstance(body, list):
        _, end = body[-1]
        error = end.get("error") or {}
        return status, error.get("code", ""), error.get("message", "")
    body = body or {}
    return status, body.get("code", ""), body.get("message", "")


class OtherIdentityTerminalTests(E2BCase):
    """
    A terminal is its creator's (or a ``*`` holder's): every attach path of
    the door answers "not yours" exactly as "not there", and does nothing.
    """

    environ = {"ALICE": ALICE, "BOB": BOB, "CAROL": CAROL}
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "alice",
                    "token_env": "ALICE",
                    "scopes": ["terminal:use", "process:manage", "process:read"],
                },
                {"id": "bob", "token_env": "BOB", "scopes": ["terminal:use"]},
                {
                    "id": "carol",
                    "token_env": "CAROL",
                    "scopes": [
                        "terminal:use",
                        "process:manage",
                        "process:run",
                        "process:read",
                    ],
                },
            ]
        }
    }

    @inlineCallbacks
    def _alice_terminal(self) -> Any:
        reply = yield self.request(
            "POST", "/pty/sessions", {"cols": 80, "rows": 24}, token=ALICE
        )
        self.assertEqual(reply.status, 200, reply.body)
        created = json.loads(reply.body)
        self.addCleanup(
            self.request,
            "DELETE",
            f"/pty/sessions/{created['session_id']}",
            token=ALICE,
        )
        return created

    def _calls(self, pid: int) -> list[tuple[str, Any, bool]]:
        selector = {"process": {"pid": pid}}
        keys = {"pty": _b64(b"echo pwned > /dev/null\n")}
        return [
            ("process.Process/Connect", selector, True),
            ("process.Process/SendInput", {**selector, "input": keys}, False),
            (
                "process.Process/Update",
                {**selector, "pty": {"size": {"cols": 33, "rows": 7}}},
                False,
            ),
            (
                "process.Process/SendSignal",
                {**selector, "signal": "SIGNAL_SIGKILL"},
                False,
            ),
            ("process.Process/CloseStdin", selector, False),
        ]

    @inlineCallbacks
    def _stream_input(self, pid: int, token: str) -> Any:
        raw = envelope({"start": {"process": {"pid": pid}}}) + envelope(
            {"data": {"input": {"pty": _b64(b"echo pwned\n")}}}
        )
        return (
            yield self.rpc(
                "process.Process/StreamInput",
                None,
                stream=True,
                raw=raw,
                headers={"X-Access-Token": token},
            )
        )

    @inlineCallbacks
    def test_not_yours_is_not_there(self) -> Any:
        """
        Bob (terminal:use) and Carol (terminal:use and process scopes) get,
        for Alice's terminal pid, the same status, code and message as for
        a pid nobody has (Connect, SendInput, StreamInput, Update,
        SendSignal, CloseStdin); no message names a session id; Alice's
        terminal is still there, at its size.
        """
        created = yield self._alice_terminal()
        pid, session_id = created["pid"], created["session_id"]
        for token in (BOB, CAROL):
            headers = {"X-Access-Token": token, "Connect-Timeout-Ms": "3000"}
            for procedure, message, stream in self._calls(pid):
                theirs = yield self.rpc(procedure, message, stream, headers)
                unused = json.loads(
                    json.dumps(message).replace(str(pid), str(UNUSED_PID))
                )
                nobodys = yield self.rpc(procedure, unused, stream, headers)
                got, expected = _answer(theirs), _answer(nobodys)
                self.assertNotIn(session_id, str(theirs), procedure)
                self.assertNotEqual(got[0:2], (200, ""), (token, procedure, theirs))
                self.assertEqual(
                    (got[0], got[1], got[2].replace(str(pid), "PID")),
                    (
                        expected[0],
                        expected[1],
                        expected[2].replace(str(UNUSED_PID), "PID"),
                    ),
                    (token, procedure),
                )
            theirs = yield self._stream_input(pid, token)
            nobodys = yield self._stream_input(UNUSED_PID, token)
            got, expected = _answer(theirs), _answer(nobodys)
            self.assertNotIn(session_id, str(theirs))
            self.assertEqual(
                (got[0], got[1], got[2].replace(str(pid), "PID")),
                (expected[0], expected[1], expected[2].replace(str(UNUSED_PID), "PID")),
                (token, "StreamInput"),
            )
        reply = yield self.request("GET", f"/pty/sessions/{session_id}", token=ALICE)
        self.assertEqual(reply.status, 200, reply.body)
        described = json.loads(reply.body)
        self.assertEqual((described["cols"], described["rows"]), (80, 24))
        self.assertTrue(described.get("alive", True))

    @inlineCallbacks
    def test_connect_streams_nothing_of_anothers_terminal(self) -> Any:
        """Bob's Connect to Alice's terminal carries none of what her shell prints."""
        created = yield self._alice_terminal()
        yield self.rpc(
            "process.Process/SendInput",
            {
                "process": {"pid": created["pid"]},
                "input": {"pty": _b64(b"echo ALICE-SECRET-$((6*7))\n")},
            },
            headers={"X-Access-Token": ALICE},
        )
        status, _, messages = yield self.rpc(
            "process.Process/Connect",
            {"process": {"pid": created["pid"]}},
            stream=True,
            headers={"X-Access-Token": BOB, "Connect-Timeout-Ms": "1500"},
        )
        self.assertEqual(status, 200)
        self.assertEqual(len(messages), 1, messages)
        flags, _ = messages[0]
        self.assertEqual(flags, 2)
        self.assertNotIn("ALICE-SECRET", str(messages))
        self.assertNotIn(_b64(b"ALICE"), str(messages))

    @inlineCallbacks
    def test_list_shows_only_ones_own_terminals(self) -> Any:
        """List shows Carol no terminal of Alice's (as pty_list does not)."""
        created = yield self._alice_terminal()
        _, _, body = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": CAROL}
        )
        self.assertNotIn(created["pid"], [p["pid"] for p in body["processes"]])


class DoorRuleTests(E2BCase):
    """The door is its own endpoint ``e2b``: its scopes, rate and concurrency hold."""

    audit = True

    environ = {"READER": "reader-token", "MANAGER": "manager-token"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "reader", "token_env": "READER", "scopes": ["files:read"]},
                {
                    "id": "manager",
                    "token_env": "MANAGER",
                    "scopes": ["files:read", "process:manage", "process:run"],
                },
            ]
        },
        "endpoints": {
            "e2b": {"scopes": ["process:manage"], "limits": {"rate_per_minute": 6}}
        },
    }

    @inlineCallbacks
    def test_scope_of_the_door(self) -> Any:
        """A files:read token may not use the door: its Stat is missing_scope e2b."""
        with open(os.path.join(self.base_dir, "f.txt"), "w") as f:
            f.write("x")
        status, _, body = yield self.rpc(
            "filesystem.Filesystem/Stat",
            {"path": "f.txt"},
            headers={"X-Access-Token": "reader-token"},
        )
        self.assertEqual((status, body["code"]), (403, "permission_denied"))
        self.assertIn("missing_scope", body["message"])
        self.assertIn("e2b", body["message"])
        # The same token is refused on REST routes too.
        error = yield self.sdk(
            caught, lambda: self.sandbox(token="reader-token").files.read("f.txt")
        )
        self.assertIn("missing_scope", str(error))
        refused = [r for r in self.audit_lines() if r.get("via") == "e2b"]
        self.assertEqual(
            [(r["endpoint"], r["identity"], r["code"]) for r in refused],
            [("e2b", "reader", "missing_scope")] * 2,
        )

    @inlineCallbacks
    def test_rate_of_the_door(self) -> Any:
        """With rate_per_minute 6 on e2b, the 7th and 8th calls a minute are rate_limited."""
        with open(os.path.join(self.base_dir, "f.txt"), "w") as f:
            f.write("x")
        statuses = []
        for _ in range(8):
            status, _, body = yield self.rpc(
                "filesystem.Filesystem/Stat",
                {"path": "f.txt"},
                headers={"X-Access-Token": "manager-token"},
            )
            statuses.append((status, body.get("code") if status != 200 else None))
        self.assertEqual(statuses[:6], [(200, None)] * 6)
        self.assertEqual(statuses[6:], [(429, "resource_exhausted")] * 2)


class DoorConcurrencyTests(E2BCase):
    """``endpoints.e2b.limits.max_concurrency`` bounds calls in flight through the door."""

    policy = {"endpoints": {"e2b": {"limits": {"max_concurrency": 1}}}}

    @inlineCallbacks
    def test_one_call_at_a_time(self) -> Any:
        """While a Start stream is open, another call is concurrency_limited; after, it passes."""
        running = self.rpc(
            "process.Process/Start",
            _start("sleep 1.5"),
            stream=True,
        )
        yield self.sdk(time.sleep, 0.5)
        status, _, body = yield self.rpc("filesystem.Filesystem/Stat", {"path": "."})
        self.assertEqual((status, body["code"]), (429, "resource_exhausted"))
        self.assertIn("concurrency_limited", body["message"])
        yield running
        status, _, body = yield self.rpc("filesystem.Filesystem/Stat", {"path": "."})
        self.assertEqual(status, 200, body)
        # A procedure the door does not serve is admitted as e2b once, not twice.
        status, _, body = yield self.rpc("process.Process/Fly", {})
        self.assertEqual((status, body["code"]), (501, "unimplemented"))


class ListDisclosureTests(E2BCase):
    """``List`` shows no more than ``process_list``: no other identity's environment, no secrets."""

    environ = {"ALICE": ALICE, "BOB": BOB}
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "alice",
                    "token_env": "ALICE",
                    "scopes": [
                        "process:run",
                        "process:manage",
                        "process:read",
                        "links:mint",
                    ],
                },
                {
                    "id": "bob",
                    "token_env": "BOB",
                    "scopes": ["process:run", "process:manage", "process:read"],
                },
            ]
        }
    }

    @inlineCallbacks
    def test_a_link_sees_its_minters(self) -> Any:
        """
        A link of Alice's acts for her: its List shows her command's
        environment, as her own does.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["process:read"]},
            token=ALICE,
        )
        self.assertEqual(minted.status, 201, minted.body)
        started = self.rpc(
            "process.Process/Start",
            _start("sleep 2", envs={"PLAIN": "1"}),
            stream=True,
            headers={"X-Access-Token": ALICE, "Connect-Timeout-Ms": "2500"},
        )
        yield self.sdk(time.sleep, 0.7)
        status, _, listed = yield self.rpc(
            "process.Process/List",
            {},
            headers={"X-Access-Token": minted.json()["token"]},
        )
        yield started
        self.assertEqual(status, 200, listed)
        (view,) = [p for p in listed["processes"] if p["config"]["cmd"] == "/bin/bash"]
        self.assertEqual(view["config"]["envs"], {"PLAIN": "1"})

    @inlineCallbacks
    def test_the_minter_sees_its_links(self) -> Any:
        """
        What a link of Alice's starts is hers: her own List shows its
        environment, as it shows her own commands'.
        """
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["process:run", "process:read"]},
            token=ALICE,
        )
        self.assertEqual(minted.status, 201, minted.body)
        started = self.rpc(
            "process.Process/Start",
            _start("sleep 2", envs={"PLAIN": "1"}),
            stream=True,
            headers={
                "X-Access-Token": minted.json()["token"],
                "Connect-Timeout-Ms": "2500",
            },
        )
        yield self.sdk(time.sleep, 0.7)
        status, _, listed = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": ALICE}
        )
        yield started
        self.assertEqual(status, 200, listed)
        (view,) = [p for p in listed["processes"] if p["config"]["cmd"] == "/bin/bash"]
        self.assertEqual(view["config"]["envs"], {"PLAIN": "1"})

    @inlineCallbacks
    def test_no_environment_of_others_no_secret_names(self) -> Any:
        """
        Alice's command started with GITHUB_TOKEN and DB_PASSWORD: Bob's
        List shows its command and no environment; Alice's own shows
        PLAIN but never the secret-pattern names.
        """
        envs = {"GITHUB_TOKEN": "ghp_leaked", "DB_PASSWORD": "hunter2", "PLAIN": "1"}
        started = self.rpc(
            "process.Process/Start",
            _start("sleep 2", envs=envs),
            stream=True,
            headers={"X-Access-Token": ALICE, "Connect-Timeout-Ms": "2500"},
        )
        yield self.sdk(time.sleep, 0.7)
        _, _, bobs = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": BOB}
        )
        _, _, alices = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": ALICE}
        )
        yield started
        for listed in (bobs, alices):
            self.assertNotIn("ghp_leaked", json.dumps(listed))
            self.assertNotIn("hunter2", json.dumps(listed))
            self.assertNotIn("GITHUB_TOKEN", json.dumps(listed))
            self.assertNotIn("DB_PASSWORD", json.dumps(listed))
        (bob_view,) = [
            p for p in bobs["processes"] if p["config"]["cmd"] == "/bin/bash"
        ]
        self.assertEqual(bob_view["config"].get("envs", {}), {})
        self.assertEqual(bob_view["config"]["args"][-1], "sleep 2")
        (alice_view,) = [
            p for p in alices["processes"] if p["config"]["cmd"] == "/bin/bash"
        ]
        self.assertEqual(alice_view["config"]["envs"], {"PLAIN": "1"})

    @inlineCallbacks
    def test_credentials_in_a_command_line_are_masked(self) -> Any:
        """
        Alice's command carries ``https://alice:PAT@host`` (what the E2B
        SDK's git helpers run): Bob's ``commands.list`` and ``GET
        /process/list`` show the command with the credentials masked, as
        the audit masks them; neither shows the token.
        """
        script = "sleep 2; : 'https://alice:S3CRET-PAT-123@github.com/x/y.git'"
        started = self.rpc(
            "process.Process/Start",
            _start(script),
            stream=True,
            headers={"X-Access-Token": ALICE, "Connect-Timeout-Ms": "2500"},
        )
        yield self.sdk(time.sleep, 0.7)
        _, _, door = yield self.rpc(
            "process.Process/List", {}, headers={"X-Access-Token": BOB}
        )
        http = yield self.request("GET", "/process/list", token=BOB)
        yield started
        (view,) = [p for p in door["processes"] if p["config"]["cmd"] == "/bin/bash"]
        self.assertIn("https://***@github.com/x/y.git", view["config"]["args"][-1])
        self.assertEqual(http.status, 200, http.body)
        listed = [p["command"] for p in http.json()["processes"]]
        self.assertTrue([c for c in listed if "https://***@github.com" in c], listed)
        self.assertNotIn("S3CRET-PAT-123", json.dumps(door))
        self.assertNotIn(b"S3CRET-PAT-123", http.body)


class FileOwnerTests(E2BCase):
    """On a root daemon, what the door writes belongs to the sandbox user (``params.default_user``)."""

    policy = {"defaults": {"params": {"default_user": "nobody", "users": ["nobody"]}}}

    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise SkipTest("the daemon must run as root to give files away")
        try:
            self.user = pwd.getpwnam("nobody")
        except KeyError:
            raise SkipTest("no user 'nobody' on this machine") from None
        return super().setUp()

    def owner(self, rel: str) -> tuple[int, int]:
        st = os.lstat(os.path.join(self.base_dir, rel))
        return st.st_uid, st.st_gid

    @inlineCallbacks
    def test_upload_and_make_dir(self) -> Any:
        """files.write (POST /files, new parents included) and files.make_dir give nobody the entries."""
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        def job() -> Any:
            sbx = self.sandbox()
            sbx.files.write("up/one.txt", "1")
            sbx.files.write("raw.bin", b"\x00\x01", use_octet_stream=True)
            sbx.files.write_files(
                [
                    WriteEntry(path="m/a.txt", data="a"),
                    WriteEntry(path="m/b.txt", data="b"),
                ]
            )
            sbx.files.make_dir("d/e/f")

        yield self.sdk(job)
        expected = (self.user.pw_uid, self.user.pw_gid)
        for rel in (
            "up",
            "up/one.txt",
            "raw.bin",
            "m",
            "m/a.txt",
            "m/b.txt",
            "d",
            "d/e",
            "d/e/f",
        ):
            self.assertEqual(self.owner(rel), expected, rel)
        self.assertEqual(self.owner("."), (0, 0))


class MalformedInputTests(E2BCase):
    """Malformed input is 400 ``invalid_argument``, never 500, and does nothing."""

    @inlineCallbacks
    def assert_invalid(self, procedure: str, raw: bytes, stream: bool = False) -> Any:
        result = yield self.rpc(procedure, None, stream=stream, raw=raw)
        status, code, message = _answer(result)
        if stream:
            self.assertEqual(
                (status, code), (200, "invalid_argument"), (procedure, raw[:80], result)
            )
        else:
            self.assertEqual(
                (status, code), (400, "invalid_argument"), (procedure, raw[:80], result)
            )
        self.assertTrue(
            re.search(r"code: (invalid_json|invalid_param)", message), message
        )
        return message

    @inlineCallbacks
    def test_deep_nesting(self) -> Any:
        """JSON nested 100,000 deep, unary and enveloped."""
        deep = b'{"path": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        yield self.assert_invalid("filesystem.Filesystem/Stat", deep)
        body = b'{"process": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        yield self.assert_invalid(
            "process.Process/Start",
            b"\x00" + len(body).to_bytes(4, "big") + body,
            stream=True,
        )

    @inlineCallbacks
    def test_huge_numbers(self) -> Any:
        """A 5,000-digit number (or digit string) in pid or depth."""
        digits = b"9" * 5000
        yield self.assert_invalid(
            "process.Process/SendInput", b'{"process": {"pid": ' + digits + b"}}"
        )
        yield self.assert_invalid(
            "process.Process/SendInput", b'{"process": {"pid": "' + digits + b'"}}'
        )
        yield self.assert_invalid(
            "filesystem.Filesystem/ListDir", b'{"path": ".", "depth": ' + digits + b"}"
        )
        yield self.assert_invalid(
            "filesystem.Filesystem/ListDir",
            b'{"path": ".", "depth": "' + digits + b'"}',
        )
        # Digits that are not ASCII digits are no number either.
        yield self.assert_invalid(
            "filesystem.Filesystem/ListDir", '{"path": ".", "depth": "²"}'.encode()
        )

    @inlineCallbacks
    def test_lone_surrogates(self) -> Any:
        """A lone surrogate in a path, or in Start's cmd, args or envs: nothing made, nothing run."""
        yield self.assert_invalid(
            "filesystem.Filesystem/MakeDir", b'{"path": "made\\udcff"}'
        )
        self.assertEqual(
            [n for n in os.listdir(self.base_dir) if n.startswith("made")], []
        )
        yield self.assert_invalid("filesystem.Filesystem/Stat", b'{"path": "\\ud800"}')
        marker = os.path.join(self.base_dir, "ran")
        for process in (
            {"cmd": "/bin/tou\ud800ch", "args": [marker]},
            {"cmd": "/bin/touch", "args": [marker, "\udcff"]},
            {"cmd": "/bin/touch", "args": [marker], "envs": {"X": "\ud800"}},
            {"cmd": "/bin/touch", "args": [marker], "envs": {"\ud800": "x"}},
        ):
            # json.dumps writes a lone surrogate as its \\u escape.
            body = json.dumps({"process": process}).encode()
            yield self.assert_invalid(
                "process.Process/Start",
                b"\x00" + len(body).to_bytes(4, "big") + body,
                stream=True,
            )
        self.assertFalse(os.path.exists(marker))

    @inlineCallbacks
    def test_other_encodings_and_duplicate_keys(self) -> Any:
        """UTF-16 and UTF-32 bodies, and a key given twice, are refused."""
        message = json.dumps({"path": "made-by-utf"})
        for encoding in ("utf-16", "utf-16-le", "utf-32", "utf-32-be"):
            yield self.assert_invalid(
                "filesystem.Filesystem/MakeDir", message.encode(encoding)
            )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "made-by-utf")))
        yield self.assert_invalid(
            "filesystem.Filesystem/MakeDir",
            b'{"path": "dup-a", "path": "dup-b"}',
        )
        self.assertEqual(
            [n for n in os.listdir(self.base_dir) if n.startswith("dup-")], []
        )

    @inlineCallbacks
    def test_bad_connect_timeout(self) -> Any:
        """A Connect-Timeout-Ms of a digit that is not ASCII ("²", byte B2) is invalid_argument."""
        body = envelope(_start("true"))
        head = (
            b"POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/connect+json\r\nConnect-Timeout-Ms: \xb2\r\n"
            b"Connection: close\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )

        def send() -> bytes:
            with socket.create_connection(
                ("127.0.0.1", self.e2b_port), timeout=10
            ) as s:
                s.sendall(head + body)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
                return out

        answer = yield self.sdk(send)
        self.assertTrue(answer.startswith(b"HTTP/1.1 200"), answer[:200])
        self.assertIn(b'"invalid_argument"', answer)
        self.assertIn(b"Connect-Timeout-Ms", answer)


class ContentTypeTests(E2BCase):
    """A Connect call with a Content-Type the protocol does not take is 415, and runs nothing."""

    @inlineCallbacks
    def test_unary_wrong_content_type(self) -> Any:
        """text/plain, form and multipart unary bodies are 415; nothing is made."""
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/connect+json",
            "application/proto",
        ):
            status, _, body = yield self.rpc(
                "filesystem.Filesystem/MakeDir",
                None,
                raw=b'{"path": "made-by-form"}',
                headers={"Content-Type": content_type},
            )
            self.assertEqual(status, 415, (content_type, body))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "made-by-form")))
        status, _, body = yield self.rpc(
            "filesystem.Filesystem/MakeDir",
            None,
            raw=b'{"path": "made-by-json"}',
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        self.assertEqual(status, 200, body)

    @inlineCallbacks
    def test_stream_wrong_content_type(self) -> Any:
        """A Start sent as application/json (not enveloped) is 415 and runs nothing."""
        marker = os.path.join(self.base_dir, "ran")
        status, _, _ = yield self.rpc(
            "process.Process/Start",
            None,
            raw=json.dumps(_start(f"touch {marker}")).encode(),
            headers={"Content-Type": "application/json"},
        )
        self.assertEqual(status, 415)
        self.assertFalse(os.path.exists(marker))


class ArgvAuditTests(E2BCase):
    """What ran is on record whichever door it came through (argv in the audit line)."""

    audit = True
    policy = {"defaults": {"audit": "all"}}

    @inlineCallbacks
    def test_start_records_the_argv(self) -> Any:
        """commands.run and pty.create through the door: their lines carry the argv, as HTTP's do."""

        def job() -> Any:
            self.sandbox().commands.run("echo audited")

        yield self.sdk(job)
        yield self.rpc(
            "process.Process/Start",
            {"process": {"cmd": "/bin/echo", "args": ["two", "words"]}},
            stream=True,
        )
        yield self.request("POST", "/process/start", {"command": "echo audited"})
        lines = self.audit_lines()
        starts = [
            r
            for r in lines
            if r.get("endpoint") == "process_start" and r.get("via") == "e2b"
        ]
        self.assertEqual(
            [r.get("argv") for r in starts],
            [["/bin/bash", "-l", "-c", "echo audited"], ["/bin/echo", "two", "words"]],
        )
        http = [
            r
            for r in lines
            if r.get("endpoint") == "process_start" and r["via"] == "http"
        ]
        self.assertEqual(http[0]["argv"], ["echo", "audited"])


class BinaryOutputTests(E2BCase):
    """Output that is not UTF-8 arrives as the bytes the command wrote, as envd sends them."""

    @inlineCallbacks
    def test_bytes_are_exact(self) -> Any:
        """printf '\\377\\376ok' arrives as FF FE 'ok', on stdout and stderr."""
        status, _, messages = yield self.rpc(
            "process.Process/Start",
            _start(
                "printf '\\377\\376ok'; printf '\\200\\351x' >&2; printf '\\342\\202'"
            ),
            stream=True,
        )
        self.assertEqual(status, 200)
        got: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        for _, message in messages:
            data = message.get("event", {}).get("data", {})
            for name, value in data.items():
                got[name] += base64.b64decode(value)
        self.assertEqual(got["stdout"], b"\xff\xfeok\xe2\x82")
        self.assertEqual(got["stderr"], b"\x80\xe9x")

    @inlineCallbacks
    def test_terminal_bytes_are_exact(self) -> Any:
        """A terminal's output arrives as the bytes written too (pty data events)."""
        started = self.rpc(
            "process.Process/Start",
            {
                "process": {"cmd": "/bin/bash"},
                "pty": {"size": {"cols": 80, "rows": 24}},
            },
            stream=True,
            headers={"Connect-Timeout-Ms": "10000"},
        )
        table = self.daemon.context.terminals.table
        for _ in range(100):
            if table.sessions:
                break
            yield self.sdk(time.sleep, 0.05)
        (session,) = table.sessions.values()
        yield self.rpc(
            "process.Process/SendInput",
            {
                "process": {"pid": session.pid},
                "input": {"pty": _b64(b"printf '\\377\\376ok\\n'; exit\n")},
            },
        )
        status, _, messages = yield started
        self.assertEqual(status, 200)
        got = b"".join(
            base64.b64decode(m["event"]["data"]["pty"])
            for _, m in messages
            if "data" in m.get("event", {})
        )
        self.assertIn(b"\xff\xfeok", got)
        self.assertNotIn("\ufffd".encode(), got)

    @inlineCallbacks
    def test_http_still_reads_text(self) -> Any:
        """The same output read through HTTP's process_output is text with U+FFFD, as before."""
        reply = yield self.request(
            "POST", "/process/start", {"command": "printf '\\377ok'"}
        )
        pid = json.loads(reply.body)["pid"]
        for _ in range(50):
            reply = yield self.request("GET", f"/process/{pid}/output")
            out = json.loads(reply.body)
            if out["state"] == "exited":
                break
            yield self.sdk(time.sleep, 0.1)
        self.assertEqual("".join(e["data"] for e in out["events"]), "\ufffdok")


class WatcherShareTests(E2BCase):
    """One identity cannot take every E2B watcher and lock the others out."""

    environ = {"ALICE": "alice-token", "BOB": "bob-token"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "alice", "token_env": "ALICE", "scopes": ["*"]},
                {"id": "bob", "token_env": "BOB", "scopes": ["*"]},
            ]
        },
        "endpoints": {"files_watch": {"limits": {"max_per_identity": 1}}},
    }

    @inlineCallbacks
    def test_second_watcher_of_one_identity(self) -> Any:
        """Alice's second CreateWatcher is refused with the setting named; Bob's works."""
        for name in ("a", "b"):
            os.mkdir(os.path.join(self.base_dir, name))
        answers = []
        for token, path in (
            ("alice-token", "a"),
            ("alice-token", "b"),
            ("bob-token", "b"),
        ):
            status, _, body = yield self.rpc(
                "filesystem.Filesystem/CreateWatcher",
                {"path": os.path.join(self.base_dir, path)},
                headers={"X-Access-Token": token},
            )
            answers.append((status, body))
        self.assertEqual([status for status, _ in answers], [200, 429, 200])
        self.assertIn("watcherId", answers[0][1])
        self.assertIn("max_per_identity", json.dumps(answers[1][1]))


def spooled_bytes(spool_dir: str) -> int:
    """
    The bytes of this process's open files in ``spool_dir``: the request
    bodies the daemon (in this process) holds there, unlinked or not.
    """
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        where = f"/proc/self/fd/{fd}"
        try:
            if os.readlink(where).startswith(spool_dir + "/"):
                total += os.stat(where).st_size
        except OSError:
            continue  # closed meanwhile
    return total


def send_body(
    port: int, head: bytes, size: int, spool_dir: str, chunked: bool = False
) -> tuple[bytes, int, int]:
    """
    Send ``head``, then a body of ``size`` bytes in 64 KiB pieces (chunked
    or not), stopping as soon as the daemon answers; then read the answer
    to its end.  Returns the answer, the body bytes sent by then, and the
    most the daemon held spooled meanwhile (blocking: run it in a thread).
    """
    piece = b"x" * 65536
    sent = most = 0
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head)
        while sent < size:
            readable, _, _ = select.select([s], [], [], 0.005)
            most = max(most, spooled_bytes(spool_dir))
            if readable:
                break
            data = piece[: size - sent]
            s.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            sent += len(data)
        else:
            if chunked:
                s.sendall(b"0\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out, sent, most


class PreAuthTests(E2BCase):
    """
    A caller the door would refuse is answered on its request's head, as
    the HTTP port answers 401 before a body: the daemon neither reads nor
    spools a big body a wrong key sends.
    """

    audit = True
    environ = {"T_OPS": "ops-secret", "T_READER": "reader-secret"}
    policy = {
        "auth": {
            "tokens": [
                {"id": "ops", "token_env": "T_OPS", "scopes": ["*"]},
                {
                    "id": "reader",
                    "token_env": "T_READER",
                    "scopes": ["core:read", "files:read"],
                },
            ]
        }
    }

    def setUp(self) -> Any:
        # Where the daemon spools request bodies (Twisted's temporary files).
        self.spool_dir = os.path.realpath(self.mktemp())
        os.makedirs(self.spool_dir)
        self.patch(tempfile, "tempdir", self.spool_dir)
        return super().setUp()

    @inlineCallbacks
    def test_refused_on_its_head(self) -> Any:
        """
        A 50 MB upload with a wrong key, none, a key without
        ``files:write``, or a chunked one; a big Connect call or
        control-plane call with a wrong key: 401 or 403 while the client is
        still sending, in the framing of the path, audited, nothing spooled
        nor written.  With the right key the upload is written.
        """
        size = 50_000_000
        upload = (
            b"POST /files?path=big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n%s"
            b"Connection: close\r\nContent-Type: application/octet-stream\r\n%s\r\n"
        )
        length = b"Content-Length: %d\r\n" % size
        cases = [
            (upload % (b"X-Access-Token: wrong\r\n", length), False, 401),
            (upload % (b"", length), False, 401),
            (upload % (b"X-Access-Token: reader-secret\r\n", length), False, 403),
            (
                upload
                % (b"X-Access-Token: wrong\r\n", b"Transfer-Encoding: chunked\r\n"),
                True,
                401,
            ),
        ]
        for head, chunked, wanted in cases:
            answer, sent, most = yield self.sdk(
                send_body, self.e2b_port, head, size, self.spool_dir, chunked
            )
            status_line, _, body = answer.partition(b"\r\n\r\n")
            self.assertTrue(
                status_line.startswith(b"HTTP/1.1 %d " % wanted), (head, answer[:300])
            )
            self.assertEqual(json.loads(body)["code"], wanted, body)
            self.assertLess(sent, size, head)
            self.assertEqual(most, 0, head)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "big.bin")))

        connect = (
            b"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"X-Access-Token: wrong\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n"
        )
        control = (
            b"POST /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"X-API-Key: wrong\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n"
        )
        for head, code in ((connect, "unauthenticated"), (control, 401)):
            answer, sent, most = yield self.sdk(
                send_body, self.e2b_port, head, 10_000_000, self.spool_dir
            )
            status_line, _, body = answer.partition(b"\r\n\r\n")
            self.assertTrue(status_line.startswith(b"HTTP/1.1 401 "), answer[:300])
            self.assertEqual(json.loads(body)["code"], code, body)
            self.assertLess(sent, 10_000_000, head)
            self.assertEqual(most, 0, head)

        refused = [
            (r["path"], r["status"], r["code"])
            for r in self.audit_lines()
            if r.get("via") == "e2b"
        ]
        unauthorized = ("/files", 401, "unauthorized")
        self.assertEqual(
            refused,
            [
                unauthorized,
                unauthorized,
                ("/files", 403, "missing_scope"),
                unauthorized,
                ("/filesystem.Filesystem/Stat", 401, "unauthorized"),
                ("/v2/sandboxes", 401, "unauthorized"),
            ],
        )

        ok = upload % (b"X-Access-Token: ops-secret\r\n", b"Content-Length: %d\r\n")
        answer, sent, _ = yield self.sdk(
            send_body,
            self.e2b_port,
            ok.replace(b"big.bin", b"ok.bin") % 3_000_000,
            3_000_000,
            self.spool_dir,
        )
        self.assertTrue(answer.startswith(b"HTTP/1.1 200 "), answer[:300])
        self.assertEqual(sent, 3_000_000)
        with open(os.path.join(self.base_dir, "ok.bin"), "rb") as f:
            self.assertEqual(f.read(), b"x" * 3_000_000)
