"""
The KEP door across policy reloads: both listeners follow the ``kep``
endpoint off and on, and a reload whose ``unauthenticated_as`` names a
token it removes is refused, the old policy staying in force.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.helpers import free_port, process_listens
from tests.kep.case import KepCase


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closes (or resets) the connection within its timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _h2_settings_answer(port: int) -> bytes:
    """The first bytes the gRPC port answers a client preface with ("" if none)."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection

    client = H2Connection(H2Configuration(client_side=True))
    client.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(client.data_to_send())
        try:
            return s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return b""


class ReloadTests(KepCase):
    """A reload opens and closes both KEP ports."""

    autostart = False
    grpc = True

    def wait_listening(self, port: int) -> Any:
        deadline = time.monotonic() + 10
        while not process_listens(os.getpid(), port) and time.monotonic() < deadline:
            time.sleep(0.05)

    @inlineCallbacks
    def test_off_and_on(self) -> Any:
        """
        Turning the ``kep`` group off stops both ports listening and closes
        a connection kept open on each; turning it back on listens again on
        both, and each answers: the gRPC port with its SETTINGS, not a
        connection closed at once.
        """
        rest, grpc = free_port(), free_port()
        yield self.start_on_policy_file(
            {"groups": {"kep": True}},
            kep_rest_port=f"tcp:{rest}:interface=127.0.0.1",
            kep_grpc_port=f"tcp:{grpc}:interface=127.0.0.1",
        )
        kept_rest = socket.create_connection(("127.0.0.1", rest), timeout=5)
        self.addCleanup(kept_rest.close)
        kept_grpc = socket.create_connection(("127.0.0.1", grpc), timeout=5)
        self.addCleanup(kept_grpc.close)
        first = yield self.blocking(_h2_settings_answer, grpc)
        self.assertTrue(first, "the gRPC port did not answer a client preface")

        self.reload_policy({"groups": {"kep": False}})
        closed = yield self.blocking(_closed, kept_rest)
        self.assertTrue(closed, "a REST connection outlived the door")
        closed = yield self.blocking(_closed, kept_grpc)
        self.assertTrue(closed, "a gRPC connection outlived the door")
        self.assertFalse(process_listens(os.getpid(), rest))
        self.assertFalse(process_listens(os.getpid(), grpc))

        self.reload_policy({"groups": {"kep": True}})
        yield self.blocking(self.wait_listening, grpc)
        yield self.blocking(self.wait_listening, rest)
        self.rest_port = rest
        response = yield self.http("GET", "/v1/health")
        self.assertEqual(response.status_code, 200)
        again = yield self.blocking(_h2_settings_answer, grpc)
        self.assertTrue(again, "the gRPC port listens again but closes every client")

    @inlineCallbacks
    def test_unauthenticated_as_removed_token(self) -> Any:
        """
        A reload that removes the token ``unauthenticated_as`` names is
        refused: the old policy stays, and a call without a credential is
        still that token.
        """
        policy = {
            "auth": {
                "tokens": [
                    {"id": "agent", "token_env": "T_AGENT", "scopes": ["*"]},
                    {"id": "other", "token_env": "T_OTHER", "scopes": ["*"]},
                ]
            },
            "groups": {"kep": True},
            "endpoints": {"kep": {"params": {"unauthenticated_as": "agent"}}},
        }
        yield self.start_on_policy_file(
            policy,
            environ={"T_AGENT": "agent-secret", "T_OTHER": "other-secret"},
        )
        with open(os.path.join(self.base_dir, "f.txt"), "w") as f:
            f.write("kept")
        response = yield self.http("GET", "/v1/files/f.txt")
        self.assertEqual((response.status_code, response.text), (200, "kept"))

        removed = dict(policy)
        removed["auth"] = {"tokens": [policy["auth"]["tokens"][1]]}  # type: ignore[index]
        self.write_policy_file(removed)
        self.assertFalse(self.daemon.daemon.reload())
        response = yield self.http("GET", "/v1/files/f.txt")
        self.assertEqual((response.status_code, response.text), (200, "kept"))
