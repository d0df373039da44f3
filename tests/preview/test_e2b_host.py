"""
E2B's ``get_host(port)`` answers a host the preview door serves: the SDK
builds ``{port}-{sandbox_id}.{sandbox_domain}``, and with the sandbox's
domain pointing at the door (``localhost:PREVIEW_PORT`` here, a wildcard
name behind an ingress) an unlabelled exposure answers to it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.web.client import readBody

from tests.preview.test_door import DoorCase


class GetHostTests(DoorCase):
    """The real ``e2b`` SDK's host, through the door."""

    @inlineCallbacks
    def test_get_host_reaches_the_app(self) -> None:
        """A page fetched at the SDK's host for the port is the app's page."""
        try:
            from e2b import Sandbox
            from e2b.connection_config import ConnectionConfig
        except ImportError:
            self.skipTest("the e2b SDK is not installed (pip install e2b)")
        sandbox: Any = Sandbox(
            sandbox_id="e2bbox",
            sandbox_domain=f"localhost:{self.door_port}",
            envd_version="0.2.0",
            envd_access_token=None,
            traffic_access_token=None,
            connection_config=ConnectionConfig(debug=False, api_key="e2b_unused"),
        )
        host = sandbox.get_host(self.app_port)
        self.assertEqual(host, f"{self.app_port}-e2bbox.localhost:{self.door_port}")
        yield self.expose()
        response = yield self.send("GET", "/", host=host)
        body = yield readBody(response)
        self.assertEqual(response.code, 200)
        self.assertIn(b"preview app", body)
