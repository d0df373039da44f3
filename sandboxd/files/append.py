# -*- test-case-name: tests.routes.test_files -*-
"""
``upload`` with ``append``: bytes added to the end of an existing file.

A client whose every request is bounded (an MCP tool call is one message
of at most 1 MiB) writes a bigger file in parts: the first part as a
plain upload, each of the rest appended.  An append is not atomic (it
grows the file in place, as ``>>`` does); each part lands whole or the
call fails.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from sandboxd.access.guard import PathGuard, etag_of, os_error, refuse_device
from sandboxd.errors import (
    bad_request,
    file_not_found,
    insufficient_storage,
    precondition_failed,
)
from sandboxd.files.atomic import etag_matches

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def append_bytes(
    guard: PathGuard, path: str, data: bytes | bytearray, if_match: str | None
) -> dict[str, Any]:
    """
    Append ``data`` to the regular file ``path`` (blocking: in a thread).

    :param if_match: the ETag the file must have before the append (the
        previous part's answer), so a part is not added twice or after
        another writer's.
    :raises ApiError: 404 when the file does not exist (its first part is
        a plain upload), 400 for a directory or special file, 412 for a
        stale ``if_match``, 507 when the disk is full.
    """
    with guard.locate(path, "write", follow=True) as loc:
        if loc.name == "":
            raise bad_request(f"{path} is a directory", type="IsADirectoryError")
        try:
            fd = os.open(loc.name, _APPEND_FLAGS, dir_fd=loc.dir_fd)
        except FileNotFoundError:
            error = file_not_found(path)
            raise error.reworded(
                f"{error.message} (append adds to an existing file: write the "
                "first part without append)"
            ) from None
        except OSError as e:
            raise os_error(e, path) from None
        try:
            st = os.fstat(fd)
            refuse_device(st, path)
            if not stat.S_ISREG(st.st_mode):
                raise bad_request(f"{path} is not a regular file")
            loc.refuse_shared(st, path)
            if if_match is not None and not etag_matches(if_match, etag_of(st)):
                raise precondition_failed(path)
            os.set_blocking(fd, True)
            view = memoryview(data)
            try:
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise insufficient_storage() from None
                raise os_error(e, path) from None
            finally:
                view.release()
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return {
            "path": loc.path,
            "bytes": len(data),
            "size": st.st_size,
            "etag": etag_of(st),
        }
