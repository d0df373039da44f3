"""
:mod:`sandboxd.web.dispatch`: a call whose client leaves is audited at
once and its handler cancelled once the reactor has read what else is
ready.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.endpoints import CapabilityGroup
from sandboxd.routes import builtin_table
from sandboxd.testing import MemoryAudit, MemoryDaemon


class ClientGoneTests(SynchronousTestCase):
    """A client that leaves in the middle of a call."""

    def test_audited_now_cancelled_after_the_next_reads(self) -> None:
        """
        The call's 499 is audited in the loss itself; its handler is
        cancelled on the reactor's turn after (``advance(0)`` on the test's
        clock), so a new client whose request is ready is read first.
        """
        cancelled: list[bool] = []

        def handler(request: Any) -> Deferred[dict[str, Any]]:
            return Deferred(lambda _: cancelled.append(True))

        table = builtin_table()
        table.register("GET", "/wait", handler, CapabilityGroup.SYSTEM)
        daemon = MemoryDaemon(table=table)
        protocol = daemon.site.buildProtocol(None)
        protocol.makeConnection(StringTransport())
        protocol.dataReceived(b"GET /wait HTTP/1.1\r\nHost: localhost\r\n\r\n")
        protocol.connectionLost(Failure(ConnectionDone()))
        audit = daemon.context.audit
        assert isinstance(audit, MemoryAudit)
        self.assertEqual(
            [(line["status"], line["code"]) for line in audit.lines],
            [(499, "client_closed")],
        )
        self.assertEqual(cancelled, [])
        daemon.context.reactor.advance(0)  # type: ignore[attr-defined]
        self.assertEqual(cancelled, [True])
