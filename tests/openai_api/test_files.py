"""
``client.files`` with the official ``openai`` SDK: files stored under the
daemon's state directory, owned, bounded, and gone when refused or deleted.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import httpx
from twisted.internet.defer import fail, inlineCallbacks, succeed
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import ApiError
from sandboxd.openai_api.blobs import FileStore
from tests.openai_api.sdk import OpenAICase, caught, openai_policy
from tests.test_guard import tmpfs


def state_of(case: OpenAICase) -> str:
    """Give the case's daemon a state directory of its own; its path."""
    state = os.path.join(case.base_dir, "state")
    case.daemon.context.state_dir = state
    return state


def stored(state: str) -> list[str]:
    """The names in the file store's directory."""
    root = os.path.join(state, "openai", "files")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


class FilesTests(OpenAICase):
    """Create, list, read and delete files."""

    policy = {
        **openai_policy(),
        "endpoints": {
            "group:agents": {"audit": "all"},
            "agents_files_create": {"limits": {"max_bytes": 4096, "max_files": 3}},
        },
    }

    @inlineCallbacks
    def test_round_trip(self) -> Any:
        """
        A multipart upload (the SDK's) and a JSON one are stored as bytes
        on disk with their record, listed, read back byte for byte, hidden
        from another identity, and removed from disk by delete.
        """
        state = state_of(self)
        client = self.client()
        payload = bytes(range(256)) * 10

        def run() -> Any:
            made = client.files.create(file=("data.bin", payload), purpose="user_data")
            as_json = httpx.post(
                self.daemon.url + "/v1/files",
                headers={"Authorization": "Bearer u-token"},
                json={
                    "purpose": "user_data",
                    "filename": "dir/notes.txt",
                    "data": base64.b64encode(b"hello").decode(),
                },
            )
            listed = [f.id for f in client.files.list()]
            content = client.files.content(made.id).read()
            again = client.files.retrieve(made.id)
            theirs = caught(lambda: self.client("o-token").files.retrieve(made.id))
            on_disk = stored(state)
            reader = caught(
                lambda: self.client("r-token").files.create(
                    file=("r", b"r"), purpose="user_data"
                )
            )
            deleted = client.files.delete(made.id)
            gone = caught(lambda: client.files.retrieve(made.id))
            return (
                made,
                as_json,
                listed,
                content,
                again,
                theirs,
                on_disk,
                {
                    "reader": reader,
                    "deleted": deleted,
                    "gone": gone,
                },
            )

        made, as_json, listed, content, again, theirs, on_disk, rest = yield self.sdk(
            run
        )
        deleted, gone, reader = rest["deleted"], rest["gone"], rest["reader"]
        self.assertEqual(
            (reader.status_code, reader.body["code"]), (403, "missing_scope")
        )
        audited = [
            (x["endpoint"], x["via"], x["status"])
            for x in self.audit_lines()
            if x.get("endpoint", "").startswith("agents_files")
        ]
        self.assertIn(("agents_files_create", "openai", 200), audited)
        self.assertIn(("agents_files_create", "openai", 403), audited)
        self.assertIn(("agents_files_content", "openai", 200), audited)
        self.assertTrue(made.id.startswith("file-"))
        self.assertEqual(
            (made.bytes, made.filename, made.purpose, made.status),
            (len(payload), "data.bin", "user_data", "processed"),
        )
        self.assertEqual(as_json.status_code, 200, as_json.text)
        other = as_json.json()
        self.assertEqual((other["filename"], other["bytes"]), ("notes.txt", 5))
        self.assertEqual(listed, [other["id"], made.id])
        self.assertEqual(content, payload)
        self.assertEqual(again.id, made.id)
        self.assertEqual(theirs.status_code, 404)
        self.assertEqual(
            on_disk,
            sorted(f"{i}.{x}" for i in (made.id, other["id"]) for x in ("bin", "json")),
        )
        with open(os.path.join(state, "openai", "files", other["id"] + ".json")) as f:
            self.assertEqual(json.load(f)["owner"], "user")
        self.assertTrue(deleted.deleted)
        self.assertEqual(gone.status_code, 404)
        self.assertEqual(
            stored(state), sorted(f"{other['id']}.{x}" for x in ("bin", "json"))
        )

    @inlineCallbacks
    def test_form_filename_field_and_local_label(self) -> Any:
        """
        A ``filename`` field of the form names the file over its part's (as
        agent-sandbox-server's form); the files routes and the runtimes
        list answer ``X-Agent-Sandbox-Local: 1`` as the door's others do.
        """
        state_of(self)
        auth = {"Authorization": "Bearer u-token"}

        def run() -> Any:
            named = httpx.post(
                self.daemon.url + "/v1/files",
                headers=auth,
                data={"purpose": "user_data", "filename": "named.txt"},
                files={"file": ("x.txt", b"abc")},
            )
            listed = httpx.get(self.daemon.url + "/v1/files", headers=auth)
            runtimes = httpx.get(self.daemon.url + "/v1/agents/runtimes", headers=auth)
            return named, listed, runtimes

        named, listed, runtimes = yield self.sdk(run)
        self.assertEqual(named.status_code, 200, named.text)
        self.assertEqual(
            (named.json()["filename"], named.json()["bytes"]), ("named.txt", 3)
        )
        for answer in (named, listed, runtimes):
            self.assertEqual(answer.status_code, 200)
            self.assertEqual(answer.headers.get("X-Agent-Sandbox-Local"), "1")

    @inlineCallbacks
    def test_names_kept_whole(self) -> Any:
        """
        A name beyond ASCII downloads under its own name (``filename*`` in
        UTF-8, RFC 6266, beside an ASCII ``filename``), and a backslash,
        a legal character of a POSIX name, does not cut it.
        """
        state_of(self)
        client = self.client()

        def run() -> Any:
            out = []
            for name in ("é中文.txt", "back\\slash.txt"):
                made = client.files.create(file=(name, b"x"), purpose="user_data")
                content = client.files.with_raw_response.content(made.id)
                out.append(
                    (
                        client.files.retrieve(made.id).filename,
                        content.headers["content-disposition"],
                    )
                )
            return out

        named = yield self.sdk(run)
        self.assertEqual(
            named,
            [
                (
                    "é中文.txt",
                    'attachment; filename="___.txt"; '
                    "filename*=UTF-8''%C3%A9%E4%B8%AD%E6%96%87.txt",
                ),
                (
                    "back\\slash.txt",
                    'attachment; filename="back_slash.txt"; '
                    "filename*=UTF-8''back%5Cslash.txt",
                ),
            ],
        )


class FileLimitTests(OpenAICase):
    """The per-file and per-identity bounds."""

    policy = {
        **openai_policy(),
        "endpoints": {
            "agents_files_create": {"limits": {"max_bytes": 1024, "max_files": 2}}
        },
    }

    @inlineCallbacks
    def test_refusals_leave_nothing(self) -> Any:
        """
        A file over ``max_bytes`` is 413, a wrong purpose 400, the file past
        ``max_files`` 400: none of them leaves a byte on disk or a record.
        """
        state = state_of(self)
        client = self.client()

        def run() -> Any:
            big = caught(
                lambda: client.files.create(
                    file=("a", b"x" * 2048), purpose="user_data"
                )
            )
            purpose = caught(
                lambda: client.files.create(file=("a", b"x"), purpose="assistants")
            )
            first = client.files.create(file=("a", b"x"), purpose="user_data")
            second = client.files.create(file=("b", b"y"), purpose="user_data")
            third = caught(
                lambda: client.files.create(file=("c", b"z"), purpose="user_data")
            )
            return big, purpose, [first.id, second.id], third, list(client.files.list())

        big, purpose, kept, third, listed = yield self.sdk(run)
        self.assertEqual(
            (big.status_code, big.body["code"]), (413, "payload_too_large")
        )
        self.assertEqual((purpose.status_code, purpose.body["param"]), (400, "purpose"))
        self.assertEqual(third.status_code, 400)
        self.assertIn("max_files", third.body["setting"])
        self.assertEqual(sorted(f.id for f in listed), sorted(kept))
        self.assertEqual(
            stored(state), sorted(f"{i}.{x}" for i in kept for x in ("bin", "json"))
        )


class ReadOnlyStateTests(OpenAICase):
    """A daemon whose state directory is on a read-only disk."""

    @inlineCallbacks
    def test_nothing_stored_is_listed_and_storing_says_why(self) -> Any:
        """
        Listing, reading and deleting need no store on disk: an empty list
        and 404s. Storing a file is a 503 ``unavailable`` naming the
        directory and what to do, never an internal error.
        """
        state = state_of(self)
        os.makedirs(state)
        tmpfs(self, state, "1m", read_only=True)
        client = self.client()

        def run() -> Any:
            return (
                client.files.list().data,
                caught(lambda: client.files.retrieve("file-abc")),
                caught(lambda: client.files.delete("file-abc")),
                caught(
                    lambda: client.files.create(
                        file=("a.txt", b"a"), purpose="user_data"
                    )
                ),
            )

        listed, retrieved, deleted, created = yield self.sdk(run)
        self.assertEqual(listed, [])
        self.assertEqual((retrieved.status_code, deleted.status_code), (404, 404))
        self.assertEqual(created.status_code, 503)
        self.assertEqual(created.body["code"], "unavailable")
        self.assertIn("Read-only file system", created.body["message"])
        self.assertIn(state, created.body["message"])
        self.assertIn("--state-dir", created.body["message"])


class FileStoreTests(SynchronousTestCase):
    """The store on disk, read back by a new daemon."""

    def test_index_read_back(self) -> None:
        """
        A new store over the same directory lists the files a previous one
        kept, with their owners; a record without its bytes, or bytes
        without a record, is not listed.
        """
        root = self.mktemp()
        first = FileStore(root)
        run = lambda f, *a: succeed(f(*a))  # noqa: E731 - the thread pool, inline
        self.successResultOf(first.ready(run))
        kept = self.successResultOf(
            first.add(run, "alice", "a.txt", "user_data", b"abc")
        )
        self.successResultOf(first.add(run, "bob", "b.txt", "user_data", b"de"))
        with open(os.path.join(root, "file-orphan.bin"), "wb") as f:
            f.write(b"no record")
        broken = self.successResultOf(first.add(run, "alice", "c", "user_data", b"x"))
        os.unlink(first.path(broken))
        second = FileStore(root)
        self.successResultOf(second.ready(run))
        self.assertEqual(second.find("alice", kept["id"]), kept)
        self.assertIsNone(second.find("bob", kept["id"]))
        self.assertEqual(second.usage("alice"), (1, 3))
        self.assertEqual(second.usage("bob"), (1, 2))

    def test_a_store_that_cannot_be_made_says_where(self) -> None:
        """
        A state directory the daemon cannot write is a 500 naming it, for
        the operator to fix, and the next call tries again.
        """
        blocker = self.mktemp()
        with open(blocker, "w"):
            pass
        root = os.path.join(blocker, "openai", "files")
        store = FileStore(root)

        def run(f: Any, *a: Any) -> Any:
            try:
                return succeed(f(*a))
            except Exception as e:
                return fail(e)

        failure = self.failureResultOf(store.ready(run), ApiError)
        self.assertEqual(failure.value.status, 500)
        self.assertIn(blocker, failure.value.message)
        os.unlink(blocker)
        self.successResultOf(store.ready(run))
