"""
A real daemon with its E2B port, driven by the real ``e2b`` SDK.

The SDK's sync client blocks, so each call runs on a small thread pool of
its own (the daemon's file work uses the reactor's pool) and every wait is
bounded.  The SDK runs in its debug mode (``E2B_DEBUG=true``,
``E2B_SANDBOX_URL=http://127.0.0.1:PORT``): it makes no call to E2B's
cloud, assumes the newest envd, and talks to the URL directly.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from io import BytesIO
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers

from tests.helpers import DaemonTestCase

#: One SDK call (or a few) must be over within this.
CALL_SECONDS = 30.0


def envelope(message: Any, flags: int = 0) -> bytes:
    """A Connect envelope, as a client writes it."""
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def envelopes(body: bytes) -> list[tuple[int, Any]]:
    """``(flags, message)`` of each envelope of a stream body."""
    out = []
    offset = 0
    while offset < len(body):
        flags, length = struct.unpack_from(">BI", body, offset)
        offset += 5
        out.append((flags, json.loads(body[offset : offset + length])))
        offset += length
    return out


def caught(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or the exception it raised (for SDK calls run off the reactor)."""
    try:
        return fn()
    except Exception as e:
        return e


class E2BCase(DaemonTestCase):
    """A daemon whose ``e2b`` endpoint is on and listening on a loopback port."""

    timeout = 90
    #: One SDK call of this case is over within this many seconds.
    call_seconds = CALL_SECONDS
    #: Merged into the policy (the e2b group is turned on unless a test says).
    extra_policy: dict[str, Any] = {}
    enable_e2b = True

    def setUp(self) -> Any:
        self.pool = ThreadPool(minthreads=1, maxthreads=6, name="e2b-sdk")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        # bash -l reads ~/.profile: a HOME of the test's own keeps whatever
        # the machine's root profile does out of the commands' way.
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        saved = {k: os.environ.get(k) for k in ("HOME", "E2B_DEBUG", "E2B_SANDBOX_URL")}

        def restore() -> None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        self.addCleanup(restore)
        os.environ["HOME"] = home
        return super().setUp()

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        policy = dict(self.policy or {})
        policy.update(self.extra_policy)
        if self.enable_e2b:
            groups = dict(policy.get("groups", {}))
            groups.setdefault("e2b", True)
            policy["groups"] = groups
        kwargs.setdefault("policy", policy)
        kwargs.setdefault("e2b_port", "tcp:0:interface=127.0.0.1")
        daemon = yield super().start(stop_at_end, **kwargs)
        port = yield daemon.context.e2b.listening()
        self.e2b_port = port.getHost().port if port is not None else None
        if self.e2b_port is not None:
            os.environ["E2B_DEBUG"] = "true"
            os.environ["E2B_SANDBOX_URL"] = self.e2b_url
        return daemon

    @property
    def e2b_url(self) -> str:
        """The door's base URL."""
        return f"http://127.0.0.1:{self.e2b_port}"

    def sdk(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        """Run a blocking SDK call off the reactor, bounded by :attr:`call_seconds`."""
        d = deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)
        d.addTimeout(self.call_seconds, reactor)
        return d

    def sandbox(self, token: str | None = None) -> Any:
        """
        ``Sandbox.create()`` in debug mode; with ``token``, a sandbox whose
        requests carry it as ``X-Access-Token`` (as the SDK sends envd's).
        """
        from e2b import Sandbox
        from e2b.connection_config import ConnectionConfig
        from e2b.envd.versions import ENVD_DEBUG_FALLBACK

        if token is None:
            return Sandbox.create()
        config = ConnectionConfig(
            debug=True,
            sandbox_url=self.e2b_url,
            extra_sandbox_headers={"X-Access-Token": token},
        )
        return Sandbox(
            sandbox_id="debug_sandbox_id",
            sandbox_domain=None,
            envd_version=ENVD_DEBUG_FALLBACK,
            envd_access_token=token,
            traffic_access_token=None,
            connection_config=config,
        )

    @inlineCallbacks
    def rpc(
        self,
        procedure: str,
        message: Any,
        stream: bool = False,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Any:
        """
        A raw Connect call: ``(status, content type, body)`` where body is
        the JSON (unary) or the list of ``(flags, message)`` (stream).
        """
        all_headers = {
            "Content-Type": "application/connect+json"
            if stream
            else "application/json",
            "Connect-Protocol-Version": "1",
        }
        all_headers.update(headers or {})
        if raw is None:
            raw = envelope(message) if stream else json.dumps(message).encode()
        agent = Agent(reactor)
        d = agent.request(
            b"POST",
            f"{self.e2b_url}/{procedure}".encode(),
            Headers({k: [v] for k, v in all_headers.items()}),
            FileBodyProducer(BytesIO(raw)),
        )
        d.addTimeout(CALL_SECONDS, reactor)
        response = yield d
        body = yield readBody(response)
        content_type = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
        if content_type.startswith(b"application/connect+"):
            return response.code, content_type, envelopes(body)
        return response.code, content_type, json.loads(body) if body else None
