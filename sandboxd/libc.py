"""
The C library, loaded once, for the few calls Python's ``os`` module does
not offer (``openat2``, ``fstatfs``, ``statx``, ``renameat2``, ``prctl``,
``posix_spawn``'s file actions, ``malloc_trim``, ``mallinfo2``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any


@functools.cache
def libc() -> Any:
    """The process's C library (errno kept for ``ctypes.get_errno``), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (``malloc.h``): every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def free_heap_bytes() -> int | None:
    """
    The bytes lying free inside the C library's heap, all arenas (glibc's
    ``mallinfo2``, 2.33 and later), or None where it cannot say.
    """
    c = libc()
    info = getattr(c, "mallinfo2", None)
    if info is None:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


def trim_when_free(
    limit: int,
    free: Callable[[], int | None] = free_heap_bytes,
    trim: Callable[[int], Any] | None = None,
) -> bool:
    """
    Hand the heap's free memory back to the system when more than ``limit``
    bytes of it lie free; whether it did.
    """
    if trim is None:
        trim = getattr(libc(), "malloc_trim", None)
    size = free()
    if trim is None or size is None or size <= limit:
        return False
    trim(0)
    return True


class QuietTrim:
    """
    Hands the heap's free memory back to the system once nothing big has
    been freed for ``delay`` seconds.

    The daemon keeps what a big output frees for the next one
    (:func:`sandboxd.daemon.server.steady_heap`): back-to-back big outputs
    then reuse it instead of faulting it in again. Once they stop, the
    memory goes back, so a daemon that printed a big output once does not
    hold it while idle.

    :param trim: ``malloc_trim`` (the C library's, when it has one).
    """

    def __init__(
        self, reactor: Any, delay: float, trim: Callable[[int], Any] | None = None
    ) -> None:
        self.reactor = reactor
        self.delay = delay
        self._trim = trim if trim is not None else getattr(libc(), "malloc_trim", None)
        self._call: Any = None

    def soon(self) -> None:
        """Something big was freed: trim once ``delay`` passes with no more."""
        if self._trim is None:
            return
        if self._call is not None and self._call.active():
            self._call.reset(self.delay)
            return
        self._call = self.reactor.callLater(self.delay, self._now)

    def _now(self) -> None:
        self._call = None
        if self._trim is not None:
            self._trim(0)

    def cancel(self) -> None:
        """No trim pending (the daemon stops)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
