"""
The webhook delivery queues in memory, on a clock: the backoff between
attempts, giving up, and the bounds per identity (waiting and in flight).
The wire (signatures, a real receiver) is in ``test_webhooks``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.openai_api import webhooks
from sandboxd.policy import defaults


class FakeAudit:
    """The audit trail, as the records written to it."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.lines.append(record)


class FakeContext:
    """What the deliveries ask of the daemon: a clock and an audit trail."""

    def __init__(self) -> None:
        self.reactor = Clock()
        self.audit = FakeAudit()


class DeliveryTests(SynchronousTestCase):
    """Deliveries with every attempt answered by the test."""

    def setUp(self) -> None:
        self.context = FakeContext()
        self.endpoints: dict[str, dict[str, Any]] = {
            "we_1": {
                "id": "we_1",
                "owner": "alice",
                "url": "https://hooks.example.com/x",
                "secret": webhooks.new_secret(),
                "event_types": ["agent.session.idle"],
            }
        }
        self.deliveries = webhooks.Deliveries(self.context, self.endpoints)  # type: ignore[arg-type]
        self.attempts: list[tuple[str, Deferred[int]]] = []

        def attempt(context: Any, url: str, secret: str, event: Any) -> Any:
            d: Deferred[int] = Deferred()
            self.attempts.append((event["id"], d))
            return d

        self.patch(webhooks, "attempt", attempt)

    def emit(self, owner: str = "alice") -> None:
        self.deliveries.emit(owner, "agent.session.idle", {"id": "agsess_1"})

    def test_backoff_then_give_up(self) -> None:
        """
        A failing receiver is tried again after each backoff, with the same
        event id, and given up after the last attempt.
        """
        self.emit()
        for n, delay in enumerate(defaults.WEBHOOK_BACKOFF_SECONDS):
            self.assertEqual(len(self.attempts), n + 1)
            self.attempts[-1][1].callback(500)
            self.context.reactor.advance(delay - 0.5)
            self.assertEqual(len(self.attempts), n + 1)
            self.context.reactor.advance(0.5)
        self.assertEqual(len(self.attempts), defaults.WEBHOOK_ATTEMPTS)
        self.assertEqual(len({event_id for event_id, _ in self.attempts}), 1)
        self.attempts[-1][1].callback(503)
        self.context.reactor.advance(3600)
        self.assertEqual(len(self.attempts), defaults.WEBHOOK_ATTEMPTS)
        self.assertEqual(self.deliveries.counts["failed"], 1)

    def test_each_attempt_audited(self) -> None:
        """
        Every attempt is one audit line naming the webhook endpoint, the
        event, the attempt's number, the receiver's status and the
        outcome; none carries the secret, the URL or the body.
        """
        self.emit()
        self.attempts[0][1].callback(500)
        self.context.reactor.advance(defaults.WEBHOOK_BACKOFF_SECONDS[0])
        self.attempts[1][1].errback(webhooks.DeliveryFailed("refused"))
        self.context.reactor.advance(defaults.WEBHOOK_BACKOFF_SECONDS[1])
        self.attempts[2][1].callback(204)
        lines = self.context.audit.lines
        self.assertEqual(
            [
                (r["event"], r["webhook_endpoint_id"], r["attempt"], r["status"])
                for r in lines
            ],
            [
                ("webhook_delivery", "we_1", n, s)
                for n, s in ((1, 500), (2, 0), (3, 204))
            ],
        )
        self.assertEqual(
            [(r["result"], r["code"], r["decision"]) for r in lines],
            [
                ("retrying", None, "deny"),
                ("retrying", "upstream_unavailable", "deny"),
                ("delivered", None, "allow"),
            ],
        )
        self.assertEqual({r["identity"] for r in lines}, {"alice"})
        self.assertEqual({r["event_type"] for r in lines}, {"agent.session.idle"})
        self.assertEqual(len({r["event_id"] for r in lines}), 1)
        self.assertEqual(lines[1]["reason"], "refused")
        text = repr(lines)
        for hidden in (
            self.endpoints["we_1"]["secret"],
            "hooks.example.com",
            "agsess_1",
        ):
            self.assertNotIn(hidden, text)

    def test_success_ends_it(self) -> None:
        """A 2xx is the end of a delivery: no retry."""
        self.emit()
        self.attempts[0][1].callback(204)
        self.context.reactor.advance(3600)
        self.assertEqual(len(self.attempts), 1)
        self.assertEqual(self.deliveries.counts["delivered"], 1)

    def test_unreachable_is_retried(self) -> None:
        """A receiver that cannot be reached is retried like a 5xx."""
        self.emit()
        self.attempts[0][1].errback(webhooks.DeliveryFailed("refused"))
        self.context.reactor.advance(defaults.WEBHOOK_BACKOFF_SECONDS[0])
        self.assertEqual(len(self.attempts), 2)

    def test_bounds_per_identity(self) -> None:
        """
        At most WEBHOOK_IN_FLIGHT_PER_IDENTITY attempts run at once, at most
        WEBHOOK_QUEUE_PER_IDENTITY deliveries are held (the rest dropped);
        another identity's are not held back.
        """
        for _ in range(defaults.WEBHOOK_QUEUE_PER_IDENTITY + 10):
            self.emit()
        self.assertEqual(len(self.attempts), defaults.WEBHOOK_IN_FLIGHT_PER_IDENTITY)
        self.assertEqual(self.deliveries.counts["dropped"], 10)
        self.endpoints["we_2"] = {
            **self.endpoints["we_1"],
            "id": "we_2",
            "owner": "bob",
        }
        self.emit("bob")
        self.assertEqual(
            len(self.attempts), defaults.WEBHOOK_IN_FLIGHT_PER_IDENTITY + 1
        )
        self.attempts[0][1].callback(200)
        self.assertEqual(
            len(self.attempts), defaults.WEBHOOK_IN_FLIGHT_PER_IDENTITY + 2
        )

    def test_deleted_endpoint_gets_nothing_more(self) -> None:
        """A retry after the endpoint was deleted is not sent."""
        self.emit()
        self.attempts[0][1].callback(500)
        del self.endpoints["we_1"]
        self.context.reactor.advance(3600)
        self.assertEqual(len(self.attempts), 1)


class SigningTests(SynchronousTestCase):
    """The Standard Webhooks signature, computed independently."""

    def test_signature(self) -> None:
        """v1, then the base64 HMAC-SHA256 of id.timestamp.body under the secret's key."""
        key = b"k" * 32
        secret = "whsec_" + base64.b64encode(key).decode()
        signed = webhooks.sign(secret, "evt_1", 1700000000, b'{"a":1}')
        digest = hmac.new(key, b'evt_1.1700000000.{"a":1}', hashlib.sha256).digest()
        self.assertEqual(signed, "v1," + base64.b64encode(digest).decode())
