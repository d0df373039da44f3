"""
Where ``sandboxd cp`` keeps the id of an upload that did not finish, so
that the same ``cp`` run again carries it on instead of starting over.

One small JSON file per (daemon URL, remote path, local file) under
``$XDG_CACHE_HOME/sandboxd/uploads/`` (default ``~/.cache``), holding the
upload id and the local file's size and mtime when it began: a local file
that changed since starts a new upload.  The file is removed once the
upload completes; the daemon forgets an idle upload after an hour, and a
stale id then just starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/sandboxd/uploads`` (or ``~/.cache/sandboxd/uploads``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "sandboxd", "uploads")


class UploadIds:
    """
    The remembered upload of one local file to one remote path.

    :param url: the daemon's base URL.
    :param remote: the remote path as given to ``cp``.
    :param local: the local file.
    """

    def __init__(self, url: str, remote: str, local: str) -> None:
        self.local = os.path.realpath(local)
        self.url = url.rstrip("/")
        self.remote = remote
        key = json.dumps([self.url, remote, self.local]).encode()
        name = hashlib.sha256(key).hexdigest()[:32] + ".json"
        self.path = os.path.join(cache_dir(), name)

    def _identity(self) -> dict[str, Any]:
        st = os.stat(self.local)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def load(self) -> str | None:
        """The id of a cut upload of this very file, or None."""
        try:
            with open(self.path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("file") != self._identity():
            return None
        upload_id = saved.get("upload_id")
        return upload_id if isinstance(upload_id, str) else None

    def save(self, upload_id: str) -> None:
        """
        Remember ``upload_id`` (written whole, readable by this user only);
        a cache that cannot be written only loses the resume, not the upload.
        """
        try:
            self._write(upload_id)
        except OSError:
            pass

    def _write(self, upload_id: str) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        record = {
            "upload_id": upload_id,
            "url": self.url,
            "remote": self.remote,
            "local": self.local,
            "file": self._identity(),
        }
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)

    def clear(self) -> None:
        """The upload completed: forget it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
