"""
A real daemon with the agents group on and the suite's fake ACP agents,
driven by the official ``openai`` SDK pointed at its ``/v1`` door.

The SDK's client blocks, so each call runs on a small thread pool of its
own and every wait is bounded; the client never retries (a retried call
would hide an answer the door got wrong).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from tests.agents.test_agents import agents_policy
from tests.helpers import DaemonTestCase

#: One SDK call (or one streamed turn) must be over within this.
CALL_SECONDS = 40.0

#: The callers: two that may use the agents API, one that may only read.
TOKENS = {"USER_TOKEN": "u-token", "OTHER_TOKEN": "o-token", "READER_TOKEN": "r-token"}


def openai_policy(**rule: Any) -> dict[str, Any]:
    """The agents test policy with three identities."""
    policy = agents_policy(**rule)
    policy["auth"] = {
        "tokens": [
            {"id": "user", "token_env": "USER_TOKEN", "scopes": ["agents:use"]},
            {"id": "other", "token_env": "OTHER_TOKEN", "scopes": ["agents:use"]},
            {"id": "reader", "token_env": "READER_TOKEN", "scopes": ["agents:read"]},
        ]
    }
    return policy


def approval_response(request_id: str, approve: bool) -> dict[str, Any]:
    """An ``mcp_approval_response`` input item answering ``request_id``."""
    return {
        "type": "mcp_approval_response",
        "approval_request_id": request_id,
        "approve": approve,
    }


def caught(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or the exception it raised."""
    try:
        return fn()
    except Exception as e:
        return e


class OpenAICase(DaemonTestCase):
    """A daemon for the ``openai`` SDK, with a thread pool for its calls."""

    timeout = 90
    policy = openai_policy()
    environ = TOKENS
    audit = True

    def setUp(self) -> Any:
        self.pool = ThreadPool(minthreads=1, maxthreads=6, name="openai-sdk")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        return super().setUp()

    def client(self, token: str = "u-token") -> Any:
        """An ``OpenAI`` client for this daemon that never retries."""
        from openai import OpenAI

        client = OpenAI(
            base_url=self.daemon.url + "/v1",
            api_key=token,
            max_retries=0,
            timeout=CALL_SECONDS,
        )
        self.addCleanup(self._close, client)
        return client

    def _close(self, client: Any) -> Deferred[None]:
        """Close the client's pooled connections and let the daemon see them go."""
        client.close()
        return deferLater(reactor, 0.2, lambda: None)

    def sdk(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        """Run a blocking SDK call off the reactor, bounded by :data:`CALL_SECONDS`."""
        d = deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)
        d.addTimeout(CALL_SECONDS, reactor)
        return d

    def session_body(self, **extra: Any) -> dict[str, Any]:
        """What ``sessions.create`` takes for the fake agent in the test's directory."""
        body: dict[str, Any] = {
            "environment": {
                "type": "self_hosted",
                "workspace_directory": self.base_dir,
            },
            "agent": {"model": "fake"},
        }
        body.update(extra)
        return body
