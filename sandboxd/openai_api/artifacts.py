# -*- test-case-name: tests.openai_api.test_artifacts -*-
"""
A session's artifacts: copies of the files an agent wrote during a
completed turn, listed, downloaded and deleted through the ``/v1`` door.

Which files: the ones the engine recorded as changed by the turn (a
``fs/write_text_file`` it served, a tool call's diff or edit location);
the workspace is never scanned.  Each is opened through the session's
path guard (``O_NOFOLLOW``, regular files only), must lie inside the
session's working directory and outside ``.git``, and is copied in the
reactor's thread pool to a private directory (0700, files 0600) before
the turn is reported completed.  Bounded per file, per turn and per
session (:mod:`sandboxd.policy.defaults`).  Memory only, like the
sessions: the copies are removed with their session's face, and at exit.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import attrs

from sandboxd.access.guard import PathGuard
from sandboxd.errors import ApiError, not_found
from sandboxd.files.stream import FileProducer
from sandboxd.openai_api.face import SessionFace, WireTurn, new_id
from sandboxd.openai_api.files import attachment
from sandboxd.openai_api.registry import face_of, page, restored_first
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest, StreamResponse

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

#: Changes whose file is still there to copy.
_COPIED_CHANGES = ("created", "modified")


@attrs.define
class Artifact:
    """One copied file."""

    id: str
    turn_id: str
    path: str
    size: int
    created_at: int
    copy: str

    def describe(self, face: SessionFace) -> dict[str, Any]:
        """The ``agent.session.artifact`` object."""
        return {
            "id": self.id,
            "object": "agent.session.artifact",
            "created_at": self.created_at,
            "environment_id": face.environment.get("id") or "env_local",
            "path": self.path,
            "session_id": face.id,
            "size_bytes": self.size,
            "turn_id": self.turn_id,
        }


class Shelf:
    """
    One session's artifacts and the private directory holding them.

    The directory is made on the first copy and removed when the face is
    forgotten (or the daemon exits), through :func:`weakref.finalize`.
    """

    def __init__(self, face: SessionFace) -> None:
        # Weak: the face holds its shelf (through its snapshot hook), and
        # the shelves map must not keep a forgotten face alive.
        self._face = weakref.ref(face)
        self.items: OrderedDict[str, Artifact] = OrderedDict()
        self.directory: str | None = None

    @property
    def face(self) -> SessionFace:
        """The session's face (alive while its routes or turns use it)."""
        face = self._face()
        assert face is not None
        return face

    def candidates(self, turn: WireTurn) -> list[str]:
        """The absolute paths the engine saw ``turn`` write, oldest first."""
        engine_turn = turn.engine_id
        out = []
        for record in self.face.engine.files.values():
            if engine_turn in record["turn_ids"] and record["change"] in (
                _COPIED_CHANGES
            ):
                out.append(record["path"])
        return out[: defaults.V1_ARTIFACTS_PER_TURN]

    def snapshot(self, turn: WireTurn) -> Deferred[None] | None:
        """Copy ``turn``'s files off the reactor; None when there are none."""
        paths = self.candidates(turn)
        if not paths:
            return None
        engine = self.face.engine
        d: Deferred[Any] = engine.context.in_thread(
            copy_files, PathGuard(engine.rule), engine.cwd, paths, self._ensure_dir
        )
        d.addCallback(self._shelve, turn)
        d.addErrback(lambda f: None)  # a failed copy leaves no artifact
        done: Deferred[None] = d
        return done

    def _ensure_dir(self) -> str:
        """The private directory (made in the copying thread, once)."""
        if self.directory is None:
            self.directory = self.face.engine.context.scratch.mkdtemp(
                "sandboxd-artifacts-"
            )
            # Kept alive by the weakref module until it runs, at the
            # latest when the interpreter exits.
            weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)
        return self.directory

    def _shelve(self, copied: list[tuple[str, str, int]], turn: WireTurn) -> None:
        now = int(time.time())
        for path, copy, size in copied:
            artifact = Artifact(new_id("artifact_"), turn.id, path, size, now, copy)
            self.items[artifact.id] = artifact
        kept = sum(a.size for a in self.items.values())
        while len(self.items) > 1 and (
            len(self.items) > defaults.V1_ARTIFACTS_KEPT
            or kept > defaults.V1_ARTIFACTS_KEPT_BYTES
        ):
            _, oldest = self.items.popitem(last=False)
            kept -= oldest.size
            _unlink(oldest.copy)

    def find(self, artifact_id: str) -> Artifact:
        """One artifact, or 404."""
        found = self.items.get(artifact_id)
        if found is None:
            raise not_found(
                f"No artifact found with id {artifact_id!r}", param="artifact_id"
            )
        return found


def copy_files(
    guard: PathGuard, cwd: str, paths: list[str], directory: Any
) -> list[tuple[str, str, int]]:
    """
    Copy each of ``paths`` that passes the checks (in a thread); returns
    ``(path, copy, size)`` for each copied.  A path that fails is skipped:
    the agent may have removed or replaced it since.
    """
    root = os.path.realpath(cwd)
    out = []
    seen: set[str] = set()
    for path in paths:
        try:
            opened = guard.open_file(path, "read")
        except ApiError:
            continue
        with opened:
            real = opened.path
            rel = os.path.relpath(real, root)
            if (
                real in seen
                or rel.startswith("..")
                or ".git" in rel.split(os.sep)
                or not stat.S_ISREG(opened.stat.st_mode)
                or opened.stat.st_size > defaults.V1_ARTIFACT_BYTES
            ):
                continue
            seen.add(real)
            copy = os.path.join(directory(), new_id(""))
            size = _copy_fd(opened.fd, copy)
            if size is None:
                continue
            out.append((real, copy, size))
    return out


def _copy_fd(fd: int, copy: str) -> int | None:
    """Copy at most the size bound from ``fd`` to a new 0600 file."""
    out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    size = 0
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return size
            size += len(chunk)
            if size > defaults.V1_ARTIFACT_BYTES:
                break  # it grew past the bound while copied
            os.write(out, chunk)
    finally:
        os.close(out)
    _unlink(copy)
    return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_SHELVES: weakref.WeakKeyDictionary[SessionFace, Shelf] = weakref.WeakKeyDictionary()


def attach(face: SessionFace) -> None:
    """Give ``face`` a shelf: its completed turns' files are copied to it."""
    shelf = _SHELVES[face] = Shelf(face)
    face.snapshot = shelf.snapshot


def shelf_of(face: SessionFace) -> Shelf:
    """The face's shelf (an empty one for a face made without)."""
    found = _SHELVES.get(face)
    if found is None:
        found = _SHELVES[face] = Shelf(face)
    return found


# -- the routes ------------------------------------------------------------------


def agents_artifacts_list(request: ServerRequest) -> dict[str, Any]:
    """The session's artifacts, optionally of one environment."""
    face = face_of(request)
    wanted = request.query.get("environment_id")
    shown = [a.describe(face) for a in shelf_of(face).items.values()]
    if wanted:
        shown = [a for a in shown if a["environment_id"] == wanted]
    return page(request, shown)


def agents_artifacts_get(request: ServerRequest) -> dict[str, Any]:
    """One artifact."""
    face = face_of(request)
    return shelf_of(face).find(request.path_params["artifact_id"]).describe(face)


def agents_artifacts_delete(request: ServerRequest) -> dict[str, Any]:
    """Remove the copy (the workspace file stays)."""
    face = face_of(request)
    shelf = shelf_of(face)
    artifact = shelf.find(request.path_params["artifact_id"])
    shelf.items.pop(artifact.id, None)
    _unlink(artifact.copy)
    return {
        "id": artifact.id,
        "object": "agent.session.artifact.deleted",
        "deleted": True,
    }


def agents_artifacts_content(request: ServerRequest) -> StreamResponse:
    """The copy's bytes, streamed from the file (never read whole)."""
    face = face_of(request)
    artifact = shelf_of(face).find(request.path_params["artifact_id"])
    try:
        fd = os.open(artifact.copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise not_found(
            f"No artifact found with id {artifact.id!r}", param="artifact_id"
        ) from None
    size = os.fstat(fd).st_size
    name = os.path.basename(artifact.path)
    producer = FileProducer(fd, 0, size)
    return StreamResponse(
        write_to=producer.start,
        headers={
            "content-type": "application/octet-stream",
            "content-length": str(size),
            "content-disposition": attachment(name, "artifact"),
            "x-content-type-options": "nosniff",
            "cache-control": "no-store",
        },
    )


HANDLERS: dict[str, Any] = {
    "agents_artifacts_list": agents_artifacts_list,
    "agents_artifacts_get": agents_artifacts_get,
    "agents_artifacts_delete": agents_artifacts_delete,
    "agents_artifacts_content": agents_artifacts_content,
}
HANDLERS = restored_first(HANDLERS)
