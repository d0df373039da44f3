# -*- test-case-name: tests.test_audit -*-
"""
The audit file on disk: Twisted's rotated :class:`LogFile`, with each line
landing whole or not at all.

On a full disk a ``write`` can take part of a line and then fail: Twisted's
file would keep the half line, and the next record, once there is room,
would be glued to it (one line no JSON reader can parse).  Here a line
that could not be written whole is cut off again, so the file only ever
holds whole records.  Written from the reactor thread only; imported only
by a daemon that audits to a file.
"""

from __future__ import annotations

import errno
import os

from twisted.python.logfile import LogFile


class AuditFile(LogFile):
    """
    A :class:`LogFile` whose ``write`` appends a whole line or nothing.

    The methods it uses are restated with their types (Twisted's are not
    annotated).
    """

    def __init__(
        self,
        name: str,
        directory: str,
        rotate_bytes: int,
        mode: int,
        keep_files: int,
    ) -> None:
        LogFile.__init__(
            self,
            name,
            directory,
            rotateLength=rotate_bytes,
            defaultMode=mode,
            maxRotatedFiles=keep_files,
        )

    def flush(self) -> None:
        """Push what is buffered to the file."""
        LogFile.flush(self)

    def close(self) -> None:
        """Close the file (it cannot be written to after this)."""
        LogFile.close(self)

    def moved(self) -> bool:
        """
        Whether the file open is no longer the one at its path (renamed
        away, removed, or replaced).
        """
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if not hasattr(self, "_file"):
            return False
        held = os.fstat(self._file.fileno())
        return (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino)

    def reopen(self) -> None:
        """Close the file and open the one at its path (made if it is gone)."""
        if hasattr(self, "_file"):
            LogFile.close(self)
        LogFile._openFile(self)

    def write(self, data: str | bytes) -> None:
        """
        Append ``data`` (one or more whole lines).

        :raises OSError: nothing of ``data`` is in the file (a full disk,
            a quota); the file is as it was before the call.
        """
        if not hasattr(self, "_file"):
            # A rotation closed the file and could not open the next one
            # (``reopen``): try again now.
            LogFile._openFile(self)
        if LogFile.shouldRotate(self):
            self.flush()
            LogFile.rotate(self)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        start = self._file.tell()
        view = memoryview(raw)
        try:
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
        except OSError:
            self._cut_back(start)
            raise
        self.size += len(raw)

    def _cut_back(self, start: int) -> None:
        """Drop what a failed write left after ``start``, and write from there next."""
        try:
            self._file.truncate(start)
            self._file.seek(start)
        except OSError:
            pass
