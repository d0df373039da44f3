# -*- test-case-name: tests.security.test_files -*-
"""
Where one file system ends and another begins: the mount an entry is on.

A recursive delete must not reach into a volume mounted inside its tree, a
mount point itself can be neither removed nor renamed, and a copy to
another file system must not carry a mounted volume along: each asks
these.  ``st_dev`` alone cannot tell a directory bind-mounted from the
same file system, so the ``statx`` mount id is asked as well.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

from sandboxd.libc import libc

_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_MNT_ID = 0x1000
_STATX_MNT_ID_OFFSET = 144  # struct statx: __u64 stx_mnt_id


def mount_id(dir_fd: int, name: str) -> int | None:
    """
    The id of the mount ``name`` is on (``statx`` ``STX_MNT_ID``), or None
    where the kernel or C library cannot say.  Unlike ``st_dev`` it tells a
    bind mount of a directory of the same file system from the directory
    it sits in.
    """
    statx = getattr(libc(), "statx", None)
    if statx is None:
        return None
    buffer = ctypes.create_string_buffer(256)
    if statx(dir_fd, os.fsencode(name), _AT_SYMLINK_NOFOLLOW, _STATX_MNT_ID, buffer):
        return None
    mask = int.from_bytes(buffer.raw[:4], sys.byteorder)
    if not mask & _STATX_MNT_ID:
        return None
    start = _STATX_MNT_ID_OFFSET
    return int.from_bytes(buffer.raw[start : start + 8], sys.byteorder)


def mount_of(dir_fd: int, name: str) -> tuple[int, int | None]:
    """The device and mount id of ``name`` in ``dir_fd`` (``"."``: the directory)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return st.st_dev, mount_id(dir_fd, name)


def on_another_mount(dir_fd: int, name: str, mount: tuple[int, int | None]) -> bool:
    """
    Whether ``name`` sits on another mount than ``mount`` (a missing one
    does not).  The device tells only for a directory: overlayfs (a
    container's root) may give a file the device of the layer it comes
    from, so a file is told by its mount id alone.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    device, top_id = mount
    here = mount_id(dir_fd, name) if top_id is not None else None
    if here is not None and here != top_id:
        return True
    return stat.S_ISDIR(st.st_mode) and st.st_dev != device
