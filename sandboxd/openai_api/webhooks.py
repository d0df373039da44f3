# -*- test-case-name: tests.openai_api.test_webhooks -*-
"""
Webhook deliveries of the ``/v1`` door: signed the Standard Webhooks way,
sent without blocking, retried with backoff.

An event (``agent.session.idle``…) goes to every endpoint of the session's
owner that subscribed to its type, as OpenAI's envelope ``{id, object:
"event", created_at, type, data}``, with the headers ``webhook-id`` (the
event's id, the same on every attempt, so a receiver can drop a repeat),
``webhook-timestamp`` (this attempt's) and ``webhook-signature`` (``v1,``
and the base64 HMAC-SHA256 of ``id.timestamp.body`` under the endpoint's
``whsec_`` secret) — what ``client.webhooks.unwrap`` and the
``standardwebhooks`` package verify.

Delivery (the seed sends once, from a thread, and forgets): each attempt
is a POST through Twisted's ``Agent`` bounded by
:data:`~sandboxd.policy.defaults.WEBHOOK_TIMEOUT_SECONDS`, redirects not
followed; anything but a 2xx is retried after
:data:`~sandboxd.policy.defaults.WEBHOOK_BACKOFF_SECONDS`, then given up.
Each identity has at most
:data:`~sandboxd.policy.defaults.WEBHOOK_QUEUE_PER_IDENTITY` deliveries
waiting or being retried (a new event past that is dropped and logged)
and :data:`~sandboxd.policy.defaults.WEBHOOK_IN_FLIGHT_PER_IDENTITY` in
flight.

Every attempt is one audit line (``"event": "webhook_delivery"``): the
webhook endpoint's id, the event's type and id, the attempt's number, the
receiver's status and what became of the delivery (``delivered``,
``retrying``, ``failed``, ``skipped``), never the secret, the URL or the
body.

Where a delivery may go is the policy's network rule for the
``agents_webhooks_create`` endpoint: ``url_schemes``, ``url_allow`` and
``url_deny``, and ``block_private_networks`` — on unless a policy layer
sets it (as for git: a webhook URL is a way to make the daemon reach its
own network).  The host is resolved at every attempt, each address
checked, and the connection made to the checked address (a second lookup
cannot land elsewhere).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import time
from collections import deque
from io import BytesIO
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from sandboxd.access.audit import make_record
from sandboxd.browser.urlpolicy import (
    UrlTarget,
    ip_literal,
    is_loopback_name,
    is_private_address,
)
from sandboxd.daemon.context import as_clock
from sandboxd.errors import ApiError, Code, bad_request, forbidden, policy_rule
from sandboxd.openai_api.face import new_id
from sandboxd.policy import defaults

if TYPE_CHECKING:
    from sandboxd.daemon.context import Context
    from sandboxd.eventlog import Event
    from sandboxd.openai_api.face import SessionFace
    from sandboxd.policy.rules import EffectiveRule

log = logging.getLogger(__name__)

#: The event types sent: the seed's four, and ``action_required`` (a
#: session waits for an approval, which the seed never asks for).
EVENT_TYPES = (
    "agent.session.created",
    "agent.session.in_progress",
    "agent.session.idle",
    "agent.session.failed",
    "agent.session.action_required",
)

#: The endpoint whose rule says where deliveries may go.
RULE_ENDPOINT = "agents_webhooks_create"

_USER_AGENT = b"sandboxd-webhooks"


def new_secret() -> str:
    """A signing secret: ``whsec_`` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, payload: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` and the base64 HMAC-SHA256."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + payload
    return (
        "v1,"
        + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    )


def envelope(type: str, data: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's webhook event object."""
    return {
        "id": new_id("evt_"),
        "object": "event",
        "created_at": int(time.time()),
        "type": type,
        "data": data,
    }


# -- where a delivery may go -------------------------------------------------------


def blocks_private(rule: EffectiveRule) -> bool:
    """Private networks are refused unless a policy layer says otherwise."""
    if rule.source("params.block_private_networks") is None:
        return True
    return rule.params.block_private_networks


def check_url(url: Any, rule: EffectiveRule) -> str:
    """
    A webhook URL the policy allows, as far as can be said without a
    lookup (a loopback name, a private literal).

    :raises ApiError: 400 ``invalid_param`` for a malformed URL; 403
        ``url_not_allowed`` (with the rule) for one the policy refuses.
    """
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise bad_request("url must be an http(s) URL", param="url")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise bad_request(f"url is not a valid URL: {url!r}", param="url") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise bad_request("url must be an http or https URL with a host", param="url")
    if parts.username is not None or parts.password is not None:
        raise bad_request("url must not hold credentials", param="url")
    if parts.query or parts.fragment:
        raise bad_request("url must not hold a query string or a fragment", param="url")
    if scheme not in rule.params.url_schemes:
        raise _refused(
            f"{scheme} URLs are not allowed here",
            policy_rule(rule, "params.url_schemes"),
        )
    target = UrlTarget.of(url)
    assert target is not None  # a scheme and a host, checked above
    refused = rule.params.url_refusal(target)
    if refused is not None:
        why, leaf = refused
        raise _refused(f"the URL is {why}", policy_rule(rule, leaf))
    literal = ip_literal(parts.hostname)
    check_addresses(
        parts.hostname, [literal] if literal is not None else [], rule, named=True
    )
    return url


def check_addresses(
    host: str, addresses: list[str], rule: EffectiveRule, named: bool = False
) -> None:
    """
    Refuse a host that is this machine or resolves to a private address
    while the policy blocks private networks.
    """
    if not blocks_private(rule):
        return
    source = policy_rule(rule, "params.block_private_networks")
    if is_loopback_name(host):
        raise _refused(f"{host} is this machine, a private network host", source)
    for address in addresses:
        if is_private_address(address):
            raise _refused(f"{host} is a private network address ({address})", source)
    if not addresses and not named:
        raise _refused(f"{host} does not resolve", source)


async def check_destination(context: Context, url: Any, rule: EffectiveRule) -> str:
    """
    :func:`check_url`, then the addresses its host resolves to now (a
    name that does not resolve yet is let through: each attempt resolves
    it again and checks).
    """
    checked = check_url(url, rule)
    parts = urlsplit(checked)
    host = parts.hostname or ""
    if ip_literal(host) is None and blocks_private(rule):
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await context.in_thread(_resolve, host, port)
        check_addresses(host, addresses, rule, named=True)
    return checked


def _refused(message: str, rule: str) -> ApiError:
    return forbidden(message, Code.URL_NOT_ALLOWED, rule=rule, param="url")


def _resolve(host: str, port: int) -> list[str]:
    """Every address of ``host`` (blocking: run in a thread)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


# -- one attempt -----------------------------------------------------------------


class DeliveryFailed(Exception):
    """The receiver could not be reached, or the policy refused it now."""


class _Drain(Protocol):
    """Reads (and drops) the receiver's answer, up to a bound."""

    def __init__(self, done: Deferred[None]) -> None:
        self.done = done
        self.seen = 0

    def dataReceived(self, data: bytes) -> None:
        self.seen += len(data)
        if self.seen > defaults.WEBHOOK_ANSWER_BYTES and self.transport is not None:
            # The body's transport is a producer (twisted.web's response).
            self.transport.stopProducing()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if not self.done.called:
            self.done.callback(None)


def _pinned_factory(reactor: Any, address: str) -> Any:
    from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
    from twisted.internet.ssl import optionsForClientTLS
    from twisted.web.iweb import IAgentEndpointFactory

    @implementer(IAgentEndpointFactory)
    class Pinned:
        """Connects to the address that was checked, whatever the URL's host."""

        def endpointForURI(self, uri: Any) -> Any:
            endpoint = HostnameEndpoint(
                reactor, address, uri.port, defaults.WEBHOOK_TIMEOUT_SECONDS
            )
            if uri.scheme == b"https":
                host = uri.host.decode("ascii")
                return wrapClientTLS(optionsForClientTLS(host), endpoint)
            return endpoint

    return Pinned()


async def attempt(
    context: Context, url: str, secret: str, event: dict[str, Any]
) -> int:
    """
    POST ``event`` to ``url`` once, signed now; the receiver's status.

    :raises DeliveryFailed: unreachable, timed out, or refused by the
        policy in force.
    """
    from twisted.web.client import Agent, FileBodyProducer
    from twisted.web.http_headers import Headers

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    rule = context.policy.rule(RULE_ENDPOINT)
    literal = ip_literal(host)
    addresses = [literal] if literal else await context.in_thread(_resolve, host, port)
    try:
        check_url(url, rule)
        check_addresses(host, addresses, rule)
    except ApiError as e:
        raise DeliveryFailed(e.message) from None
    if not addresses:
        raise DeliveryFailed(f"{host} does not resolve")
    payload = json.dumps(event, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = Headers(
        {
            b"content-type": [b"application/json"],
            b"user-agent": [_USER_AGENT],
            b"webhook-id": [event["id"].encode()],
            b"webhook-timestamp": [str(timestamp).encode()],
            b"webhook-signature": [
                sign(secret, event["id"], timestamp, payload).encode()
            ],
        }
    )
    reactor = as_clock(context.reactor)
    agent = Agent.usingEndpointFactory(reactor, _pinned_factory(reactor, addresses[0]))
    d = agent.request(
        b"POST", url.encode(), headers, FileBodyProducer(BytesIO(payload))
    )
    d.addTimeout(defaults.WEBHOOK_TIMEOUT_SECONDS, reactor)
    try:
        response = await d
        drained: Deferred[None] = Deferred()
        response.deliverBody(_Drain(drained))
        drained.addTimeout(defaults.WEBHOOK_TIMEOUT_SECONDS, reactor)
        await drained
    except Exception as e:
        raise DeliveryFailed(
            f"the receiver could not be reached ({type(e).__name__})"
        ) from None
    return int(response.code)


# -- the queues ------------------------------------------------------------------


@attrs.define
class Delivery:
    """One event on its way to one endpoint."""

    owner: str
    endpoint_id: str
    event: dict[str, Any]
    attempts: int = 0
    #: When the latest attempt began (``time.monotonic()``), for its audit line.
    started: float = 0.0


class Deliveries:
    """
    Every identity's deliveries: waiting, in flight, or waiting to be
    retried, each bounded.

    :ivar endpoints: the webhook endpoints by id (the registry's), read at
        each attempt: a deleted endpoint gets nothing more, a rotated
        secret signs the next attempt.
    """

    def __init__(self, context: Context, endpoints: dict[str, dict[str, Any]]) -> None:
        self.context = context
        self.endpoints = endpoints
        self._waiting: dict[str, deque[Delivery]] = {}
        self._held: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._retries: set[Any] = set()
        #: Counts, for the logs and the tests: sent, retried, given up, dropped.
        self.counts = {"delivered": 0, "retried": 0, "failed": 0, "dropped": 0}

    def emit(self, owner: str, type: str, data: dict[str, Any]) -> None:
        """``type`` happened to ``owner``'s session: tell its endpoints."""
        targets = [
            e
            for e in self.endpoints.values()
            if e["owner"] == owner and type in e["event_types"]
        ]
        if not targets:
            return
        event = envelope(type, data)
        for endpoint in targets:
            if self._held.get(owner, 0) >= defaults.WEBHOOK_QUEUE_PER_IDENTITY:
                self.counts["dropped"] += 1
                log.warning(
                    "webhook %s for %s dropped: %d deliveries already wait",
                    type,
                    endpoint["id"],
                    defaults.WEBHOOK_QUEUE_PER_IDENTITY,
                )
                continue
            self._held[owner] = self._held.get(owner, 0) + 1
            self._waiting.setdefault(owner, deque()).append(
                Delivery(owner, endpoint["id"], event)
            )
        self._pump(owner)

    def _pump(self, owner: str) -> None:
        waiting = self._waiting.get(owner)
        while (
            waiting
            and self._in_flight.get(owner, 0) < defaults.WEBHOOK_IN_FLIGHT_PER_IDENTITY
        ):
            delivery = waiting.popleft()
            self._in_flight[owner] = self._in_flight.get(owner, 0) + 1
            Deferred.fromCoroutine(self._send(delivery))

    async def _send(self, delivery: Delivery) -> None:
        owner = delivery.owner
        endpoint = self.endpoints.get(delivery.endpoint_id)
        status: int | None = None
        why = "the endpoint was deleted"
        delivery.started = time.monotonic()
        if endpoint is not None:
            delivery.attempts += 1
            try:
                status = await attempt(
                    self.context, endpoint["url"], endpoint["secret"], delivery.event
                )
                why = f"status {status}"
            except DeliveryFailed as e:
                why = str(e)
            except Exception as e:  # never let one delivery stop the others
                why = f"{type(e).__name__}: {e}"
        self._in_flight[owner] -= 1
        if status is not None and 200 <= status < 300:
            self.counts["delivered"] += 1
            self._audit(delivery, status, "delivered", None)
            self._release(owner)
        elif endpoint is not None and delivery.attempts < defaults.WEBHOOK_ATTEMPTS:
            self.counts["retried"] += 1
            self._audit(delivery, status, "retrying", why)
            delay = defaults.WEBHOOK_BACKOFF_SECONDS[delivery.attempts - 1]
            log.info(
                "webhook %s to %s: %s; attempt %d in %gs",
                delivery.event["type"],
                delivery.endpoint_id,
                why,
                delivery.attempts + 1,
                delay,
            )
            call = self.context.reactor.callLater(delay, self._retry, delivery)
            self._retries.add(call)
        else:
            self.counts["failed"] += 1
            result = "failed" if endpoint is not None else "skipped"
            self._audit(delivery, status, result, why)
            log.warning(
                "webhook %s to %s given up after %d attempts: %s",
                delivery.event["type"],
                delivery.endpoint_id,
                delivery.attempts,
                why,
            )
            self._release(owner)
        self._pump(owner)

    def _audit(
        self, delivery: Delivery, status: int | None, result: str, why: str | None
    ) -> None:
        """
        One audit line for one attempt: which endpoint, which event, which
        attempt, what came of it; nothing a receiver could be impersonated
        or read with (no secret, URL or body).
        """
        record = make_record(
            identity=delivery.owner,
            endpoint=None,
            method="POST",
            path="",
            query="",
            status=status or 0,
            # A receiver that answered (even 5xx) was reached; one that did
            # not answer is an upstream that was not there.
            code=(
                None
                if status or result == "skipped"
                else str(Code.UPSTREAM_UNAVAILABLE)
            ),
            rule=None,
            started=delivery.started,
            bytes_in=0,
            bytes_out=0,
            client="",
        )
        record.update(
            via="openai",
            event="webhook_delivery",
            webhook_endpoint_id=delivery.endpoint_id,
            event_type=delivery.event["type"],
            event_id=delivery.event["id"],
            attempt=delivery.attempts,
            result=result,
            reason=None if why is None else why[:200],
            # A failure is any attempt that did not deliver, whatever the
            # receiver's status (a redirect, a 500, none at all).
            decision="allow" if result == "delivered" else "deny",
        )
        self.context.audit.write(record)

    def _retry(self, delivery: Delivery) -> None:
        self._retries = {c for c in self._retries if c.active()}
        self._waiting.setdefault(delivery.owner, deque()).append(delivery)
        self._pump(delivery.owner)

    def _release(self, owner: str) -> None:
        self._held[owner] -= 1

    def stop(self) -> None:
        """The daemon stops: pending retries are dropped (they were best effort)."""
        for call in self._retries:
            if call.active():
                call.cancel()
        self._retries.clear()
        self._waiting.clear()


# -- what a session sends -----------------------------------------------------------

#: A session's projected event → the webhook event it is.
_SENT = {
    "agent.session.in_progress": "agent.session.in_progress",
    "agent.session.idle": "agent.session.idle",
    "agent.session.requires_action": "agent.session.action_required",
    "agent.session.turn.failed": "agent.session.failed",
    "agent.session.failed": "agent.session.failed",
}


def follow_session(
    deliveries: Deliveries, face: SessionFace, created: bool = True
) -> None:
    """
    Send ``face``'s webhook events as they happen: ``created`` now (unless
    it is a restored session whose agent starts again), then
    ``in_progress``, ``action_required``, ``idle``, and ``failed`` when a
    turn or the session fails (once for a turn that fails with its session).
    """
    data = {
        "id": face.id,
        "environment_type": "self_hosted",
        "environment_id": face.environment.get("id"),
    }
    if created:
        deliveries.emit(face.owner, "agent.session.created", data)
    last: list[str] = [""]

    def on_event(event: Event | None) -> None:
        if event is None:
            return
        sent = _SENT.get(event.event)
        if sent is None or (sent == last[0] == "agent.session.failed"):
            return
        last[0] = sent
        if sent == "agent.session.action_required":
            deliveries.emit(
                face.owner,
                sent,
                {"id": face.id, "required_action": {"type": "mcp_approval_request"}},
            )
        else:
            deliveries.emit(face.owner, sent, data)

    face.log.subscribe(on_event)
