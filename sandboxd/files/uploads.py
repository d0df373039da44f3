# -*- test-case-name: tests.routes.test_uploads -*-
"""
Resumable uploads: a staging file that grows over several requests and is
renamed into place once whole.

An upload is one :class:`~sandboxd.files.atomic.AtomicWrite` kept open
between requests: its temporary file (``.NAME.<hex>[.new].upload``, hidden,
beside the target, so the end is a rename on one file system) holds the
bytes that arrived, and ``offset`` says how many.  Every append starts at
``offset``; a cut connection keeps what was written, so the client asks
where the upload stands and carries on from there.

The table is per daemon (:attr:`~sandboxd.daemon.context.Context.uploads`) and
bounded: at most ``max_sessions`` open uploads, each dropped (its staging
file removed) after ``idle_timeout_seconds`` without a byte, on ``DELETE``
and when the daemon stops; at the bound, one without a byte for
:data:`~sandboxd.policy.defaults.UPLOAD_RECLAIM_SECONDS` makes room for a
new one (a client that died mid-upload leaves its upload behind).  An upload belongs to the identity that created
it; another identity is told it does not exist.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import Service

from sandboxd.errors import Code, limit_exceeded, not_found
from sandboxd.files.atomic import AtomicWrite
from sandboxd.policy.defaults import UPLOAD_RECLAIM_SECONDS


@attrs.define(eq=False)
class Upload:
    """
    One open upload.

    :ivar offset: bytes written to the staging file (all of them flushed
        out of the daemon's queues) and hashed.
    :ivar busy: an append is running; a second one is refused.
    :ivar stop_append: set by the running append: drop the staging file
        once no write is in flight (a pool thread may be writing to it).
    """

    id: str
    owner: str
    display: str
    size: int
    writer: AtomicWrite
    idle_seconds: float
    offset: int = 0
    busy: bool = False
    sha256: Any = attrs.field(factory=hashlib.sha256)
    expires_at: float = 0.0
    #: When it last took a byte (or was created), on the table's clock.
    active_at: float = 0.0
    timer: Any = None
    stop_append: Callable[[], None] | None = None

    @property
    def path(self) -> str:
        """The resolved target path."""
        return self.writer.path

    def record(self) -> dict[str, Any]:
        """What ``POST``/``GET /files/uploads`` answer."""
        return {
            "upload_id": self.id,
            "path": self.path,
            # As the create was given it: a client resuming by id compares
            # its own path with this one (it cannot resolve links itself).
            "requested_path": self.display,
            "size": self.size,
            "offset": self.offset,
            "expires_at": _iso(self.expires_at),
        }


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


class UploadTable(Service):
    """
    The daemon's open uploads, by id; a service so that stopping the
    daemon removes their staging files.

    :param clock: ``callLater`` for the idle expiry (the reactor).
    :param wall: the wall clock behind ``expires_at``.
    """

    name = "files_uploads"

    def __init__(self, clock: Any, wall: Any = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self.uploads: dict[str, Upload] = {}

    def check_room(
        self,
        limit: int,
        rule: str | None = None,
        owner: str | None = None,
        mine: int | None = None,
        mine_rule: str | None = None,
    ) -> None:
        """
        Refuse a new upload at ``limit`` open ones, or at ``mine`` open ones
        of ``owner`` (an identity's share), before anything (its staging
        file) is created.  An abandoned upload (:meth:`_reclaim`) in the
        way is dropped instead.

        :raises ApiError: 429 ``too_many_sessions``.
        """
        if len(self.uploads) >= limit and not self._reclaim(None):
            raise limit_exceeded(
                429,
                f"too many open uploads (limit {limit}): finish or delete one "
                "(GET /files/uploads lists yours)",
                Code.TOO_MANY_SESSIONS,
                rule=rule,
                limit=limit,
                **self._retry(None),
            )
        if owner is not None and mine is not None:
            held = sum(1 for u in self.uploads.values() if u.owner == owner)
            if held >= mine and not self._reclaim(owner):
                raise limit_exceeded(
                    429,
                    f"this identity has {mine} uploads open, its share of "
                    f"{limit}: finish or delete one (GET /files/uploads lists "
                    "them)",
                    Code.TOO_MANY_SESSIONS,
                    rule=mine_rule,
                    limit=mine,
                    **self._retry(owner),
                )

    def _retry(self, owner: str | None) -> dict[str, Any]:
        """
        ``Retry-After`` (header and field) of a refusal at the bound: when
        the first upload in the way (of ``owner``, or of anyone) that takes
        no byte meanwhile can be reclaimed or expires; nothing when each
        has an append running, whose end nobody knows.
        """
        now = self.clock.seconds()
        waits = [
            min(UPLOAD_RECLAIM_SECONDS, u.idle_seconds) - (now - u.active_at)
            for u in self.uploads.values()
            if not u.busy and (owner is None or u.owner == owner)
        ]
        if not waits:
            return {}
        seconds = max(1, math.ceil(min(waits)))
        return {"headers": {"Retry-After": str(seconds)}, "retry_after": seconds}

    def mine(self, owner: str) -> list[Upload]:
        """``owner``'s open uploads, the one idle longest first."""
        return sorted(
            (
                u
                for u in self.uploads.values()
                if secrets.compare_digest(u.owner, owner)
            ),
            key=lambda u: u.active_at,
        )

    def _reclaim(self, owner: str | None) -> bool:
        """
        Drop the upload (of ``owner``, or of anyone) that has taken no byte
        the longest, if for :data:`UPLOAD_RECLAIM_SECONDS` at least: its
        client most likely died, and the idle timeout (an hour by
        default) would keep the slot and the staging file that long.

        :return: whether one was dropped.
        """
        now = self.clock.seconds()
        idle = [
            u
            for u in self.uploads.values()
            if not u.busy
            and (owner is None or u.owner == owner)
            and now - u.active_at >= UPLOAD_RECLAIM_SECONDS
        ]
        if not idle:
            return False
        self.drop(min(idle, key=lambda u: u.active_at))
        return True

    def create(
        self,
        owner: str,
        writer: AtomicWrite,
        size: int,
        display: str,
        idle_seconds: float,
    ) -> Upload:
        """A new upload owning ``writer`` (the caller checked :meth:`check_room`)."""
        upload = Upload(
            id=secrets.token_hex(12),
            owner=owner,
            display=display,
            size=size,
            writer=writer,
            idle_seconds=idle_seconds,
        )
        self.uploads[upload.id] = upload
        self.touch(upload)
        return upload

    def get(self, owner: str, upload_id: str) -> Upload:
        """
        The caller's upload.

        :raises ApiError: 404 ``not_found`` for an unknown id, an expired
            upload, or one another identity created.
        """
        upload = self.uploads.get(upload_id)
        if upload is None or not secrets.compare_digest(upload.owner, owner):
            raise not_found(f"no such upload: {upload_id}")
        return upload

    def touch(self, upload: Upload) -> None:
        """Bytes arrived (or it was created): the idle expiry starts again."""
        if upload.timer is not None and upload.timer.active():
            upload.timer.cancel()
        upload.expires_at = self.wall() + upload.idle_seconds
        upload.active_at = self.clock.seconds()
        upload.timer = self.clock.callLater(upload.idle_seconds, self._expire, upload)

    def hold(self, upload: Upload) -> None:
        """An append is running: it does not expire meanwhile."""
        upload.busy = True
        if upload.timer is not None and upload.timer.active():
            upload.timer.cancel()
        upload.timer = None

    def release(self, upload: Upload) -> None:
        """The append ended; the upload stays open (if it still is)."""
        upload.busy = False
        if self.uploads.get(upload.id) is upload:
            self.touch(upload)

    def _expire(self, upload: Upload) -> None:
        upload.timer = None
        if not upload.busy:
            self.drop(upload)

    def forget(self, upload: Upload) -> None:
        """Completed (renamed into place): no longer listed, nothing removed."""
        if self.uploads.get(upload.id) is upload:
            del self.uploads[upload.id]
        if upload.timer is not None and upload.timer.active():
            upload.timer.cancel()
        upload.timer = None

    def drop(self, upload: Upload) -> None:
        """Remove the upload and its staging file (the target is untouched)."""
        self.forget(upload)
        if upload.busy and upload.stop_append is not None:
            upload.stop_append()
        elif not upload.writer.done:
            upload.writer.abort()

    def stopService(self) -> Any:
        """The daemon stops: every staging file is removed."""
        for upload in list(self.uploads.values()):
            self.drop(upload)
        return super().stopService()  # type: ignore[no-untyped-call]
