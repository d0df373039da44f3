"""
What the file-route security tests build and look at: base64 bodies,
archives, and the tree a client could find under a directory.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
from typing import Any


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tree(root: str) -> list[str]:
    """Every path below ``root``, relative, sorted (what a client could find)."""
    found = []
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            found.append(os.path.relpath(os.path.join(top, name), root))
    return sorted(found)


def tar_gz(members: list[tuple[str, Any]]) -> bytes:
    """A tar.gz of ``(name, bytes)`` files and ``(name, ("link", target))`` links."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, tuple):
                info.type = tarfile.SYMTYPE
                info.linkname = content[1]
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()
