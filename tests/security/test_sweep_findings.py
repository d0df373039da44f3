"""
Hostile values the endpoint sweep (:mod:`tests.security.test_every_endpoint`)
found answered 5xx, taken, or refused only after something had started:
each pinned down on its own, against a real daemon with every group on.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.endpoints import CapabilityGroup
from tests.helpers import DaemonTestCase
from tests.security.test_every_endpoint import children

#: Every group on, nothing else narrowed.
ALL_GROUPS = {"groups": {g.value: True for g in CapabilityGroup}}


class FoundBySweepTests(DaemonTestCase):
    """Each case: a clear 4xx with its code, and nothing done."""

    policy = ALL_GROUPS

    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """The daemon, with the preview door listening."""
        kwargs.setdefault("preview_port", "tcp:0:interface=127.0.0.1")
        return super().start(stop_at_end, **kwargs)

    @inlineCallbacks
    def refused(self, method: str, path: str, body: Any, code: str) -> Any:
        """Send ``body``; assert a 400 with ``code`` (either framing); the body."""
        reply = yield self.request(method, path, body)
        answer = reply.json()
        error = answer.get("error")
        got = error.get("code") if isinstance(error, dict) else answer.get("code")
        self.assertEqual((reply.status, got), (400, code), reply.body)
        return answer

    @inlineCallbacks
    def test_multi_agent_not_an_object(self) -> Any:
        """An agent definition's ``multi_agent`` that is no object is 400 (was 500), nothing stored."""
        for value in ("on", 1, [], True):
            answer = yield self.refused(
                "POST",
                "/v1/agents",
                {"model": "x", "multi_agent": value},
                "invalid_param",
            )
            self.assertEqual(answer["error"]["param"], "multi_agent")
        listed = yield self.request("GET", "/v1/agents")
        self.assertEqual(listed.json()["data"], [])

    @inlineCallbacks
    def test_screenshot_type_not_a_word(self) -> Any:
        """A screenshot ``type`` or ``format`` that is an object or array is 400 (was 500), no browser started."""
        before = children()
        for name in ("type", "format"):
            for value in ({}, [], 1):
                yield self.refused(
                    "POST", "/browser/screenshot", {name: value}, "invalid_param"
                )
        self.assertEqual(children() - before, set())

    @inlineCallbacks
    def test_exposure_ttl_past_any_timestamp(self) -> Any:
        """An exposure's ttl_seconds of 2**64 is cut to the longest ttl (was 500 with the exposure left made)."""
        reply = yield self.request(
            "POST", "/preview/ports", {"port": 45678, "ttl_seconds": 2**64}
        )
        self.assertEqual(reply.status, 201, reply.body)
        self.assertIsNotNone(reply.json()["expires_at"])
        listed = yield self.request("GET", "/preview/ports")
        exposed = [p["port"] for p in listed.json()["ports"] if p["exposed"]]
        self.assertEqual(exposed, [45678])

    @inlineCallbacks
    def test_mode_boolean_or_fraction(self) -> Any:
        """A file mode of true or 1.5 is 400 (was taken as 0o001), nothing written; 420 is 0o644."""
        for mode in (True, 1.5):
            yield self.refused(
                "POST",
                "/upload",
                {"path": "m.txt", "content_base64": "aGkK", "mode": mode},
                "invalid_param",
            )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "m.txt")))
        reply = yield self.request(
            "POST", "/upload", {"path": "m.txt", "content_base64": "aGkK", "mode": 420}
        )
        self.assertEqual(reply.status, 200, reply.body)
        st = os.stat(os.path.join(self.base_dir, "m.txt"))
        self.assertEqual(st.st_mode & 0o777, 0o644)

    @inlineCallbacks
    def test_agent_fields_of_the_wrong_type(self) -> Any:
        """
        A wrong-typed field of an agent session or response is 400 before
        the agent is looked up or started (was 503 agent_unavailable here,
        or the field ignored: ``stream: "yes"`` ran unstreamed).
        """
        before = children()
        yield self.refused(
            "POST",
            "/agents/sessions",
            {"agent": "claude", "model": {}},
            "invalid_param",
        )
        answer = yield self.refused(
            "POST",
            "/v1/agents/sessions",
            {"agent": {"model": "claude"}, "stream": "yes"},
            "invalid_param",
        )
        self.assertEqual(answer["error"]["param"], "stream")
        answer = yield self.refused(
            "POST",
            "/v1/responses",
            {"model": "claude", "input": "hi", "store": "yes"},
            "invalid_param",
        )
        self.assertEqual(answer["error"]["param"], "store")
        yield self.refused("GET", "/agents/requests?kind=sweep", None, "invalid_param")
        self.assertEqual(children() - before, set())

    @inlineCallbacks
    def test_query_checked_before_the_thing_is_looked_up(self) -> Any:
        """
        A query value of the wrong form is 400 whatever the call finds: a
        tool call's ``format``, a stored response's ``stream`` and
        ``starting_after``, a ``/v1`` event stream's ``include_obfuscation``
        and an execution's ``limit`` were read only on some paths (taken
        with a live thing: a stream opened, a page answered).
        """
        cases = (
            "/agents/sessions/s_x/tool-calls/t_x?format=sweep",
            "/v1/responses/resp_x?stream=maybe",
            "/v1/responses/resp_x?starting_after=sweep",
            "/v1/agents/sessions/sess_x/events?include_obfuscation=maybe",
            "/code/contexts/c_x/executions/x_x/events?limit=sweep",
            "/code/contexts/c_x/executions/x_x/events?follow=false&limit=1.5",
        )
        for path in cases:
            yield self.refused("GET", path, None, "invalid_param")

    @inlineCallbacks
    def test_oversized_head_in_the_door_framing(self) -> Any:
        """
        A request head too large to read (a 1 MiB query) is 400
        ``malformed_request`` in the framing of the door its path names:
        OpenAI's envelope under ``/v1/`` (was SPEC §3's, where an OpenAI
        SDK finds no ``error.code``), SPEC §3's elsewhere.
        """
        query = "q=" + "x" * (1 << 20)
        reply = yield self.request("GET", f"/v1/models?{query}")
        self.assertEqual(reply.status, 400)
        error = reply.json()["error"]
        self.assertEqual(error["code"], "malformed_request")
        self.assertEqual(error["type"], "invalid_request_error")
        self.assertEqual(reply.header("x-should-retry"), "false")
        reply = yield self.request("GET", f"/processes?{query}")
        self.assertEqual(reply.status, 400)
        self.assertEqual(reply.json()["code"], "malformed_request")
