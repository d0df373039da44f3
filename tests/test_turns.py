"""
:func:`sandboxd.turns.after_next_poll`: work put behind the input the
reactor has ready.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from sandboxd.turns import after_next_poll
from tests.helpers import ReadyPipe


class AfterNextPollTests(TestCase):
    """What is put off runs after the reactor's next read, not before it."""

    timeout = 10

    @inlineCallbacks
    def test_input_made_ready_in_a_read_is_read_first(self) -> Any:
        """
        Work put off in one read, with another input made ready in that same
        read, runs after that input is read (a plain ``callLater(0)`` would
        run before it).
        """
        order: list[str] = []
        done: Deferred[None] = Deferred()
        later = ReadyPipe(lambda: order.append("read"))
        self.addCleanup(later.close)

        def put_off() -> None:
            order.append("put off")
            done.callback(None)

        def first_read() -> None:
            after_next_poll(reactor, put_off)
            os.write(later.write_fd, b"x")
            reactor.addReader(later)  # type: ignore[attr-defined]

        first = ReadyPipe(first_read)
        self.addCleanup(first.close)
        os.write(first.write_fd, b"x")
        reactor.addReader(first)  # type: ignore[attr-defined]
        yield done
        yield deferLater(reactor, 0, lambda: None)
        self.assertEqual(order, ["read", "put off"])
