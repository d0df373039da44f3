"""
The Responses WebSocket of the ``/v1`` door (``GET /v1/responses`` with an
upgrade): the ``openai`` SDK's ``client.responses.connect()`` against a real
daemon and the fake ACP agent, and the ``websockets`` client for what the
SDK does not send (bad frames, binary frames, raw handshakes).
"""

from __future__ import annotations

import base64
import json
import math
import os
from typing import Any, cast

import httpx
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.openai_api.responses_socket import Lane
from tests.openai_api.sdk import OpenAICase, approval_response, caught, openai_policy
from tests.openai_api.test_restart import RestartCase

#: The handshake headers of a WebSocket client, for raw requests.
HANDSHAKE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
    "Sec-WebSocket-Version": "13",
}


def until_end(connection: Any) -> list[Any]:
    """The SDK connection's events up to the end of one response (or an error)."""
    events = []
    for event in connection:
        events.append(event)
        if event.type in (
            "response.completed",
            "response.failed",
            "response.incomplete",
            "error",
        ):
            return events
    return events


def socket_policy(**connect: Any) -> dict[str, Any]:
    """The /v1 test policy with limits of the socket endpoint changed."""
    policy = openai_policy()
    endpoints = policy.setdefault("endpoints", {})
    endpoints["agents_responses_connect"] = {"limits": connect}
    return policy


class SocketCase(OpenAICase):
    """Helpers for a raw ``websockets`` client."""

    def ws_url(self) -> str:
        return self.daemon.url.replace("http://", "ws://") + "/v1/responses"

    def raw_socket(self, token: str | None = "u-token") -> Any:
        """A ``websockets`` sync client connection (close it)."""
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return connect(
            self.ws_url(),
            additional_headers=headers,
            open_timeout=10,
            close_timeout=5,
            max_size=None,
        )


class ConnectTests(SocketCase):
    """``client.responses.connect()`` over the ACP engine."""

    policy = {**openai_policy(), "endpoints": {"group:agents": {"audit": "all"}}}

    @inlineCallbacks
    def test_create_twice_keeps_state(self) -> Any:
        """
        Two ``response.create`` events on one socket, the second with the
        first's ``previous_response_id``: both answered on the socket, the
        same agent session runs both turns, and each create is audited as
        ``agents_responses_create`` via ``openai``.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "echo one"}
                )
                first = until_end(connection)
                connection.send(
                    {
                        "type": "response.create",
                        "model": "fake",
                        "input": "echo two",
                        "previous_response_id": first[-1].response.id,
                    }
                )
                second = until_end(connection)
            stored = client.responses.retrieve(second[-1].response.id)
            return first, second, stored

        first, second, stored = yield self.sdk(run)
        self.assertEqual(first[0].type, "response.created")
        self.assertEqual(first[-1].type, "response.completed")
        self.assertEqual(first[-1].response.output_text, "one")
        self.assertEqual(second[-1].type, "response.completed")
        self.assertEqual(second[-1].response.output_text, "two")
        self.assertEqual(
            second[-1].response.previous_response_id, first[-1].response.id
        )
        self.assertEqual(stored.output_text, "two")
        self.assertEqual(len(self.daemon.context.agents.get().live()), 1)
        lines = self.audit_lines()
        upgrade = [r for r in lines if r.get("endpoint") == "agents_responses_connect"]
        self.assertEqual([r["status"] for r in upgrade], [101])
        creates = [
            r
            for r in lines
            if r.get("endpoint") == "agents_responses_create" and r["method"] == "WS"
        ]
        self.assertEqual(
            [(r["status"], r["via"]) for r in creates], [(200, "openai")] * 2
        )

    @inlineCallbacks
    def test_deltas_are_live_and_in_order(self) -> Any:
        """
        The agent's chunks reach the socket as it sends them: ``slow``'s
        first delta arrives while its response is still running (the HTTP
        route says ``in_progress``); after a cancel the response ends
        ``response.incomplete``.  An ``echo`` turn's two chunks arrive as
        two deltas in order, every event numbered from 0.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "slow"}
                )
                slow = []
                running = None
                for event in connection:
                    slow.append(event)
                    if event.type == "response.output_text.delta":
                        running = client.responses.retrieve(slow[0].response.id)
                        client.responses.cancel(slow[0].response.id)
                    if event.type == "response.incomplete":
                        break
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "echo abcdef"}
                )
                echo = until_end(connection)
            return slow, running, echo

        slow, running, echo = yield self.sdk(run)
        self.assertEqual(running.status, "in_progress")
        self.assertEqual(
            [e.delta for e in slow if e.type == "response.output_text.delta"],
            ["working"],
        )
        self.assertEqual(slow[-1].response.status, "cancelled")
        self.assertEqual(
            [e.delta for e in echo if e.type == "response.output_text.delta"],
            ["abc", "def"],
        )
        self.assertEqual([e.sequence_number for e in echo], list(range(len(echo))))
        types = [e.type for e in echo]
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        self.assertLess(
            types.index("response.output_item.added"),
            types.index("response.output_text.delta"),
        )

    @inlineCallbacks
    def test_creates_wait_their_turn(self) -> Any:
        """
        Two creates sent back to back are answered one after the other,
        each event carrying the ``stream_id`` its create named.
        """
        import json

        def run() -> Any:
            with self.raw_socket() as ws:
                for lane, text in (("a", "echo first"), ("b", "echo second")):
                    ws.send(
                        json.dumps(
                            {
                                "type": "response.create",
                                "model": "fake",
                                "input": text,
                                "stream_id": lane,
                            }
                        )
                    )
                events: list[dict[str, Any]] = []
                while [e["type"] for e in events].count("response.completed") < 2:
                    events.append(json.loads(ws.recv(timeout=30)))
            return events

        events = yield self.sdk(run)
        lanes = [e["stream_id"] for e in events]
        self.assertEqual(lanes, sorted(lanes))
        self.assertEqual(set(lanes), {"a", "b"})
        done = [e["response"] for e in events if e["type"] == "response.completed"]
        self.assertEqual(
            [r["output"][0]["content"][0]["text"] for r in done], ["first", "second"]
        )

    @inlineCallbacks
    def test_client_leaving_does_not_stop_the_response(self) -> Any:
        """
        A client that closes its socket mid-response leaves the response
        running (readable, cancellable over HTTP); its create is audited
        499 ``client_closed``.
        """
        import json
        import time

        client = self.client()

        def run() -> Any:
            with self.raw_socket() as ws:
                ws.send(
                    json.dumps(
                        {"type": "response.create", "model": "fake", "input": "slow"}
                    )
                )
                created = json.loads(ws.recv(timeout=30))
                while json.loads(ws.recv(timeout=30))["type"] != (
                    "response.output_text.delta"
                ):
                    pass
            time.sleep(0.3)
            running = client.responses.retrieve(created["response"]["id"])
            cancelled = client.responses.cancel(created["response"]["id"])
            return running, cancelled

        running, cancelled = yield self.sdk(run)
        self.assertEqual(running.status, "in_progress")
        self.assertEqual(cancelled.status, "cancelled")
        creates = [
            (r["status"], r["code"])
            for r in self.audit_lines()
            if r.get("endpoint") == "agents_responses_create" and r["method"] == "WS"
        ]
        self.assertEqual(creates, [(499, "client_closed")])

    @inlineCallbacks
    def test_approval_over_the_socket(self) -> Any:
        """
        A permission request ends the socket's response with an
        ``mcp_approval_request`` item; a ``response.create`` carrying the
        ``mcp_approval_response`` goes on with the same turn.
        """
        client = self.client()
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send(
                    {
                        "type": "response.create",
                        "model": "fake",
                        "input": f"edit {path} new text",
                    }
                )
                asked = until_end(connection)[-1].response
                [request] = [
                    i for i in asked.output if i.type == "mcp_approval_request"
                ]
                connection.send(
                    {
                        "type": "response.create",
                        "model": "fake",
                        "previous_response_id": asked.id,
                        "input": [approval_response(request.id, True)],
                    }
                )
                done = until_end(connection)[-1].response
            return asked, done

        asked, done = yield self.sdk(run)
        self.assertEqual(asked.status, "completed")
        self.assertEqual(done.status, "completed")
        self.assertEqual(done.output_text, "edited notes.txt (allow)")
        with open(path) as f:
            self.assertEqual(f.read(), "new text")

    @inlineCallbacks
    def test_steer_queues_a_successor(self) -> Any:
        """
        ``response.steer`` on a running response is accepted at once; the
        steered response ends (here: cancelled) and its successor, with the
        steer's input, streams next on the same socket and continues the
        same conversation.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "slow"}
                )
                events = []
                for event in connection:
                    events.append(event)
                    if event.type == "response.output_text.delta":
                        connection.response.steer(
                            previous_response_id=events[0].response.id,
                            input="echo steered",
                        )
                    if event.type == "response.steer.accepted":
                        client.responses.cancel(events[0].response.id)
                    if event.type == "response.incomplete":
                        break
                successor = until_end(connection)
            return events, successor

        events, successor = yield self.sdk(run)
        types = [e.type for e in events]
        self.assertIn("response.steer.accepted", types)
        accepted = events[types.index("response.steer.accepted")]
        self.assertEqual(accepted.steer.previous_response_id, events[0].response.id)
        self.assertEqual(successor[0].type, "response.created")
        self.assertEqual(successor[-1].type, "response.completed")
        self.assertEqual(successor[-1].response.output_text, "steered")
        self.assertEqual(
            successor[-1].response.previous_response_id, events[0].response.id
        )

    @inlineCallbacks
    def test_steer_successor_keeps_the_settings(self) -> Any:
        """
        A steer carries only input; its successor continues with the steered
        response's settings: the same instructions (they lead its prompt
        again: here they make the fake agent work slowly), metadata and
        ``store``, as OpenAI's automatic successor does.
        """
        client = self.client()
        settings = {
            "model": "fake",
            "instructions": "slow please",
            "metadata": {"team": "a"},
            "store": True,
        }

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send({"type": "response.create", "input": "go", **settings})
                steered = None
                for event in connection:
                    if event.type == "response.created":
                        steered = event.response.id
                    if event.type == "response.output_text.delta":
                        connection.response.steer(
                            previous_response_id=steered, input="more"
                        )
                    if event.type == "response.steer.accepted":
                        client.responses.cancel(steered)
                    if event.type == "response.incomplete":
                        break
                successor = []
                for event in connection:
                    successor.append(event)
                    if event.type == "response.output_text.delta":
                        client.responses.cancel(successor[0].response.id)
                        break
                successor += until_end(connection)
            return steered, successor

        steered, successor = yield self.sdk(run)
        created = successor[0].response
        self.assertEqual(successor[0].type, "response.created")
        self.assertEqual(created.previous_response_id, steered)
        self.assertEqual(created.instructions, "slow please")
        self.assertEqual(created.metadata, {"team": "a"})
        self.assertIs(created.store, True)
        deltas = [e.delta for e in successor if e.type == "response.output_text.delta"]
        self.assertEqual(deltas[:1], ["working"])
        self.assertEqual(successor[-1].type, "response.incomplete")

    def steer_into_approval(self, connection: Any, path: str) -> list[Any]:
        """
        Start a response that asks to edit ``path`` once a gate file exists,
        steer it (``echo steered``) while it runs, then open the gate; the
        socket's events up to ``response.steer.pending``.
        """
        gate = os.path.join(self.base_dir, "go")
        connection.send(
            {
                "type": "response.create",
                "model": "fake",
                "input": f"waitfor {gate} edit {path} new text",
            }
        )
        events: list[Any] = []
        for event in connection:
            events.append(event)
            if event.type == "response.output_text.delta" and len(events) < 6:
                connection.response.steer(
                    previous_response_id=events[0].response.id, input="echo steered"
                )
            if event.type == "response.steer.accepted":
                open(gate, "w").close()
            if event.type in ("response.steer.pending", "response.steer.failed"):
                break
        return events

    @inlineCallbacks
    def test_steered_response_asking_for_approval(self) -> Any:
        """
        A steered response that ends asking for an approval leaves the steer
        pending: ``response.steer.pending`` after its ``response.completed``
        names the approval it waits for; a create answering it (with the
        steered response as ``previous_response_id``) goes on with the turn,
        and the steer's successor streams after it, continuing from it.
        """
        client = self.client()
        path = os.path.join(self.base_dir, "notes.txt")
        with open(path, "w") as f:
            f.write("old\n")

        def run() -> Any:
            with client.responses.connect() as connection:
                events = self.steer_into_approval(connection, path)
                asked = next(e for e in events if e.type == "response.completed")
                [request] = [
                    i for i in asked.response.output if i.type == "mcp_approval_request"
                ]
                connection.send(
                    {
                        "type": "response.create",
                        "model": "fake",
                        "previous_response_id": asked.response.id,
                        "input": [approval_response(request.id, True)],
                    }
                )
                answered = until_end(connection)
                successor = until_end(connection)
            return events, request, answered, successor

        events, request, answered, successor = yield self.sdk(run)
        types = [e.type for e in events]
        self.assertLess(types.index("response.completed"), len(types) - 1)
        accepted = events[types.index("response.steer.accepted")]
        pending = events[-1]
        self.assertEqual(pending.type, "response.steer.pending")
        self.assertEqual(pending.reason, "waiting_for_required_input")
        self.assertEqual(pending.steer.id, accepted.steer.id)
        self.assertEqual(
            [(i.type, i.approval_request_id) for i in pending.required_input],
            [("mcp_approval_response", request.id)],
        )
        self.assertEqual(answered[-1].type, "response.completed")
        self.assertEqual(answered[-1].response.output_text, "edited notes.txt (allow)")
        self.assertEqual(successor[0].type, "response.created")
        self.assertEqual(
            successor[0].response.previous_response_id, answered[-1].response.id
        )
        self.assertEqual(successor[-1].type, "response.completed")
        self.assertEqual(successor[-1].response.output_text, "steered")
        with open(path) as f:
            self.assertEqual(f.read(), "new text")

    @inlineCallbacks
    def test_pending_steer_after_a_cancel(self) -> Any:
        """
        A steered response waiting for an approval that is never answered
        but cancelled (from another connection): its turn ends, and the
        steer's successor streams on the socket; nothing waits on.
        """
        client = self.client()
        path = os.path.join(self.base_dir, "notes.txt")

        def run() -> Any:
            with client.responses.connect() as connection:
                events = self.steer_into_approval(connection, path)
                steered = events[0].response.id
                cancelled = client.responses.cancel(steered)
                successor = until_end(connection)
            return events, cancelled, successor

        events, cancelled, successor = yield self.sdk(run)
        self.assertEqual(events[-1].type, "response.steer.pending")
        # It keeps what it ended with: the approval request.
        self.assertEqual(cancelled.status, "completed")
        self.assertEqual(successor[0].type, "response.created")
        self.assertEqual(
            successor[0].response.previous_response_id, events[0].response.id
        )
        self.assertEqual(successor[-1].response.output_text, "steered")
        self.assertFalse(os.path.exists(path))

    @inlineCallbacks
    def test_steer_takes_user_messages_only(self) -> Any:
        """
        A steer whose input is not user messages (here an approval) is
        refused at once: ``response.steer.failed`` with ``invalid_input``.
        """
        client = self.client()

        def run() -> Any:
            with client.responses.connect() as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "slow"}
                )
                first = connection.recv()
                connection.send(
                    {
                        "type": "response.steer",
                        "previous_response_id": first.response.id,
                        "input": [approval_response("x", True)],
                    }
                )
                refused = None
                for event in connection:
                    if event.type == "response.steer.failed":
                        refused = event
                        client.responses.cancel(first.response.id)
                    if event.type == "response.incomplete":
                        break
            return refused

        refused = yield self.sdk(run)
        self.assertEqual(refused.error.code, "invalid_input")
        self.assertEqual(
            refused.error.message, "input[0]: a steer takes user messages only"
        )

    @inlineCallbacks
    def test_other_identity_cannot_continue(self) -> Any:
        """
        Another caller's socket cannot continue (404 ``not_found`` as an
        ``error`` event) or steer (``response_not_found``) your response.
        """
        mine = self.client()
        theirs = self.client("o-token")

        def run() -> Any:
            with mine.responses.connect() as connection:
                connection.send(
                    {"type": "response.create", "model": "fake", "input": "echo mine"}
                )
                response = until_end(connection)[-1].response
            with theirs.responses.connect() as connection:
                connection.send(
                    {
                        "type": "response.create",
                        "model": "fake",
                        "input": "echo theirs",
                        "previous_response_id": response.id,
                    }
                )
                refused = until_end(connection)[-1]
                connection.send(
                    {
                        "type": "response.steer",
                        "previous_response_id": response.id,
                        "input": "echo theirs",
                    }
                )
                steer = connection.recv()
            return refused, steer

        refused, steer = yield self.sdk(run)
        self.assertEqual(refused.type, "error")
        self.assertEqual(refused.status, 404)
        self.assertEqual(refused.error.code, "not_found")
        self.assertEqual(refused.error.param, "previous_response_id")
        self.assertEqual(steer.type, "response.steer.failed")
        self.assertEqual(steer.error.code, "response_not_found")


class FrameTests(SocketCase):
    """What the socket does with frames it cannot take."""

    policy = socket_policy(
        max_message_bytes=64 * 1024, max_sessions=1, max_concurrency=1
    )

    @inlineCallbacks
    def test_bad_frame_then_good(self) -> Any:
        """
        A ping is answered; text that is not a JSON object is an ``error``
        event with code ``bad_frame`` and the socket stays usable; an unknown event type is
        an ``invalid_param`` error naming ``type``.
        """
        import json

        def run() -> Any:
            with self.raw_socket() as ws:
                pong = ws.ping().wait(10)
                ws.send("not json")
                bad = json.loads(ws.recv(timeout=10))
                ws.send("[1, 2]")
                array = json.loads(ws.recv(timeout=10))
                ws.send(json.dumps({"type": "session.update"}))
                unknown = json.loads(ws.recv(timeout=10))
                ws.send(
                    json.dumps(
                        {"type": "response.create", "model": "fake", "input": "echo ok"}
                    )
                )
                events = []
                while not events or events[-1]["type"] != "response.completed":
                    events.append(json.loads(ws.recv(timeout=30)))
            return pong, bad, array, unknown, events

        pong, bad, array, unknown, events = yield self.sdk(run)
        self.assertTrue(pong)
        for error in (bad, array):
            self.assertEqual(error["type"], "error")
            self.assertEqual(error["error"]["code"], "bad_frame")
        self.assertEqual(unknown["error"]["code"], "invalid_param")
        self.assertEqual(unknown["error"]["param"], "type")
        self.assertEqual(
            events[-1]["response"]["output"][0]["content"][0]["text"], "ok"
        )

    @inlineCallbacks
    def test_binary_frame_closes_1003(self) -> Any:
        """A binary frame closes the socket with 1003 (unsupported data)."""
        from websockets.exceptions import ConnectionClosed

        def run() -> Any:
            with self.raw_socket() as ws:
                ws.send(b"\x00\x01")
                return caught(lambda: ws.recv(timeout=10))

        closed = yield self.sdk(run)
        self.assertIsInstance(closed, ConnectionClosed)
        self.assertEqual(closed.rcvd.code, 1003)

    @inlineCallbacks
    def test_oversize_message_closes_1009(self) -> Any:
        """A message over the policy's ``max_message_bytes`` closes with 1009."""
        from websockets.exceptions import ConnectionClosed

        def run() -> Any:
            with self.raw_socket() as ws:
                ws.send("x" * (100 * 1024))
                return caught(lambda: ws.recv(timeout=10))

        closed = yield self.sdk(run)
        self.assertIsInstance(closed, ConnectionClosed)
        self.assertEqual(closed.rcvd.code, 1009)

    @inlineCallbacks
    def test_one_socket_per_caller(self) -> Any:
        """
        Over ``max_sessions`` open sockets of one caller the upgrade is a
        429 ``concurrency_limited``; another caller is not counted with it,
        and a closed socket frees its place.  An open socket holds no
        concurrency slot of the upgrade (``max_concurrency`` is 1 here).
        """
        from websockets.exceptions import InvalidStatus

        def run() -> Any:
            with self.raw_socket():
                refused = caught(self.raw_socket)
                with self.raw_socket("o-token"):
                    pass
            import time

            time.sleep(0.3)
            with self.raw_socket():
                pass
            return refused

        refused = yield self.sdk(run)
        self.assertIsInstance(refused, InvalidStatus)
        self.assertEqual(refused.response.status_code, 429)
        self.assertIn(b"concurrency_limited", refused.response.body)


class IdleTests(SocketCase):
    """A socket with nothing to do is closed."""

    policy = socket_policy(idle_timeout_seconds=1)

    @inlineCallbacks
    def test_idle_socket_closed(self) -> Any:
        """With no frame and no response for ``idle_timeout_seconds``: close 1001."""
        from websockets.exceptions import ConnectionClosed

        def run() -> Any:
            with self.raw_socket() as ws:
                return caught(lambda: ws.recv(timeout=10))

        closed = yield self.sdk(run)
        self.assertIsInstance(closed, ConnectionClosed)
        self.assertEqual(closed.rcvd.code, 1001)


class ReloadTests(SocketCase):
    """A policy reload closes the sockets it no longer lets in."""

    @inlineCallbacks
    def test_removed_identity_closed_1008(self) -> Any:
        """A reload that takes the socket's identity out closes it 1008, saying why."""
        from websockets.exceptions import ConnectionClosed

        ws = yield self.sdk(self.raw_socket)
        self.addCleanup(ws.close)
        policy = openai_policy()
        policy["auth"]["tokens"] = [
            t for t in policy["auth"]["tokens"] if t["id"] != "user"
        ]
        self.daemon.daemon.settings.policy = policy
        self.assertTrue(self.daemon.daemon.reload())
        closed = yield self.sdk(lambda: caught(lambda: ws.recv(timeout=10)))
        self.assertIsInstance(closed, ConnectionClosed)
        self.assertEqual(closed.rcvd.code, 1008)
        self.assertIn("no longer in the policy", closed.rcvd.reason)


class HandshakeTests(SocketCase):
    """The upgrade's refusals, in the door's envelope."""

    def get(self, headers: dict[str, str]) -> Any:
        return self.sdk(
            httpx.get, self.ws_url().replace("ws://", "http://"), headers=headers
        )

    @inlineCallbacks
    def test_plain_get(self) -> Any:
        """A GET without an upgrade: 400 ``agents.websocket_upgrade_required``, final."""
        answer = yield self.get({"Authorization": "Bearer u-token"})
        self.assertEqual(answer.status_code, 400)
        self.assertEqual(
            answer.json()["error"]["code"], "agents.websocket_upgrade_required"
        )
        self.assertEqual(answer.json()["error"]["type"], "invalid_request_error")
        self.assertEqual(answer.headers["x-should-retry"], "false")
        self.assertEqual(answer.headers["x-agent-sandbox-local"], "1")

    @inlineCallbacks
    def test_bad_handshake(self) -> Any:
        """An upgrade without a valid key or version: 400 ``agents.websocket_handshake_invalid``."""
        for broken in (
            {"Sec-WebSocket-Key": ""},
            {"Sec-WebSocket-Key": "short"},
            {"Sec-WebSocket-Version": "8"},
            {"Connection": "keep-alive"},
        ):
            headers = {**HANDSHAKE, **broken, "Authorization": "Bearer u-token"}
            answer = yield self.get(headers)
            self.assertEqual(answer.status_code, 400, broken)
            self.assertEqual(
                answer.json()["error"]["code"], "agents.websocket_handshake_invalid"
            )
            self.assertEqual(answer.headers["x-should-retry"], "false")

    @inlineCallbacks
    def test_no_token_is_401_before_any_upgrade(self) -> Any:
        """
        Without a token the gate answers 401 and nothing is upgraded;
        with one, the 101 carries ``X-Agent-Sandbox-Local: 1``.
        """
        from websockets.exceptions import InvalidStatus

        answer = yield self.get(dict(HANDSHAKE))
        self.assertEqual(answer.status_code, 401)
        self.assertNotIn("upgrade", answer.headers)

        def run() -> Any:
            refused = caught(lambda: self.raw_socket(token=None))
            with self.raw_socket() as ws:
                local = ws.response.headers.get("X-Agent-Sandbox-Local")
            return refused, local

        refused, local = yield self.sdk(run)
        self.assertIsInstance(refused, InvalidStatus)
        self.assertEqual(refused.response.status_code, 401)
        self.assertEqual(local, "1")


class StopTests(RestartCase, SocketCase):
    """The daemon stopping closes its Responses WebSockets first."""

    @inlineCallbacks
    def test_stop_closes_1001(self) -> Any:
        """
        A socket streaming a response when the daemon stops gets the
        response's ``response.failed``, then a close frame 1001 (going
        away) saying why, not a cut connection, and the stop does not wait
        past the close's bound.
        """
        import json
        import time

        from twisted.internet import reactor
        from twisted.internet.threads import blockingCallFromThread
        from websockets.exceptions import ConnectionClosed

        def run() -> Any:
            with self.raw_socket() as ws:
                ws.send(
                    json.dumps(
                        {"type": "response.create", "model": "fake", "input": "slow"}
                    )
                )
                while json.loads(ws.recv(timeout=30))["type"] != (
                    "response.output_text.delta"
                ):
                    pass
                started = time.monotonic()
                blockingCallFromThread(reactor, self.restart)
                stopped = time.monotonic() - started
                last: list[Any] = []

                def drain() -> Any:
                    while True:
                        last.append(json.loads(ws.recv(timeout=10)))

                return caught(drain), stopped, last

        closed, stopped, last = yield self.sdk(run)
        # The response it streamed ends as an HTTP stream's would: failed.
        self.assertEqual(last[-1]["type"], "response.failed")
        self.assertEqual(last[-1]["response"]["status"], "failed")
        self.assertIn("daemon stopped", last[-1]["response"]["error"]["message"])
        self.assertIsInstance(closed, ConnectionClosed)
        self.assertEqual(closed.rcvd.code, 1001)
        self.assertEqual(closed.rcvd.reason, "the daemon is stopping")
        self.assertLess(stopped, 30)


def masked_text(payload: bytes) -> bytes:
    """A client's text frame (masked, as RFC 6455 wants), at most 64 KiB."""
    mask = os.urandom(4)
    head = b"\x81" + (
        bytes([0x80 | len(payload)])
        if len(payload) < 126
        else bytes([0x80 | 126]) + len(payload).to_bytes(2, "big")
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class SlowReaderTests(SocketCase):
    """A client that stops reading cannot make the daemon hold its events."""

    @inlineCallbacks
    def test_client_not_reading_is_dropped(self) -> Any:
        """
        A client that never reads: a large response fills its connection
        and pauses, and the frames it keeps sending are still answered
        (each with an ``error`` event); once more than ``OPENAI_WS_UNREAD_BYTES`` of answers pile up
        behind the full connection, the client is dropped (its socket
        uncounted, the connection cut after the close's grace).
        """
        import json
        import socket
        import time

        from sandboxd.openai_api import responses_socket

        self.patch(responses_socket, "OPENAI_WS_UNREAD_BYTES", 16 * 1024)
        host, port = self.daemon.url.split("//")[1].split(":")

        def run() -> Any:
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect((host, int(port)))
            raw.settimeout(10)
            head = [
                "GET /v1/responses HTTP/1.1",
                f"Host: {host}:{port}",
                "Authorization: Bearer u-token",
                *[f"{k}: {v}" for k, v in HANDSHAKE.items()],
            ]
            raw.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            answer = raw.recv(4096)
            for held in self._sockets():
                held.transport.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
                )
            create = {"type": "response.create", "model": "fake"}
            for _ in range(2):
                body = {**create, "input": "echo " + "x" * 20000}
                raw.sendall(masked_text(json.dumps(body).encode()))
            counted = len(self._sockets())
            deadline = time.monotonic() + 20
            while self._sockets() and time.monotonic() < deadline:
                try:
                    for _ in range(50):
                        raw.sendall(masked_text(b"not json"))
                except OSError:
                    pass  # dropped
                time.sleep(0.05)
            left = len(self._sockets())
            raw.close()
            return answer, counted, left

        answer, counted, left = yield self.sdk(run)
        self.assertTrue(answer.startswith(b"HTTP/1.1 101"), answer[:40])
        self.assertEqual((counted, left), (1, 0))

    def _sockets(self) -> list[Any]:
        """The daemon's open Responses WebSockets."""
        from sandboxd.openai_api.responses_socket import _FACTORIES

        factory = _FACTORIES.get(self.daemon.context)
        if factory is None:
            return []
        return [s for held in factory.sockets.values() for s in held]


class NotFiniteEventTests(SynchronousTestCase):
    """An event the socket cannot send as JSON."""

    def test_event_with_a_non_finite_number_is_an_error_event(self) -> None:
        """
        An event holding ``inf`` or ``nan`` is sent as an ``error`` event in
        its place (OpenAI's envelope, status 500, ``internal``, its lane's
        ``stream_id``), never as ``NaN``, which a client's parser refuses; a
        finite event is sent as it is.
        """
        lane = Lane(cast(Any, None), stream_id="s1")
        frame = lane.encode_event("response.progress", {"type": "x", "v": math.nan})
        event = json.loads(frame, parse_constant=_refuse)
        self.assertEqual(
            (event["type"], event["status"], event["stream_id"]), ("error", 500, "s1")
        )
        self.assertEqual(event["error"]["code"], "internal")
        self.assertIn("$.v is a non-finite number", event["error"]["message"])
        self.assertEqual(
            lane.encode_event("x", {"type": "x", "v": 0.5}),
            b'{"type":"x","v":0.5,"stream_id":"s1"}\n',
        )


def _refuse(name: str) -> None:
    raise ValueError(name)
