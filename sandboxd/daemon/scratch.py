# -*- test-case-name: tests.test_scratch -*-
"""
The daemon's scratch directory: one per running daemon in the temporary
directory, holding every private directory it makes there (code contexts'
sockets, spilled display items, ``/v1`` artifacts, the browser's work
directory, git's askpass), and a list of the upload staging files it
keeps beside their targets.

An orderly stop removes each of these; a crash (``SIGKILL``, the OOM
killer) cannot.  So the directory holds a lock the kernel lets go of
when the daemon's process ends, and a start removes what daemons that
are gone left behind: a crashing daemon that a supervisor restarts again
and again does not fill the disk.  The lock, not a pid, tells a dead
daemon's directory from a live one's: many daemons may share the
temporary directory, and a pid is reused.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading

from sandboxd.files.atomic import TEMPORARY_NAME

log = logging.getLogger(__name__)

#: A live (or dead) daemon's scratch directory's name starts so.
PREFIX = "sandboxd-run-"

#: A scratch directory being made (not yet locked) starts so; a sweep
#: leaves it alone.
MAKING = "sandboxd-making-"

#: The file whose lock says the directory's daemon lives.
LOCK = "lock"

#: The upload staging files the daemon keeps beside their targets, one
#: path a line as a JSON string (a name may hold a newline).
STAGING = "staging"


class Scratch:
    """
    This daemon's scratch directory, made on first use (a daemon built
    and never run, as in-memory tests do, makes none).

    :ivar parent: where it is made (the temporary directory by default).
    """

    def __init__(self, parent: str | None = None) -> None:
        self.parent = parent
        self.path: str | None = None
        self._lock: int | None = None
        # Made from the reactor's thread or a copying thread, once.
        self._making = threading.Lock()

    def directory(self) -> str:
        """The scratch directory, made and locked if it is not yet (blocking)."""
        with self._making:
            if self.path is None:
                self.path, self._lock = self._make()
            return self.path

    def _make(self) -> tuple[str, int]:
        """
        Make the directory under a name no sweep takes, lock it, then give
        it the name that says a daemon's lock is in it.
        """
        making = tempfile.mkdtemp(prefix=MAKING, dir=self.parent)
        # Others may pass through to the directories made for them (a code
        # context's kernel runs as the sandbox's user).
        os.chmod(making, 0o711)
        fd = os.open(
            os.path.join(making, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = os.path.join(
            os.path.dirname(making), PREFIX + os.path.basename(making)[len(MAKING) :]
        )
        os.rename(making, path)
        return path, fd

    def mkdtemp(self, prefix: str) -> str:
        """A new private directory in the scratch directory (blocking)."""
        return tempfile.mkdtemp(prefix=prefix, dir=self.directory())

    def staging(self, path: str) -> None:
        """
        Note an upload staging file, so that a start after a crash
        removes it (blocking; one short append).  A note that cannot be
        written costs only that clean-up: the upload goes on.
        """
        try:
            with open(os.path.join(self.directory(), STAGING), "a") as f:
                f.write(json.dumps(path) + "\n")
        except OSError as e:
            log.warning("cannot note the staging file %s: %s", path, e)

    def close(self) -> None:
        """The daemon stops: its scratch directory goes (blocking)."""
        with self._making:
            if self.path is None:
                return
            shutil.rmtree(self.path, ignore_errors=True)
            if self._lock is not None:
                os.close(self._lock)
            self.path = self._lock = None


def sweep(parent: str | None = None) -> list[str]:
    """
    Remove the scratch directories of daemons that are gone, and the
    upload staging files they listed; the paths of the directories
    removed (blocking).
    """
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            fd = os.open(
                os.path.join(entry.path, LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
            )
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its daemon lives
            _remove_staging(os.path.join(entry.path, STAGING))
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


def _remove_staging(listing: str) -> None:
    """Remove the staging files a gone daemon listed that are still there."""
    try:
        with open(listing, encoding="utf-8") as f:
            paths = [json.loads(line) for line in f if line.endswith("\n")]
    except (OSError, ValueError):
        return
    for path in paths:
        # The list is the daemon's own, but only a staging file's name
        # (``.NAME.<hex>[.new].upload``) is removed, and only a file.
        if not isinstance(path, str) or not TEMPORARY_NAME.match(
            os.path.basename(path)
        ):
            continue
        try:
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                log.info("removed %s: an upload a daemon that is gone left", path)
        except OSError:
            pass
