"""
A daemon with the KEP door on, and the clients that drive it: the SDK users
run (``k8s-agent-sandbox``'s ``Filesystem`` over its ``SandboxConnector``)
and raw httpx for what the SDK does not reach.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from tests.helpers import DaemonTestCase

CALL_SECONDS = 20.0


class KepCase(DaemonTestCase):
    """A daemon whose ``kep`` endpoint is on, its REST port on loopback."""

    timeout = 60
    #: Merged into the policy (the kep group is turned on unless a test says).
    extra_policy: dict[str, Any] = {}
    enable_kep = True
    #: Also listen on a gRPC port (``self.grpc_port``).
    grpc = False

    def setUp(self) -> Any:
        self.pool = ThreadPool(minthreads=1, maxthreads=4, name="kep-sdk")
        self.pool.start()
        self.addCleanup(self.pool.stop)
        return super().setUp()

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        policy = dict(self.policy or {})
        policy.update(self.extra_policy)
        if self.enable_kep:
            groups = dict(policy.get("groups", {}))
            groups.setdefault("kep", True)
            policy["groups"] = groups
        kwargs.setdefault("policy", policy)
        kwargs.setdefault("kep_rest_port", "tcp:0:interface=127.0.0.1")
        if self.grpc:
            kwargs.setdefault("kep_grpc_port", "tcp:0:interface=127.0.0.1")
        daemon = yield super().start(stop_at_end, **kwargs)
        port = yield daemon.context.kep.listening()
        self.rest_port = port.getHost().port if port is not None else None
        grpc_port = daemon.context.kep.grpc_port
        self.grpc_port = grpc_port.getHost().port if grpc_port is not None else None
        return daemon

    def blocking(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Deferred[Any]:
        """Run a blocking client call off the reactor, bounded."""
        d = deferToThreadPool(reactor, self.pool, fn, *args, **kwargs)
        d.addTimeout(CALL_SECONDS, reactor)
        return d

    def connector(self) -> Any:
        """
        The SDK's ``SandboxConnector`` in ``in-cluster-pod-ip`` mode whose
        pod IP is loopback: the connector builds its
        ``SandboxdInClusterStrategy`` itself; no Kubernetes client is made
        (``k8s_helper`` is only read by the gateway and tunnel strategies),
        so nothing reaches a cluster.
        """
        from k8s_agent_sandbox.connector import (
            SandboxConnector,
            SandboxdInClusterStrategy,
        )
        from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig

        config = SandboxdInClusterConnectionConfig(
            mode="in-cluster-pod-ip",
            rest_port=self.rest_port,
            grpc_port=self.grpc_port or 1,
        )
        connector = SandboxConnector(
            "sandbox",
            "default",
            config,
            k8s_helper=None,  # type: ignore[arg-type]
            get_pod_ip=lambda: "127.0.0.1",
        )
        assert isinstance(connector.strategy, SandboxdInClusterStrategy)
        assert connector.is_sandboxd()
        self.addCleanup(connector.close)
        return connector

    def commands(self) -> Any:
        """The SDK's own ``CommandExecutor`` (``sandbox.commands``)."""
        from k8s_agent_sandbox.commands.command_executor import CommandExecutor

        return CommandExecutor(self.connector(), None, "sandbox-client")

    def filesystem(self) -> Any:
        """The SDK's own ``Filesystem`` (``sandbox.files``)."""
        from k8s_agent_sandbox.files.filesystem import Filesystem

        return Filesystem(self.connector(), None, "sandbox-client")

    def http(self, method: str, path: str, **kwargs: Any) -> Deferred[httpx.Response]:
        """One raw request to the REST port (in a thread)."""

        def call() -> httpx.Response:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{self.rest_port}", timeout=CALL_SECONDS
            ) as client:
                return client.request(method, path, **kwargs)

        return self.blocking(call)
