"""
An error answer means nothing happened (SPEC §6, §7): for the write
routes, a request refused after part of its work was done leaves no trace
of that work: no directory made for it, no temporary file, no old file
replaced or removed, no agent session or process left behind.

Each case sends the bad request to a real daemon, checks the SPEC §6
code, then looks at the disk, the listings and the process table.
"""

from __future__ import annotations

import io
import os
import zipfile
from typing import Any

import psutil
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from tests.agents.test_agents import FAKE, AgentsTestCase
from tests.helpers import DaemonTestCase
from tests.security.files import b64, tar_gz, tree


class FileSideEffectTests(DaemonTestCase):
    """File routes refused part-way leave the tree as it was."""

    def assert_refused(self, reply: Any, status: int, code: str) -> None:
        self.assertEqual(
            (reply.status, reply.json().get("code")), (status, code), reply.body
        )

    @inlineCallbacks
    def test_upload_if_match_on_missing_file_makes_no_parents(self) -> Any:
        """
        An upload whose ``If-Match`` cannot hold (no such file) is 412 and
        creates none of the missing parent directories.
        """
        before = tree(self.base_dir)
        for route in ("/upload", "/files/upload-stream"):
            reply = yield self.request(
                "POST",
                route,
                {
                    "path": "new/deeper/f.txt",
                    "content_base64": b64(b"hi"),
                    "if_match": '"1-2-3"',
                },
            )
            self.assert_refused(reply, 412, "precondition_failed")
            self.assertEqual(tree(self.base_dir), before, route)

    @inlineCallbacks
    def test_name_too_long_makes_no_parents(self) -> Any:
        """
        A path with a component longer than the file system takes is 400
        ``invalid_path``, and the parents before it are not left created
        (mkdir, upload, and a too-long file name at the end).
        """
        before = tree(self.base_dir)
        long = "x" * 300
        cases = [
            ("/files/mkdir", {"path": f"new/{long}/c"}),
            ("/files/mkdir", {"path": f"new/sub/{long}"}),
            ("/upload", {"path": f"new/{long}/f", "content_base64": b64(b"a")}),
            ("/upload", {"path": f"new/sub/{long}", "content_base64": b64(b"a")}),
            # Under 256 characters, over 255 bytes (found by schemathesis: a 500).
            ("/files/mkdir", {"path": "new/" + "é" * 200}),
            ("/files/archive", {"paths": ["é" * 200]}),
        ]
        for route, body in cases:
            reply = yield self.request("POST", route, body)
            self.assert_refused(reply, 400, "invalid_path")
            shown = str(body.get("path") or body.get("paths"))[:20]
            self.assertEqual(tree(self.base_dir), before, (route, shown))

    @inlineCallbacks
    def test_delete_with_a_bad_path_deletes_nothing(self) -> Any:
        """
        ``DELETE /files`` with a body ``path`` that is not a string, an
        empty ``?path=`` beside a body path, or a body path that is not the
        query's, is 400 and deletes nothing (it used to pass over one and
        delete the other); the same path in both places is one path.
        """
        with open(os.path.join(self.base_dir, "keep.txt"), "w") as f:
            f.write("x")
        before = tree(self.base_dir)
        cases = [
            ("/files?path=keep.txt", {"path": ["not", "a", "string"]}),
            ("/files?path=", {"path": "keep.txt"}),
        ]
        for route, body in cases:
            reply = yield self.request("DELETE", route, body)
            self.assert_refused(reply, 400, "invalid_param")
            self.assertEqual(tree(self.base_dir), before, route)
        # Two paths that disagree (an empty one included): neither is deleted.
        for other in ("", "other.txt"):
            reply = yield self.request(
                "DELETE", "/files?path=keep.txt", {"path": other}
            )
            self.assert_refused(reply, 400, "duplicate_parameter")
            self.assertEqual(tree(self.base_dir), before, other)
        reply = yield self.request(
            "DELETE", "/files?path=keep.txt", {"path": "keep.txt"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotIn("keep.txt", tree(self.base_dir))

    @inlineCallbacks
    def test_move_into_itself_makes_no_parents(self) -> Any:
        """
        Moving a directory below itself is 400, and the missing directories
        on the destination's way are not left inside the source.
        """
        os.makedirs(os.path.join(self.base_dir, "d", "kept"))
        before = tree(self.base_dir)
        reply = yield self.request(
            "POST", "/files/move", {"source": "d", "destination": "d/new/deeper/x"}
        )
        self.assert_refused(reply, 400, "invalid_param")
        self.assertEqual(tree(self.base_dir), before)

    @inlineCallbacks
    def test_extract_refused_member_makes_no_destination(self) -> Any:
        """
        An archive with a member refused by the check (a link pointing out,
        a duplicate, a member over an existing file) is refused before its
        destination directory, or any parent of it, is created.
        """
        before = tree(self.base_dir)
        archives = [
            (
                tar_gz([("ok.txt", b"x"), ("l", ("link", "../../../etc"))]),
                403,
                "path_not_allowed",
            ),
            (tar_gz([("a", b"1"), ("a", b"2")]), 403, "path_not_allowed"),
            (tar_gz([("f", b"1"), ("f/g", b"2")]), 403, "path_not_allowed"),
        ]
        for data, status, code in archives:
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": b64(data),
                    "format": "tar.gz",
                    "destination": "out/dest",
                },
            )
            self.assert_refused(reply, status, code)
            self.assertEqual(tree(self.base_dir), before)

    @inlineCallbacks
    def test_extract_policy_refusal_makes_no_destination(self) -> Any:
        """A member the policy denies is refused before the destination is created."""
        yield self.daemon.stop()
        self.policy = {
            "endpoints": {"group:file_ops": {"paths": {"deny": ["**/*.key"]}}}
        }
        yield self.start()
        before = tree(self.base_dir)
        data = tar_gz([("fine.txt", b"x"), ("sub/secret.key", b"y")])
        reply = yield self.request(
            "POST",
            "/files/extract",
            {
                "content_base64": b64(data),
                "format": "tar.gz",
                "destination": "new/dest",
            },
        )
        self.assert_refused(reply, 403, "path_denied")
        self.assertEqual(tree(self.base_dir), before)

    @inlineCallbacks
    def test_extract_corrupt_member_keeps_old_files(self) -> Any:
        """
        A zip whose second member fails its CRC while being written is 400
        and leaves the destination as it was: the file the first member
        replaced keeps its old content, and no directory made for the
        members (nor the destination itself) remains.
        """
        dest = os.path.join(self.base_dir, "dest")
        os.mkdir(dest)
        with open(os.path.join(dest, "a.txt"), "wb") as f:
            f.write(b"old content")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("a.txt", b"new content")
            zf.writestr("sub/deep/b.txt", b"BBBBBBBBBBBBBBBB")
        data = buffer.getvalue().replace(b"BBBBBBBBBBBBBBBB", b"CCCCCCCCCCCCCCCC")
        before = tree(self.base_dir)
        for destination in ("dest", "fresh/dest"):
            reply = yield self.request(
                "POST",
                "/files/extract",
                {
                    "content_base64": b64(data),
                    "format": "zip",
                    "destination": destination,
                    "overwrite": True,
                },
            )
            self.assert_refused(reply, 400, "invalid_param")
            self.assertEqual(tree(self.base_dir), before, destination)
            with open(os.path.join(dest, "a.txt"), "rb") as f:
                self.assertEqual(f.read(), b"old content", destination)


def agent_processes() -> list[psutil.Process]:
    """This process's live descendants running the fake agent."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if FAKE in " ".join(child.cmdline()) and child.status() != "zombie":
                found.append(child)
        except psutil.Error:
            continue
    return found


class AgentSideEffectTests(AgentsTestCase):
    """A session create refused after the agent started leaves no session and no agent."""

    @inlineCallbacks
    def assert_nothing_left(self) -> Any:
        reply = yield self.request("GET", "/agents/sessions")
        self.assertEqual(reply.json()["sessions"], [])
        for _ in range(50):
            if not agent_processes():
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(agent_processes(), [])

    @inlineCallbacks
    def test_bad_prompt_leaves_no_session(self) -> Any:
        """
        A create whose ``prompt`` is malformed (not a string or blocks, an
        unknown block type, a file that does not exist) is 400/404 with no
        session listed and no agent running.
        """
        cases = [
            (42, 400, "invalid_param"),
            ([{"type": "nonsense"}], 400, "invalid_param"),
            ("hi", 404, "not_found"),
        ]
        for prompt, status, code in cases:
            body: dict[str, Any] = {"prompt": prompt}
            if status == 404:
                body["files"] = ["no-such-file.txt"]
            reply = yield self.create(**body)
            self.assertEqual(
                (reply.status, reply.json().get("code")), (status, code), reply.body
            )
            yield self.assert_nothing_left()

    @inlineCallbacks
    def test_prompt_the_agent_cannot_take_leaves_no_session(self) -> Any:
        """
        A create with an image block for an agent whose
        ``promptCapabilities.image`` is off is 400, known only after the
        handshake: the session is closed and forgotten, the agent ended.
        """
        reply = yield self.create(
            prompt=[{"type": "image", "data": b64(b"png"), "mimeType": "image/png"}]
        )
        self.assertEqual(
            (reply.status, reply.json().get("code")), (400, "invalid_param"), reply.body
        )
        yield self.assert_nothing_left()

    @inlineCallbacks
    def test_load_the_agent_refuses_ends_the_agent(self) -> Any:
        """
        ``session/load`` on an agent that cannot load sessions is refused
        with a SPEC §6 code and ends the agent; the session stays listed as
        ``failed`` with that error, as SPEC §15 says of a failed handshake
        (its logs tell why), and nothing of it runs.
        """
        reply = yield self.request(
            "POST",
            "/agents/sessions/load",
            {"agent": "fake-bare", "acp_session_id": "fake-nope"},
        )
        self.assertGreaterEqual(reply.status, 400, reply.body)
        code = reply.json()["code"]
        listed = yield self.request("GET", "/agents/sessions")
        [session] = listed.json()["sessions"]
        described = yield self.wait_state(session["session_id"], ("failed",))
        self.assertEqual(described["error"]["code"], code)
        for _ in range(50):
            if not agent_processes():
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertEqual(agent_processes(), [])
