# -*- test-case-name: tests.openai_api.test_files -*-
"""
The ``/v1`` door's stored files (``client.files``): bytes on disk under the
state directory, one owner each.

Each file is two entries of one private directory (0700): ``ID.bin``, the
bytes, and ``ID.json``, its record (owner, name, purpose, size, time).  The
bytes are written first and the record last, each through a temporary name
renamed into place, so a file is either whole with its record or absent: a
failed create removes what it wrote, and a record without its bytes (or
bytes without a record) found at load is not shown.  Every disk access runs
on a worker thread; the index lives in memory, read once on first use.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import time
from collections import OrderedDict
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from sandboxd.errors import ApiError, insufficient_storage, internal, unavailable
from sandboxd.files.atomic import remove_if_there, write_private
from sandboxd.waiters import Waiters

#: A record's fields on disk.
_FIELDS = ("id", "owner", "filename", "purpose", "bytes", "created_at")


def new_file_id() -> str:
    """An OpenAI-style file id (``file-`` and 24 hex characters)."""
    return "file-" + secrets.token_hex(12)


class FileStore:
    """
    The stored files of every identity.

    :ivar reserved: bytes of creates under way, per owner, counted against
        the owner's total before their bytes reach the disk.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.reserved: dict[str, tuple[int, int]] = {}
        self._loaded = False
        self._reading = False
        self._loading: Waiters[None] = Waiters()

    # -- the index -------------------------------------------------------------

    def ready(self, in_thread: Any) -> Deferred[None]:
        """Fires once the index is read from disk (read on the first call)."""
        if self._loaded:
            return succeed(None)
        waiter = self._loading.wait()
        if not self._reading:
            self._reading = True
            d: Deferred[list[dict[str, Any]]] = in_thread(self._read_index)

            def loaded(found: list[dict[str, Any]]) -> None:
                for record in sorted(found, key=lambda r: r["created_at"]):
                    self.records.setdefault(record["id"], record)
                self._loaded, self._reading = True, False
                self._loading.fire(None)

            def failed(f: Failure) -> None:
                self._reading = False  # the next call tries again
                self._loading.fail(_os_failure(f))

            d.addCallbacks(loaded, failed)
        return waiter

    def _read_index(self) -> list[dict[str, Any]]:
        # Not made here: listing, reading or deleting needs no store on
        # disk (a read-only home has none), only storing a file does.
        found = []
        try:
            with os.scandir(self.root) as entries:
                names = {e.name for e in entries}
        except FileNotFoundError:
            return []
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            file_id = name[: -len(".json")]
            try:
                with open(os.path.join(self.root, name), "rb") as f:
                    record = json.loads(f.read(64 * 1024))
            except (OSError, ValueError):
                continue
            if (
                not isinstance(record, dict)
                or record.get("id") != file_id
                or f"{file_id}.bin" not in names
                or any(k not in record for k in _FIELDS)
            ):
                continue
            found.append({k: record[k] for k in _FIELDS})
        return found

    def usage(self, owner: str) -> tuple[int, int]:
        """``(files, bytes)`` of ``owner``, creates under way included."""
        count, size = self.reserved.get(owner, (0, 0))
        for record in self.records.values():
            if record["owner"] == owner:
                count += 1
                size += record["bytes"]
        return count, size

    def find(self, owner: str, file_id: str) -> dict[str, Any] | None:
        """The record of ``owner``'s file ``file_id``."""
        record = self.records.get(file_id)
        return record if record is not None and record["owner"] == owner else None

    def path(self, record: dict[str, Any]) -> str:
        """Where the bytes of ``record`` are."""
        return os.path.join(self.root, f"{record['id']}.bin")

    # -- changes -------------------------------------------------------------

    def add(
        self, in_thread: Any, owner: str, filename: str, purpose: str, data: bytes
    ) -> Deferred[dict[str, Any]]:
        """
        Store ``data`` as a new file of ``owner``; the record is listed
        only once bytes and record are both on disk.
        """
        record: dict[str, Any] = {
            "id": new_file_id(),
            "owner": owner,
            "filename": filename,
            "purpose": purpose,
            "bytes": len(data),
            "created_at": int(time.time()),
        }
        count, size = self.reserved.get(owner, (0, 0))
        self.reserved[owner] = (count + 1, size + len(data))

        def write() -> None:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            try:
                write_private(os.path.join(self.root, f"{record['id']}.bin"), data)
                write_private(
                    os.path.join(self.root, f"{record['id']}.json"),
                    json.dumps(record).encode(),
                )
            except BaseException:
                remove_if_there(self.path(record))
                raise

        def release(result: Any) -> Any:
            count, size = self.reserved.pop(owner, (1, len(data)))
            if count > 1:
                self.reserved[owner] = (count - 1, size - len(data))
            return result

        def stored(_: None) -> dict[str, Any]:
            self.records[record["id"]] = record
            return record

        d: Deferred[None] = in_thread(write)
        d.addBoth(release)
        d.addErrback(_os_failure)
        return d.addCallback(stored)

    def remove(self, in_thread: Any, record: dict[str, Any]) -> Deferred[None]:
        """Forget ``record`` now and remove its entries from disk."""
        self.records.pop(record["id"], None)

        def unlink() -> None:
            remove_if_there(os.path.join(self.root, f"{record['id']}.json"))
            remove_if_there(self.path(record))

        d: Deferred[None] = in_thread(unlink)
        return d.addErrback(_os_failure)

    def read(self, in_thread: Any, record: dict[str, Any]) -> Deferred[bytes]:
        """The bytes of ``record``."""

        def read() -> bytes:
            with open(self.path(record), "rb") as f:
                return f.read(record["bytes"] + 1)

        d: Deferred[bytes] = in_thread(read)
        return d.addErrback(_os_failure)


#: What the kernel answers where the daemon may not write at all.
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _client_error(error: BaseException) -> BaseException:
    """A disk error as the client sees it (never a traceback)."""
    if isinstance(error, ApiError) or not isinstance(error, OSError):
        return error
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return insufficient_storage()
    where = f" ({error.filename})" if error.filename else ""
    if error.errno in _UNWRITABLE:
        # The state directory cannot be written (the daemon's user has no
        # home, or a read-only one, as in a read-only container): nothing
        # a retry changes, and the operator's to fix.
        return unavailable(
            f"the file store cannot be written: {error.strerror}{where}; start "
            "the daemon with --state-dir on a writable disk",
            "OSError",
        )
    return internal(f"the file store failed: {error.strerror}{where}", "OSError")


def _os_failure(failure: Failure) -> Failure:
    """``failure`` with a disk error replaced by :func:`_client_error`'s."""
    error = failure.value
    return failure if error is None else Failure(_client_error(error))
