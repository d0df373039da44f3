"""
The C library, loaded once, for the few calls Python's ``os`` module does
not offer (``openat2``, ``fstatfs``, ``statx``, ``renameat2``, ``prctl``,
``posix_spawn``'s file actions, ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def libc() -> Any:
    """The process's C library (errno kept for ``ctypes.get_errno``), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
