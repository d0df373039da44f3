"""
``files_watch`` (SPEC §7.3, §9): inotify changes as a resumable SSE stream.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import typing
from typing import Any
from unittest import SkipTest

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from sandboxd.files import watch as watch_module
from tests.routes.test_files import FilesCase


class _Collect(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.waiters: list[tuple[bytes, Deferred[None]]] = []
        self.done: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        for needle, d in list(self.waiters):
            if needle in self.data:
                self.waiters.remove((needle, d))
                d.callback(None)

    def wait_for(self, needle: bytes) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        if needle in self.data:
            d.callback(None)
        else:
            self.waiters.append((needle, d))
        return d

    def connectionLost(self, reason: Any = None) -> None:
        self.done.callback(None)

    def events(self) -> list[tuple[int | None, str, Any]]:
        out = []
        for block in self.data.decode().split("\n\n"):
            fields = dict(
                line.split(": ", 1)
                for line in block.splitlines()
                if ": " in line and not line.startswith(":")
            )
            if "event" in fields:
                out.append(
                    (
                        int(fields["id"]) if "id" in fields else None,
                        fields["event"],
                        json.loads(fields["data"]),
                    )
                )
        return out


class StreamCase(FilesCase):
    """A daemon and a way to open a watch stream on it."""

    @inlineCallbacks
    def open_stream(self, query: str, headers: dict[str, str] | None = None) -> Any:
        agent = Agent(reactor)
        h = Headers({k: [v] for k, v in (headers or {}).items()})
        response = yield agent.request(
            b"GET", f"{self.daemon.url}/files/watch?{query}".encode(), h
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(
            response.headers.getRawHeaders("content-type"), ["text/event-stream"]
        )
        collector = _Collect()
        response.deliverBody(collector)
        self.addCleanup(
            lambda: (
                response._transport.stopProducing()
                if hasattr(response, "_transport")
                else None
            )
        )
        yield collector.wait_for(
            b": watching" if "follow=true" in query else b"event: ready"
        )
        return collector, response

    def close(self, response: Any) -> None:
        response._transport.loseConnection()


class WatchTests(StreamCase):
    @inlineCallbacks
    def test_events_and_resume(self) -> Any:
        """create, modify (debounced), move and delete arrive with ids; Last-Event-ID resumes after one."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, response = yield self.open_stream("path=w&follow=true")
        path = os.path.join(self.base_dir, "w", "a.txt")
        with open(path, "wb") as f:
            for _ in range(20):
                f.write(b"x")
                f.flush()
        yield c.wait_for(b"created")
        os.rename(path, path + ".new")
        yield c.wait_for(b"moved")
        os.unlink(path + ".new")
        yield c.wait_for(b"deleted")
        events = c.events()
        kinds = [e[1] for e in events]
        self.assertEqual(kinds[0], "created")
        self.assertIn("moved", kinds)
        self.assertEqual(kinds[-1], "deleted")
        self.assertLessEqual(kinds.count("modified"), 2)
        moved = next(e for e in events if e[1] == "moved")[2]
        self.assertEqual((moved["path"], moved["dest"]), (path, path + ".new"))
        ids = [e[0] for e in events]
        self.assertEqual(ids, sorted(ids))
        c.transport = None
        response._transport.loseConnection()
        c2, response2 = yield self.open_stream(
            "path=w&follow=true", {"Last-Event-ID": str(ids[0])}
        )
        yield c2.wait_for(b"deleted")
        self.assertEqual([e[0] for e in c2.events()], ids[1:])
        response2._transport.loseConnection()
        yield deferLater(reactor, 0.05, lambda: None)

    @inlineCallbacks
    def test_a_new_watch_starts_now(self) -> Any:
        """
        A watch opened without a cursor reports only what changes after it
        opened, in either form, although the shared watch another client
        held a moment before kept the earlier changes: a file made, or
        removed, just before is not told as new.  A client that sends a
        cursor still resumes.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        first, response = yield self.open_stream("path=w&follow=true")
        with open(os.path.join(self.base_dir, "w", "before.txt"), "w"):
            pass
        yield first.wait_for(b"before.txt")
        [(cursor, _, _), *_] = first.events()
        self.close(response)
        yield deferLater(reactor, 0.05, lambda: None)
        # Removed just before the next watches open, while its event may
        # still be held back for the debounce: before them too.
        os.unlink(os.path.join(self.base_dir, "w", "before.txt"))
        c, response = yield self.open_stream("path=w&follow=true")
        seed, _ = yield self.open_stream("path=w&timeout=30")
        resumed, resumed_response = yield self.open_stream(
            "path=w&follow=true", {"Last-Event-ID": str(cursor - 1)}
        )
        with open(os.path.join(self.base_dir, "w", "after.txt"), "w"):
            pass
        yield c.wait_for(b"after.txt")
        yield seed.wait_for(b"after.txt")
        yield resumed.wait_for(b"after.txt")
        self.assertEqual(
            [
                (name, os.path.basename(data["path"]))
                for _, name, data in c.events()
                if name != "modified"
            ],
            [("created", "after.txt")],
        )
        self.assertEqual(
            [
                (name, os.path.basename(data["path"]))
                for _, name, data in seed.events()
                if data.get("type") != "modified"
            ],
            [("ready", "w"), ("change", "after.txt")],
        )
        self.assertEqual(
            [
                (name, os.path.basename(data["path"]))
                for _, name, data in resumed.events()
                if name != "modified"
            ],
            [
                ("created", "before.txt"),
                ("deleted", "before.txt"),
                ("created", "after.txt"),
            ],
        )
        self.close(response)
        self.close(resumed_response)
        yield deferLater(reactor, 0.05, lambda: None)

    @inlineCallbacks
    def test_resume_id_of_an_earlier_watch_gets_a_gap(self) -> Any:
        """
        A Last-Event-ID from a watch that no longer exists (the daemon
        restarted, or the client stayed away past the idle close) starts
        the new watch's stream with a gap, then its first changes: none of
        them is taken for one the client already saw.
        """
        os.mkdir(os.path.join(self.base_dir, "r"))
        c, response = yield self.open_stream(
            "path=r&follow=true", {"Last-Event-ID": "10"}
        )
        for name in ("a", "b"):
            with open(os.path.join(self.base_dir, "r", name), "wb"):
                pass
        yield c.wait_for(b"/r/b")
        events = c.events()
        self.assertEqual(events[0][1], "gap")
        self.assertEqual(events[0][2]["from"], 11)
        created = [e for e in events if e[1] == "created"]
        self.assertEqual([os.path.basename(e[2]["path"]) for e in created], ["a", "b"])
        assert created[0][0] is not None
        self.assertEqual(events[0][2]["to"], created[0][0] - 1)
        response._transport.loseConnection()
        yield deferLater(reactor, 0.05, lambda: None)

    @inlineCallbacks
    def test_attribute_changes_are_not_events(self) -> Any:
        """
        A chmod is none of this stream's four events (the watch hears it
        for the E2B door): only the file made after it is shown.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        with open(os.path.join(self.base_dir, "w", "a.txt"), "w"):
            pass
        c, response = yield self.open_stream("path=w&follow=true")
        os.chmod(os.path.join(self.base_dir, "w", "a.txt"), 0o600)
        yield deferLater(reactor, 0.3, lambda: None)
        with open(os.path.join(self.base_dir, "w", "b.txt"), "w"):
            pass
        yield c.wait_for(b"b.txt")
        self.assertEqual([e[1] for e in c.events()], ["created"])
        self.close(response)

    def shown(self, c: _Collect, top: str) -> list[tuple[str, str, str | None]]:
        """The stream's events as (event, path below ``top``, dest below it)."""

        def below(p: str | None) -> str | None:
            return None if p is None else os.path.relpath(p, top)

        return [
            (name, str(below(data["path"])), below(data.get("dest")))
            for _, name, data in c.events()
        ]

    @inlineCallbacks
    def test_a_removed_tree_reports_its_files(self) -> Any:
        """
        ``rm -rf``'s deletions of files whose directory has gone too by the
        time they are sent are reported, deepest first, as they happened.
        """
        top = os.path.join(self.base_dir, "w")
        os.makedirs(os.path.join(top, "p", "q"))
        with open(os.path.join(top, "p", "q", "f.txt"), "w"):
            pass
        c, response = yield self.open_stream("path=w&recursive=true&follow=true")
        shutil.rmtree(os.path.join(top, "p"))
        yield c.wait_for(b'/p"')
        self.assertEqual(
            self.shown(c, top),
            [
                ("deleted", "p/q/f.txt", None),
                ("deleted", "p/q", None),
                ("deleted", "p", None),
            ],
        )
        self.close(response)

    @inlineCallbacks
    def test_directories_renamed_and_moved_in_and_out(self) -> Any:
        """
        A recursive watch goes on reporting what happens in a directory
        renamed within the tree (by its new name), in one moved in from
        outside, and stops at one moved out.
        """
        top = os.path.join(self.base_dir, "w")
        outside = os.path.join(self.base_dir, "outside")
        os.makedirs(os.path.join(top, "a", "b"))
        os.makedirs(os.path.join(outside, "m", "n"))
        c, response = yield self.open_stream("path=w&recursive=true&follow=true")
        os.rename(os.path.join(top, "a"), os.path.join(top, "a2"))
        yield c.wait_for(b"moved")
        with open(os.path.join(top, "a2", "b", "f.txt"), "w"):
            pass
        yield c.wait_for(b"f.txt")
        os.rename(os.path.join(outside, "m"), os.path.join(top, "m"))
        yield c.wait_for(b'/m"')
        # The watches below it are added a turn later.
        yield deferLater(reactor, 0.2, lambda: None)
        with open(os.path.join(top, "m", "n", "g.txt"), "w"):
            pass
        yield c.wait_for(b"g.txt")
        os.rename(os.path.join(top, "a2"), os.path.join(outside, "gone"))
        yield deferLater(reactor, 0.3, lambda: None)
        with open(os.path.join(outside, "gone", "b", "h.txt"), "w"):
            pass
        with open(os.path.join(top, "last.txt"), "w"):
            pass
        yield c.wait_for(b"last.txt")
        self.assertEqual(
            self.shown(c, top),
            [
                ("moved", "a", "a2"),
                ("created", "a2/b/f.txt", None),
                ("created", "m", None),
                ("created", "m/n/g.txt", None),
                ("moved", "a2", None),
                ("created", "last.txt", None),
            ],
        )
        self.close(response)

    @inlineCallbacks
    def test_kernel_queue_overflow_is_said_and_the_watch_goes_on(self) -> Any:
        """
        More changes than the kernel queues for one read (the daemon busy
        meanwhile): the events it dropped cannot be told, so the stream says
        ``overflow`` with the watched directory, for the client to list it
        again; the watch goes on, below a directory made while events were
        being dropped too.
        """
        with open("/proc/sys/fs/inotify/max_queued_events") as f:
            queued = int(f.read())
        if queued > 200_000:
            raise SkipTest(f"the kernel queues {queued} inotify events a watch")
        top = os.path.join(self.base_dir, "w")
        os.mkdir(top)
        c, response = yield self.open_stream("path=w&recursive=true&follow=true")
        # The reactor does not read while this runs: two names in turn,
        # since the kernel folds an event identical to the one before it.
        paths = [os.path.join(top, "a"), os.path.join(top, "b")]
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT) for p in paths]
        for i in range(queued + 10):
            os.write(fds[i % 2], b"x")
        for fd in fds:
            os.close(fd)
        os.mkdir(os.path.join(top, "made-unseen"))
        yield c.wait_for(b"event: overflow")
        [overflow] = [e for e in c.events() if e[1] == "overflow"]
        self.assertEqual(
            overflow[2], {"event": "overflow", "path": top, "type": "directory"}
        )
        with open(os.path.join(top, "made-unseen", "after.txt"), "w"):
            pass
        yield c.wait_for(b"after.txt")
        self.close(response)

    @inlineCallbacks
    def test_directories_gone_at_once_do_not_end_the_watch(self) -> Any:
        """
        A directory removed or renamed before its watch could be added (a
        build's mkdir followed at once by rmdir or mv) is reported, and the
        watch goes on: later files are reported, the renamed directory's too.
        """
        top = os.path.join(self.base_dir, "w")
        os.makedirs(top)
        c, response = yield self.open_stream("path=w&recursive=true&follow=true")
        os.mkdir(os.path.join(top, "gone"))
        os.rmdir(os.path.join(top, "gone"))
        os.mkdir(os.path.join(top, "quick"))
        os.rename(os.path.join(top, "quick"), os.path.join(top, "renamed"))
        yield c.wait_for(b"renamed")
        yield deferLater(reactor, 0.2, lambda: None)
        with open(os.path.join(top, "renamed", "in.txt"), "w"):
            pass
        with open(os.path.join(top, "after.txt"), "w"):
            pass
        yield c.wait_for(b"after.txt")
        self.assertEqual(
            self.shown(c, top),
            [
                ("created", "gone", None),
                ("deleted", "gone", None),
                ("created", "quick", None),
                ("moved", "quick", "renamed"),
                ("created", "renamed/in.txt", None),
                ("created", "after.txt", None),
            ],
        )
        self.close(response)

    @inlineCallbacks
    def test_refusals_are_json(self) -> Any:
        """A watch outside the boundary is 403 JSON and a missing directory 404, not a stream."""
        reply = yield self.request("GET", "/files/watch?path=/etc")
        self.assertEqual(reply.status, 403)
        reply = yield self.request("GET", "/files/watch?path=nope")
        self.assertEqual(reply.status, 404)


class WatchLimitTests(StreamCase):
    """The bound on distinct watches counts the ones clients hold."""

    def setUp(self) -> Any:
        self.patch(watch_module, "MAX_WATCHES", 3)
        return super().setUp()

    @inlineCallbacks
    def test_watches_nobody_holds_make_room(self) -> Any:
        """
        A file tree that watches each folder it shows, one after the other,
        is not refused once more folders than the bound were shown: a watch
        its client closed, kept only for a resume, is let go for a new one.
        """
        for n in range(6):
            os.mkdir(os.path.join(self.base_dir, f"d{n}"))
            c, response = yield self.open_stream(f"path=d{n}&follow=true")
            with open(os.path.join(self.base_dir, f"d{n}", "f"), "w"):
                pass
            yield c.wait_for(b"created")
            self.close(response)
            yield deferLater(reactor, 0.05, lambda: None)

    @inlineCallbacks
    def test_held_watches_refuse_with_a_retry_after(self) -> Any:
        """
        With every watch held by a connected client, a new one is 429
        ``concurrency_limited`` with ``Retry-After``; once a client leaves,
        the next try is served.
        """
        held = []
        for n in range(3):
            os.mkdir(os.path.join(self.base_dir, f"d{n}"))
            _, response = yield self.open_stream(f"path=d{n}&follow=true")
            held.append(response)
        os.mkdir(os.path.join(self.base_dir, "more"))
        reply = yield self.request("GET", "/files/watch?path=more&follow=true")
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.header("retry-after")),
            (429, "concurrency_limited", "1"),
        )
        self.close(held.pop())
        yield deferLater(reactor, 0.1, lambda: None)
        _, response = yield self.open_stream("path=more&follow=true")
        for r in [*held, response]:
            self.close(r)
        yield deferLater(reactor, 0.05, lambda: None)


class UndecodableNameTests(StreamCase):
    """A file whose name is not UTF-8, as every other files endpoint shows it."""

    @inlineCallbacks
    def test_names_as_the_listing_shows_them(self) -> Any:
        """
        Creating, moving and deleting ``a\\xff``: the events' ``path`` and
        ``dest`` are the names ``/files/list`` gives the same files (the
        byte as the text ``\\xff``), in both forms of the stream, never a
        lone surrogate.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, response = yield self.open_stream("path=w&follow=true")
        seed, _ = yield self.open_stream("path=w&timeout=30")
        raw = os.path.join(os.fsencode(self.base_dir), b"w", b"a\xff")
        with open(raw, "wb") as f:
            f.write(b"x")
        reply = yield self.request("GET", "/files/list?path=w")
        (listed,) = [e["path"] for e in reply.json()["entries"]]
        self.assertEqual(listed, os.path.join(self.base_dir, "w", "a\\xff"))
        os.rename(raw, raw + b"\xfe")
        os.unlink(raw + b"\xfe")
        yield c.wait_for(b"deleted")
        for _ in range(100):
            if seed.data.count(b'"deleted"') == 2:
                break
            yield deferLater(reactor, 0.05, lambda: None)
        events = [data for _, name, data in c.events() if name != "modified"]
        self.assertEqual(
            [(e["event"], e["path"], e.get("dest")) for e in events],
            [
                ("created", listed, None),
                ("moved", listed, listed + "\\xfe"),
                ("deleted", listed + "\\xfe", None),
            ],
        )
        changes = [
            (data["type"], data["path"])
            for _, name, data in seed.events()
            if name == "change" and data["type"] != "modified"
        ]
        self.assertEqual(
            changes,
            [
                ("created", listed),
                ("deleted", listed),
                ("created", listed + "\\xfe"),
                ("deleted", listed + "\\xfe"),
            ],
        )
        self.assertNotIn(b"\\udc", c.data + seed.data)
        self.close(response)


class SeedFormTests(StreamCase):
    """Without ``follow=true``: the seed's events, for a window."""

    @inlineCallbacks
    def test_seed_events_and_end(self) -> Any:
        """
        ready first, then change events {type, path, is_dir} (a move is a
        deletion and a creation), then end once the window is over, which
        closes the stream.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        started = reactor.seconds()
        c, _ = yield self.open_stream("path=w&timeout=1.5&interval=0.5")
        path = os.path.join(self.base_dir, "w", "a.txt")
        with open(path, "wb") as f:
            f.write(b"x")
        os.mkdir(path + ".d")
        yield c.wait_for(b'"is_dir":true')
        os.rename(path, path + ".new")
        yield c.done
        elapsed = reactor.seconds() - started
        events = [(name, data) for _, name, data in c.events()]
        self.assertEqual(events[0], ("ready", {"path": os.path.dirname(path)}))
        self.assertEqual(events[-1], ("end", {"reason": "timeout"}))
        changes = [data for name, data in events if name == "change"]
        self.assertEqual(len(changes) + 2, len(events))
        self.assertEqual(
            [c for c in changes if c["type"] != "modified"],
            [
                {"type": "created", "path": path, "is_dir": False},
                {"type": "created", "path": path + ".d", "is_dir": True},
                {"type": "deleted", "path": path, "is_dir": False},
                {"type": "created", "path": path + ".new", "is_dir": False},
            ],
        )
        self.assertGreaterEqual(elapsed, 1.4)
        self.assertLess(elapsed, 10)

    @inlineCallbacks
    def test_watched_directory_removed(self) -> Any:
        """The watched directory removed: its deletion, then end (closed) before the window is over."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        started = reactor.seconds()
        c, _ = yield self.open_stream("path=w&timeout=60")
        os.rmdir(os.path.join(self.base_dir, "w"))
        yield c.done
        self.assertLess(reactor.seconds() - started, 30)
        events = [(name, data) for _, name, data in c.events()]
        self.assertEqual(
            events[-2:],
            [
                (
                    "change",
                    {
                        "type": "deleted",
                        "path": os.path.join(self.base_dir, "w"),
                        "is_dir": True,
                    },
                ),
                ("end", {"reason": "closed"}),
            ],
        )

    @inlineCallbacks
    def test_bad_window_is_400(self) -> Any:
        """
        A timeout or interval that is not a number is a 400, not a stream;
        so is either with follow=true, which has no window.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        for query in (
            "timeout=soon",
            "interval=often",
            "follow=true&timeout=5",
            "follow=true&interval=1",
            "follow=maybe",
        ):
            reply = yield self.request("GET", f"/files/watch?path=w&{query}")
            self.assertEqual(
                (reply.status, reply.json()["code"]), (400, "invalid_param"), query
            )


class SeedWindowPolicyTests(StreamCase):
    """The policy's max_duration_seconds bounds the seed's window."""

    policy = {"endpoints": {"files_watch": {"limits": {"max_duration_seconds": 0.5}}}}

    @inlineCallbacks
    def test_window_bounded_by_policy(self) -> Any:
        """A window longer than max_duration_seconds is cut to it."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        started = reactor.seconds()
        c, _ = yield self.open_stream("path=w&timeout=60")
        yield c.done
        self.assertLess(reactor.seconds() - started, 5)
        self.assertEqual(c.events()[-1][1:], ("end", {"reason": "timeout"}))

    @inlineCallbacks
    def test_no_timeout_is_the_default_window(self) -> Any:
        """
        With neither follow nor timeout (the seed SDK's ``files.watch(path)``),
        the window is the default one, cut to max_duration_seconds: ready,
        then end.
        """
        os.mkdir(os.path.join(self.base_dir, "w"))
        started = reactor.seconds()
        c, _ = yield self.open_stream("path=w&recursive=false")
        yield c.done
        self.assertLess(reactor.seconds() - started, 5)
        self.assertEqual(
            [e[1:] for e in c.events()],
            [
                ("ready", {"path": os.path.join(self.base_dir, "w")}),
                ("end", {"reason": "timeout"}),
            ],
        )

    @inlineCallbacks
    def test_follow_is_open_ended(self) -> Any:
        """follow=true is not bounded by the window: the stream is still open after it."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, response = yield self.open_stream("path=w&follow=true")
        yield deferLater(reactor, 1.5, lambda: None)
        self.assertFalse(c.done.called)
        with open(os.path.join(self.base_dir, "w", "late.txt"), "w") as f:
            f.write("x")
        yield c.wait_for(b"late.txt")
        self.assertEqual(c.events()[0][1], "created")
        self.close(response)


class ReloadEndsWatchTests(StreamCase):
    """
    A policy reload ends the watches it no longer lets in, with an
    ``error`` event: a stream lasts as long as its client keeps it.
    """

    autostart = False
    TOKENS: typing.ClassVar[dict[str, str]] = {
        "admin": "watch-admin-token",
        "other": "watch-other-token",
    }

    def setUp(self) -> Any:
        super().setUp()
        return self.start_on_policy_file(self.tokens_policy(["admin", "other"]))

    def tokens_policy(self, ids: list[str]) -> dict[str, Any]:
        tokens = [
            {
                "id": i,
                "token_sha256": hashlib.sha256(self.TOKENS[i].encode()).hexdigest(),
                "scopes": ["*"],
            }
            for i in ids
        ]
        return {"auth": {"tokens": tokens}}

    @inlineCallbacks
    def test_removed_identity_loses_its_watch(self) -> Any:
        """The watch of an identity a reload removed ends with a 401 error event."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, _ = yield self.open_stream(
            "path=w&follow=true",
            {"Authorization": f"Bearer {self.TOKENS['admin']}"},
        )
        self.reload_policy(self.tokens_policy(["other"]))
        yield c.done
        errors = [e[2] for e in c.events() if e[1] == "error"]
        self.assertEqual([e["type"] for e in errors], ["AuthError"], c.data)
        self.assertIn("no longer in the policy", errors[0]["error"])

    @inlineCallbacks
    def test_kept_identity_keeps_its_watch(self) -> Any:
        """A reload that still lets the identity in leaves its watch open."""
        os.mkdir(os.path.join(self.base_dir, "w"))
        c, response = yield self.open_stream(
            "path=w&follow=true",
            {"Authorization": f"Bearer {self.TOKENS['admin']}"},
        )
        self.reload_policy(self.tokens_policy(["admin"]))
        with open(os.path.join(self.base_dir, "w", "a.txt"), "wb") as f:
            f.write(b"x")
        yield c.wait_for(b"created")
        self.close(response)
