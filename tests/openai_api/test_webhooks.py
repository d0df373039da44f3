"""
Webhook endpoints of the ``/v1`` door, driven by ``client.webhooks``:
deliveries to a loopback receiver are signed the Standard Webhooks way
(verified with the ``standardwebhooks`` package and the SDK's ``unwrap``),
retried with backoff when the receiver fails, and refused for private
hosts unless the policy allows them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from sandboxd.errors import ApiError
from sandboxd.openai_api.webhooks import check_url
from sandboxd.testing import memory_context
from tests.openai_api.sdk import OpenAICase, caught, openai_policy


class Receiver(Resource):
    """A webhook receiver: records every POST; fails the first ``failures``."""

    isLeaf = True

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.received: list[tuple[dict[str, str], bytes, float]] = []

    def render_POST(self, request: Any) -> bytes:
        headers = {
            k.decode().lower(): v[0].decode()
            for k, v in request.requestHeaders.getAllRawHeaders()
        }
        self.received.append((headers, request.content.read(), time.monotonic()))
        if len(self.received) <= self.failures:
            request.setResponseCode(500)
            return b"not now"
        request.setResponseCode(204)
        return b""


class WebhookTests(OpenAICase):
    """Loopback deliveries, allowed by the policy for this test."""

    policy = openai_policy(params={"block_private_networks": False})

    def receiver(self, failures: int = 0) -> tuple[Receiver, str]:
        """A receiver on a loopback port, and its URL."""
        resource = Receiver(failures)
        port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        return resource, f"http://127.0.0.1:{port.getHost().port}/hook"

    @inlineCallbacks
    def until(self, check: Any, seconds: float = 20.0) -> Any:
        """Wait (bounded) until ``check()`` is true."""
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                self.fail("timed out waiting for deliveries")
            yield deferLater(reactor, 0.1, lambda: None)

    @inlineCallbacks
    def test_signed_retried_deliveries(self) -> Any:
        """
        A session's created, in_progress and idle events reach the
        endpoint signed (standardwebhooks and ``client.webhooks.unwrap``
        both verify them, typed as the SDK's events); the first, answered
        500, comes again after the backoff with the same webhook-id and a
        fresh signature.  Each attempt is one audit line naming the
        webhook endpoint, without its secret, URL or the body.
        """
        from standardwebhooks.webhooks import Webhook

        receiver, url = self.receiver(failures=1)
        client = self.client()
        types = [
            "agent.session.created",
            "agent.session.in_progress",
            "agent.session.idle",
        ]

        def register_and_run() -> Any:
            endpoint = client.webhooks.create(url=url, event_types=types, name="ci")
            session = client.beta.agents.sessions.create(**self.session_body())
            with client.beta.agents.sessions.stream(
                session.id, input="echo hooked"
            ) as stream:
                list(stream)
            return endpoint, session

        endpoint, session = yield self.sdk(register_and_run)
        self.assertTrue(endpoint.signing_secret.startswith("whsec_"))
        yield self.until(lambda: len(receiver.received) >= 4)
        verifier = Webhook(endpoint.signing_secret)
        seen = []
        typed = set()
        for headers, body, _ in receiver.received:
            payload = verifier.verify(body, headers)
            unwrapped = client.webhooks.unwrap(
                body, headers, secret=endpoint.signing_secret
            )
            self.assertEqual(unwrapped.type, payload["type"])
            self.assertEqual(unwrapped.data.id, session.id)
            self.assertEqual(headers["webhook-id"], payload["id"])
            seen.append(payload["type"])
            typed.add(type(unwrapped).__name__)
        self.assertEqual(seen.count("agent.session.created"), 2)
        self.assertEqual(sorted(set(seen)), sorted(types))
        first = receiver.received[0]
        again = [
            r
            for r in receiver.received[1:]
            if r[0]["webhook-id"] == first[0]["webhook-id"]
        ]
        [(headers, _, at)] = again
        self.assertGreaterEqual(at - first[2], 0.9)  # the first backoff
        self.assertNotEqual(headers["webhook-signature"], first[0]["webhook-signature"])
        self.assertEqual(
            typed,
            {
                "AgentSessionCreatedWebhookEvent",
                "AgentSessionInProgressWebhookEvent",
                "AgentSessionIdleWebhookEvent",
            },
        )

        def audited() -> list[dict[str, Any]]:
            lines = self.audit_lines()
            return [r for r in lines if r.get("event") == "webhook_delivery"]

        yield self.until(lambda: len(audited()) == len(receiver.received))
        lines = audited()
        self.assertEqual({r["webhook_endpoint_id"] for r in lines}, {endpoint.id})
        self.assertEqual({r["identity"] for r in lines}, {"user"})
        outcomes = sorted((r["attempt"], r["status"], r["result"]) for r in lines)
        self.assertEqual(
            outcomes,
            [(1, 204, "delivered")] * (len(lines) - 2)
            + [(1, 500, "retrying"), (2, 204, "delivered")],
        )
        text = json.dumps(lines)
        for hidden in (endpoint.signing_secret, url, session.id):
            self.assertNotIn(hidden, text)

    @inlineCallbacks
    def test_action_required(self) -> Any:
        """
        A permission request that waits is an ``agent.session.action_required``
        delivery naming the session and the action's type.
        """
        receiver, url = self.receiver()
        client = self.client()
        sessions = client.beta.agents.sessions
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")

        def run() -> Any:
            endpoint = client.webhooks.create(
                url=url, event_types=["agent.session.action_required"], name="a"
            )
            session = sessions.create(**self.session_body())
            with sessions.stream(session.id, input=f"edit {path} new") as stream:
                for event in stream:
                    if event.type == "agent.session.requires_action":
                        action = event.session.required_actions[0]
                        sessions.events.create(
                            session.id,
                            events=[
                                {
                                    "type": "agent.session.input.mcp_approval_request_result",
                                    "request_id": action.request_id,
                                    "response": {
                                        "type": "mcp_tool_call",
                                        "decision": "deny",
                                    },
                                }
                            ],
                        )
            return endpoint, session

        endpoint, session = yield self.sdk(run)
        yield self.until(lambda: len(receiver.received) >= 1)
        [(headers, body, _)] = receiver.received
        event = client.webhooks.unwrap(body, headers, secret=endpoint.signing_secret)
        self.assertEqual(event.type, "agent.session.action_required")
        self.assertEqual(event.data.id, session.id)
        self.assertEqual(event.data.required_action.type, "mcp_approval_request")

    @inlineCallbacks
    def test_endpoint_routes(self) -> Any:
        """
        List, get and update never show the secret; rotate shows a new one;
        test sends one signed event and answers the receiver's status;
        delete forgets it; another identity sees none of it.
        """
        receiver, url = self.receiver()
        client = self.client()
        hooks = client.webhooks

        def run() -> Any:
            made = hooks.create(url=url, event_types=["agent.session.idle"], name="a")
            return (
                made,
                list(hooks.list()),
                hooks.retrieve(made.id),
                hooks.update(made.id, name="b", event_types=["agent.session.failed"]),
                hooks.rotate_secret(made.id),
                hooks.test(made.id, event_type="agent.session.failed"),
                caught(lambda: self.client("o-token").webhooks.retrieve(made.id)),
                list(self.client("o-token").webhooks.list()),
                caught(
                    lambda: hooks.create(
                        url=url, event_types=["batch.completed"], name="x"
                    )
                ),
                hooks.delete(made.id),
                caught(lambda: hooks.retrieve(made.id)),
            )

        (
            made,
            listed,
            got,
            updated,
            rotated,
            tested,
            foreign,
            foreign_list,
            bad_type,
            deleted,
            gone,
        ) = yield self.sdk(run)
        self.assertEqual([w.id for w in listed], [made.id])
        self.assertNotIn("signing_secret", got.model_dump())
        self.assertEqual(
            (updated.name, updated.event_types), ("b", ["agent.session.failed"])
        )
        self.assertNotEqual(rotated.signing_secret, made.signing_secret)
        self.assertEqual((tested.status_code, tested.success), (204, True))
        [(headers, body, _)] = receiver.received
        from standardwebhooks.webhooks import Webhook

        self.assertEqual(
            Webhook(rotated.signing_secret).verify(body, headers)["type"],
            "agent.session.failed",
        )
        self.assertEqual(foreign.status_code, 404)
        self.assertEqual(foreign_list, [])
        self.assertEqual(bad_type.status_code, 400)
        self.assertEqual(bad_type.body["param"], "event_types")
        self.assertTrue(deleted.deleted)
        self.assertEqual(gone.status_code, 404)

    @inlineCallbacks
    def test_event_types(self) -> Any:
        """The event types sent: the seed's four and action_required."""
        client = self.client()
        listed = yield self.sdk(
            lambda: client.get("/webhook_event_types", cast_to=object)
        )
        self.assertEqual(
            listed["data"],
            [
                "agent.session.created",
                "agent.session.in_progress",
                "agent.session.idle",
                "agent.session.failed",
                "agent.session.action_required",
            ],
        )


class PrivateHostTests(OpenAICase):
    """The default policy: webhooks may not reach this machine's networks."""

    @inlineCallbacks
    def test_loopback_refused(self) -> Any:
        """
        A loopback URL (a name or an address) is 403 url_not_allowed, naming
        the rule; so is a scheme outside url_schemes' reach (ftp: 400).
        """
        client = self.client()

        def run() -> Any:
            return [
                caught(
                    lambda url=url: client.webhooks.create(
                        url=url, event_types=["agent.session.idle"], name="n"
                    )
                )
                for url in (
                    "http://127.0.0.1:9/hook",
                    "http://localhost/hook",
                    "http://[::1]/hook",
                    "ftp://example.com/hook",
                    "https://user:pw@example.com/hook",
                )
            ]

        errors = yield self.sdk(run)
        for error in errors[:3]:
            self.assertEqual(error.status_code, 403)
            self.assertEqual(error.body["code"], "url_not_allowed")
            self.assertEqual(
                error.body["rule"], "default:params.block_private_networks"
            )
            self.assertEqual(error.response.headers["x-should-retry"], "false")
        for error in errors[3:]:
            self.assertEqual(error.status_code, 400)
            self.assertEqual(error.body["param"], "url")


class UrlGlobTests(SynchronousTestCase):
    """A webhook URL against the endpoint's ``url_deny`` and ``url_allow``."""

    def test_url_globs(self) -> None:
        """
        A URL matching ``url_deny`` is refused naming the pattern, one outside
        ``url_allow`` naming the list, each with the rule that set it.
        """
        context = memory_context(
            policy={
                "endpoints": {
                    "agents_webhooks_create": {
                        "params": {
                            "url_allow": ["hooks.example.com/*"],
                            "url_deny": ["*/private/*"],
                        }
                    }
                }
            }
        )
        rule = context.policy.rule("agents_webhooks_create")
        ok = "https://hooks.example.com/in"
        self.assertEqual(check_url(ok, rule), ok)
        for url, why in (
            (
                "https://hooks.example.com/private/in",
                "is denied by policy (*/private/*)",
            ),
            ("https://other.example.com/in", "is not in url_allow"),
        ):
            with self.assertRaises(ApiError) as caught:
                check_url(url, rule)
            body = caught.exception.body()
            self.assertEqual(body["code"], "url_not_allowed", url)
            self.assertEqual(body["error"], f"the URL {why}")
            self.assertEqual(body["rule"], "policy:endpoints.agents_webhooks_create")
