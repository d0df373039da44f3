# -*- test-case-name: tests.test_turns -*-
"""
Work that can wait for the reactor to read what is ready first.

When the clients of a burst leave together (a load generator stopping with
a request in flight on each connection), the reactor learns of every loss
in one read, and each loss starts work: the call's handler cancelled, its
child's tree killed and looked over for survivors.  A new client that
connected meanwhile waited for all of it before its connection was even
accepted.  What :func:`after_next_poll` is given runs only once the
reactor has read the input that is ready by then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def after_next_poll(clock: Any, f: Callable[[], object]) -> None:
    """
    Call ``f`` on the reactor's next turn but one: after the I/O ready
    meanwhile has been read.

    A timed call added while the reactor runs its timed calls waits for the
    turn after, so the hop is one ``callLater(0)`` inside another (on a
    test's ``Clock``, one ``advance(0)`` runs both).
    """
    clock.callLater(0, clock.callLater, 0, f)
