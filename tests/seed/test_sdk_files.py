"""
The seed SDK's ``server.files`` against a real daemon, through its async
and its sync face: the typed results and exceptions of every method, and
the same scenario against the seed's own server as the control.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import tarfile
import zipfile
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.seed.sdkcase import CompareCase, Face, outcome
from tests.test_guard import bind_mount


def make_tree(base: str) -> None:
    """The same small tree in each server's base dir."""
    for rel, data in (
        ("a.txt", "hello"),
        ("d/b.txt", "bee"),
        ("d/sub/c.txt", "sea"),
        ("d/sub/deep/e.txt", "e"),
        ("d/sub/deep/deeper/f.txt", "f"),
    ):
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(data)
    os.makedirs(os.path.join(base, "w"))


def member_names(data: bytes, fmt: str) -> list[str]:
    """An archive's member names, sorted."""
    if fmt == "zip":
        return sorted(zipfile.ZipFile(io.BytesIO(data)).namelist())
    return sorted(tarfile.open(fileobj=io.BytesIO(data)).getnames())


async def files_scenario(c: Any, base: str, call: Face) -> dict[str, Any]:
    """Every ``server.files`` method, on success and on its usual failures."""
    f = c.files
    out: dict[str, Any] = {}

    async def listed(*args: Any, **kwargs: Any) -> Any:
        entries = await call(f.list, *args, **kwargs)
        return sorted(entries, key=lambda e: e.name)

    async def searched(*args: Any, **kwargs: Any) -> Any:
        # The seed walks in the file system's order, sandboxd by name.
        result = await call(f.search, *args, **kwargs)
        result.results.sort(key=lambda hit: hit.path)
        return result

    out["list"] = await outcome(listed(base))
    out["list_recursive"] = await outcome(listed(base, recursive=True))
    out["list_max_entries"] = await outcome(
        call(f.list, base + "/d", recursive=True, max_entries=2)
    )
    out["list_missing"] = await outcome(call(f.list, base + "/nope"))
    # A file is no directory: FileNotFoundError_ on both (was ServerAPIError).
    out["list_file"] = await outcome(call(f.list, base + "/a.txt"))
    out["list_outside"] = await outcome(call(f.list, "/etc"))
    out["stat"] = await outcome(call(f.stat, base + "/a.txt"))
    out["stat_dir"] = await outcome(call(f.stat, base + "/d"))
    out["stat_missing"] = await outcome(call(f.stat, base + "/nope"))
    out["stat_outside"] = await outcome(call(f.stat, "/etc/passwd"))
    out["exists"] = await outcome(call(f.exists, base + "/a.txt"))
    out["exists_missing"] = await outcome(call(f.exists, base + "/nope"))
    out["mkdir"] = await outcome(call(f.mkdir, base + "/m/n"))
    out["mkdir_again"] = await outcome(call(f.mkdir, base + "/m/n"))
    out["move"] = await outcome(call(f.move, base + "/m", base + "/m2"))
    out["move_missing"] = await outcome(call(f.move, base + "/zz", base + "/m3"))
    out["delete"] = await outcome(call(f.delete, base + "/m2"))
    out["delete_missing"] = await outcome(call(f.delete, base + "/m2"))
    out["search"] = await outcome(searched(base, "*.txt"))
    out["search_depth"] = await outcome(searched(base, "*.txt", max_depth=2))
    out["search_max_results"] = await outcome(
        call(f.search, base, "*.txt", max_depth=1, max_results=1)
    )
    out["search_missing"] = await outcome(call(f.search, base + "/nope", "*"))
    out["upload"] = await outcome(call(f.upload, base + "/up/u.bin", b"\x00\x01\xff"))
    out["upload_text"] = await outcome(call(f.upload, base + "/up/t.txt", "text é"))
    out["upload_outside"] = await outcome(call(f.upload, "/etc/seed-wire", b"x"))
    local = os.path.join(base, "local.bin")
    with open(local, "wb") as fobj:
        fobj.write(b"local bytes")
    out["upload_file"] = await outcome(call(f.upload_file, local, base + "/up/l.bin"))
    out["download"] = await outcome(call(f.download, base + "/up/u.bin"))
    out["download_missing"] = await outcome(call(f.download, base + "/nope"))
    out["download_dir"] = await outcome(call(f.download, base + "/d"))
    out["download_outside"] = await outcome(call(f.download, "/etc/passwd"))
    out["read_text"] = await outcome(call(f.read_text, base + "/up/t.txt"))
    out["download_file"] = await outcome(
        call(f.download_file, base + "/up/l.bin", base + "/copy.bin")
    )
    for fmt in ("tar.gz", "zip"):
        result = await outcome(call(f.archive, [base + "/d/sub", base + "/a.txt"], fmt))
        # The bytes differ (times, compression); the class, format and names may not.
        if not isinstance(result, BaseException):
            result = (type(result), result.format, member_names(result.data, fmt))
        out["archive_" + fmt] = result
    out["archive_missing"] = await outcome(call(f.archive, [base + "/nope"]))
    out["archive_format"] = await outcome(call(f.archive, [base + "/a.txt"], "rar"))

    async def change_soon() -> None:
        await asyncio.sleep(0.5)
        with open(os.path.join(base, "w", "new.txt"), "w") as fobj:
            fobj.write("x")

    writer = asyncio.ensure_future(change_soon())
    out["watch_for"] = await outcome(call(f.watch_for, base + "/w", 1.5))
    await writer
    out["watch_missing"] = await outcome(call(f.watch_for, base + "/nope", 0.5))
    return out


def created_once(events: Any) -> Any:
    """
    ``events`` without a ``modified`` that follows the ``created`` of the
    same path: the scenario's file is created and written in one moment,
    which the seed's server reports as one event or two depending on
    timing (sandboxd as one, asserted on its own below).
    """
    if not isinstance(events, list):
        return events
    kept: list[Any] = []
    for event in events:
        previous = kept[-1] if kept else None
        if (
            previous is not None
            and event.type == "modified"
            and previous.type == "created"
            and previous.path == event.path
        ):
            continue
        kept.append(event)
    return kept


async def watch_generator(c: Any, base: str) -> list[Any]:
    """``files.watch(timeout=...)`` as an async generator: it ends by itself."""

    async def change_soon() -> None:
        await asyncio.sleep(0.5)
        os.mkdir(os.path.join(base, "w", "made"))

    writer = asyncio.ensure_future(change_soon())
    events = []
    async with contextlib.aclosing(
        c.files.watch(base + "/w", recursive=True, timeout=1.5)
    ) as stream:
        async for event in stream:
            events.append(event)
    await writer
    return events


async def watch_default(c: Any, base: str) -> tuple[list[Any], float]:
    """
    ``files.watch(path)`` with no ``timeout``, as the SDK's own examples
    call it: the events it yields, and how long it took to end by itself.
    """

    async def change_soon() -> None:
        await asyncio.sleep(0.5)
        with open(os.path.join(base, "w", "new.txt"), "w") as fobj:
            fobj.write("x")

    loop = asyncio.get_running_loop()
    started = loop.time()
    writer = asyncio.ensure_future(change_soon())
    events = []
    async with contextlib.aclosing(c.files.watch(base + "/w")) as stream:
        async for event in stream:
            events.append(event)
    await writer
    return events, loop.time() - started


class FilesTests(CompareCase):
    """``server.files`` on sandboxd gives what it gives on the seed."""

    @inlineCallbacks
    def check_face(self, sync: bool) -> Any:
        from agent_sandbox.models.errors import (
            FileNotFoundError_,
            FilePolicyDeniedError,
            ServerAPIError,
        )
        from agent_sandbox.models.server import (
            ArchiveResult,
            DeleteResult,
            MkdirResult,
            MoveResult,
            SearchResult,
            ServerFileEntry,
            ServerFileInfo,
            ServerWatchEvent,
            TransferResult,
        )

        ours, seed, dirs = yield self.both(files_scenario, sync, make_tree)
        for side in (ours, seed):
            side["watch_for"] = created_once(side["watch_for"])
        self.assertSameShapes(ours, seed, dirs)

        # What a user sees, spelled out on sandboxd's side.
        b = dirs[0]
        self.assertEqual(
            [(e.name, e.type) for e in ours["list"]],
            [("a.txt", "file"), ("d", "directory"), ("w", "directory")],
        )
        self.assertTrue(all(isinstance(e, ServerFileEntry) for e in ours["list"]))
        # Three levels: d/sub/deep is listed, its contents are not.
        self.assertEqual(
            [e.name for e in ours["list_recursive"]],
            sorted(["a.txt", "d", "b.txt", "sub", "c.txt", "deep", "w"]),
        )
        self.assertEqual(len(ours["list_max_entries"]), 2)
        self.assertIsInstance(ours["list_missing"], FileNotFoundError_)
        self.assertIsInstance(ours["list_outside"], FilePolicyDeniedError)
        self.assertIsInstance(ours["stat"], ServerFileInfo)
        self.assertEqual(
            (ours["stat"].path, ours["stat"].size, ours["stat"].exists),
            (b + "/a.txt", 5, True),
        )
        self.assertTrue(ours["stat"].accessed and ours["stat"].created)
        self.assertFalse(ours["stat_missing"].exists)
        self.assertEqual((ours["exists"], ours["exists_missing"]), (True, False))
        self.assertEqual(ours["mkdir"], MkdirResult(path=b + "/m/n", created=True))
        self.assertEqual(
            ours["move"], MoveResult(source=b + "/m", destination=b + "/m2")
        )
        self.assertIsInstance(ours["move_missing"], FileNotFoundError_)
        self.assertEqual(ours["delete"], DeleteResult(path=b + "/m2", deleted=True))
        self.assertIsInstance(ours["delete_missing"], FileNotFoundError_)
        self.assertIsInstance(ours["search"], SearchResult)
        self.assertEqual(
            sorted(h.name for h in ours["search_depth"].results),
            ["a.txt", "b.txt"],
        )
        self.assertEqual(len(ours["search_max_results"].results), 1)
        self.assertIsInstance(ours["upload"], TransferResult)
        self.assertEqual(
            (ours["upload"].path, ours["upload"].size), (b + "/up/u.bin", 3)
        )
        self.assertIsInstance(ours["upload_outside"], FilePolicyDeniedError)
        self.assertEqual(ours["download"], b"\x00\x01\xff")
        self.assertEqual(ours["read_text"], "text é")
        self.assertEqual(ours["download_file"], 11)
        with open(os.path.join(b, "copy.bin"), "rb") as fobj:
            self.assertEqual(fobj.read(), b"local bytes")
        for name in ("download_missing", "download_dir", "archive_missing"):
            self.assertIsInstance(ours[name], FileNotFoundError_, name)
        self.assertIsInstance(ours["download_outside"], FilePolicyDeniedError)
        self.assertEqual(
            ours["archive_zip"],
            (
                ArchiveResult,
                "zip",
                ["a.txt", "sub/c.txt", "sub/deep/deeper/f.txt", "sub/deep/e.txt"],
            ),
        )
        self.assertIsInstance(ours["archive_format"], ServerAPIError)
        self.assertEqual(
            ours["watch_for"],
            [ServerWatchEvent(type="created", path=b + "/w/new.txt", is_dir=False)],
        )
        self.assertIsInstance(ours["watch_missing"], FileNotFoundError_)

    def test_async(self) -> Any:
        """The async face: every method, typed results and exceptions as on the seed."""
        return self.check_face(sync=False)

    def test_sync(self) -> Any:
        """The ``*_sync`` face: the same."""
        return self.check_face(sync=True)

    @inlineCallbacks
    def test_watch_ends(self) -> Any:
        """
        ``files.watch(timeout=...)`` yields the change events and ends when
        the window does (it does not hang), as on the seed.
        """
        from agent_sandbox.models.server import ServerWatchEvent

        for base in (self.base_dir,):
            os.makedirs(os.path.join(base, "w"))
        events = yield self.drive(lambda c: watch_generator(c, self.base_dir))
        self.assertEqual(
            events,
            [
                ServerWatchEvent(
                    type="created", path=self.base_dir + "/w/made", is_dir=True
                )
            ],
        )
        reference = yield self.reference()
        os.makedirs(os.path.join(reference.base_dir, "w"))
        seed = yield self.drive(
            lambda c: watch_generator(c, reference.base_dir), reference=True
        )
        self.assertEqual(
            [(e.type, e.is_dir) for e in seed], [(e.type, e.is_dir) for e in events]
        )

    @inlineCallbacks
    def test_where_sandboxd_differs(self) -> Any:
        """
        Kept on purpose (the migration page lists them): a move onto an
        existing file raises FilePolicyDeniedError (file_exists) and leaves
        both files, where the seed replaces the target; a directory made
        over a file raises the same (the seed: a 500 ServerAPIError); an
        empty upload writes an empty file, where the seed refuses it.
        """
        from agent_sandbox.models.errors import FilePolicyDeniedError, ServerAPIError
        from agent_sandbox.models.server import TransferResult

        base = self.base_dir
        for name in ("a.txt", "b.txt"):
            with open(os.path.join(base, name), "w") as f:
                f.write(name)

        async def scenario(c: Any) -> Any:
            return (
                await outcome(c.files.move(base + "/a.txt", base + "/b.txt")),
                await outcome(c.files.mkdir(base + "/a.txt")),
                await outcome(c.files.upload(base + "/empty.txt", b"")),
            )

        moved, made, empty = yield self.drive(scenario)
        for error in (moved, made):
            self.assertIsInstance(error, FilePolicyDeniedError)
            self.assertIsInstance(error, ServerAPIError)
            self.assertEqual(
                (error.status_code, error.error_code), (409, "file_exists")
            )
        for name in ("a.txt", "b.txt"):
            with open(os.path.join(base, name)) as f:
                self.assertEqual(f.read(), name)
        self.assertIsInstance(empty, TransferResult)
        self.assertEqual((empty.path, empty.size), (base + "/empty.txt", 0))
        self.assertEqual(os.path.getsize(os.path.join(base, "empty.txt")), 0)


class WatchWithoutTimeoutTests(CompareCase):
    """
    ``files.watch(path)`` with no ``timeout`` gets the server's default
    window on both servers: the policy's ``max_duration_seconds`` (here
    2 s; 300 s when the policy says nothing).
    """

    policy = {"endpoints": {"files_watch": {"limits": {"max_duration_seconds": 2}}}}

    @inlineCallbacks
    def test_watch_ends_by_itself(self) -> Any:
        """
        The SDK's watch without a timeout yields the change, then ends when
        the window closes, on sandboxd as on the seed.
        """
        from agent_sandbox.models.server import ServerWatchEvent

        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        policy_file = os.path.join(folder, "policy.json")
        with open(policy_file, "w") as f:
            json.dump(self.policy, f)
        reference = yield self.reference("--policy", policy_file)
        outcomes = []
        for base, on_seed in ((self.base_dir, False), (reference.base_dir, True)):
            os.makedirs(os.path.join(base, "w"))
            events, elapsed = yield self.drive(
                lambda c, base=base: watch_default(c, base), reference=on_seed
            )
            # The window is 2 s; a few more on a busy machine, never the
            # SDK's own five-minute read timeout.
            self.assertGreaterEqual(elapsed, 1.9, on_seed)
            self.assertLess(elapsed, 20, on_seed)
            outcomes.append([(e.type, os.path.relpath(e.path, base)) for e in events])
            if not on_seed:
                self.assertEqual(
                    events,
                    [
                        ServerWatchEvent(
                            type="created", path=base + "/w/new.txt", is_dir=False
                        )
                    ],
                )
        ours, seed = outcomes
        # The seed polls (a write may also show as modified); the creation
        # is what both report first.
        self.assertEqual(ours, seed[:1])
        self.assertEqual(ours, [("created", "w/new.txt")])


class MoveToAnotherFileSystemTests(CompareCase):
    """``files.move`` into a mounted volume: done by a copy, as on the seed."""

    @inlineCallbacks
    def test_move_into_a_volume(self) -> Any:
        """
        A file and a tree moved from the base into a directory mounted from
        elsewhere (rename cannot cross it) arrive whole and leave the base,
        on sandboxd as on the seed's server.
        """
        from agent_sandbox.models.server import MoveResult

        reference = yield self.reference()
        for base, seed in ((self.base_dir, False), (reference.base_dir, True)):
            volume = os.path.realpath(self.mktemp())
            os.makedirs(volume)
            os.makedirs(os.path.join(base, "vol"))
            bind_mount(self, volume, os.path.join(base, "vol"))
            os.makedirs(os.path.join(base, "tree", "sub"))
            for rel, data in (("dl.bin", b"\x00" * 70_000), ("tree/sub/b.txt", b"b")):
                with open(os.path.join(base, rel), "wb") as f:
                    f.write(data)

            async def scenario(c: Any, base: str = base) -> Any:
                return (
                    await outcome(c.files.move(base + "/dl.bin", base + "/vol/dl.bin")),
                    await outcome(c.files.move(base + "/tree", base + "/vol/tree")),
                )

            moved = yield self.drive(scenario, reference=seed)
            self.assertEqual(
                moved,
                (
                    MoveResult(
                        source=base + "/dl.bin", destination=base + "/vol/dl.bin"
                    ),
                    MoveResult(source=base + "/tree", destination=base + "/vol/tree"),
                ),
            )
            with open(os.path.join(volume, "dl.bin"), "rb") as f:
                self.assertEqual(f.read(), b"\x00" * 70_000)
            with open(os.path.join(volume, "tree", "sub", "b.txt"), "rb") as f:
                self.assertEqual(f.read(), b"b")
            for gone in ("dl.bin", "tree"):
                self.assertFalse(os.path.lexists(os.path.join(base, gone)), gone)
