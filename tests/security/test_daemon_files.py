"""
The daemon's own key, certificate and log files inside the base dir: no
file route reads, replaces or deletes them, whatever names them (a ``tls:``
listener's directory, the OpenTelemetry variables, twistd's ``--logfile``).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from twisted.internet.defer import inlineCallbacks
from twisted.scripts.twistd import ServerOptions
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon import log_observer
from sandboxd.daemon.server import Settings, daemon_files
from tests.git.remote import make_ca
from tests.routes.test_files import FilesCase

#: What each file holds before the test, and must hold after it.
SECRETS = {
    "secrets/otlp-client.key": b"-----BEGIN PRIVATE KEY-----\notlp\n",
    "secrets/otlp-client.pem": b"-----BEGIN CERTIFICATE-----\notlp\n",
    "secrets/traces-ca.pem": b"-----BEGIN CERTIFICATE-----\nca\n",
    "daemon.log": b"2026-12-06T15:05:02 [sandboxd] refused\n",
    "daemon.log.1": b"2026-12-05T10:00:00 [sandboxd] older\n",
}


class OwnKeysAndLogsTests(FilesCase):
    """
    A ``tls:`` listener's directory of keys, the OTLP client key and
    certificate, the OTLP CA bundle and twistd's log file (with its
    rotations) are the daemon's own files: reading, writing or deleting one
    is 403 ``guard:daemon-files`` for a token with every files scope, and the
    bytes on disk stay; a file beside them is served.
    """

    autostart = False

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        made = os.path.realpath(self.mktemp())
        os.makedirs(made)
        _, cert, key = make_ca(made)
        pem = b""
        for name in (key, cert):
            with open(name, "rb") as f:
                pem += f.read()
        self.secrets = {**SECRETS, "tlsdir/localhost.pem": pem}
        for rel, data in self.secrets.items():
            self.put(rel, data)
        self.put("notes.txt", b"fine")
        secrets = os.path.join(self.base_dir, "secrets")
        yield self.start(
            policy={
                "auth": {
                    "tokens": [
                        {"id": "files", "token_env": "FILES", "scopes": ["files:*"]}
                    ]
                }
            },
            environ={
                "FILES": "f",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY": f"{secrets}/otlp-client.key",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": f"{secrets}/otlp-client.pem",
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": f"{secrets}/traces-ca.pem",
            },
            pty_port=f"tls:{self.base_dir}/tlsdir:port=0:interface=127.0.0.1",
            log_file=os.path.join(self.base_dir, "daemon.log"),
        )

    def assertGuarded(self, reply: Any, what: Any) -> None:
        self.assertEqual(reply.status, 403, (what, reply.body))
        self.assertEqual(
            (reply.json()["code"], reply.json()["rule"]),
            ("path_denied", "guard:daemon-files"),
            what,
        )

    @inlineCallbacks
    def test_out_of_reach(self) -> Any:
        """Every read, write, move and delete of them is refused; nothing changes."""
        for rel in self.secrets:
            for method, route in (("GET", "/files/raw"), ("DELETE", "/files")):
                reply = yield self.request(
                    method, f"{route}?path={quote(rel)}", token="f"
                )
                self.assertGuarded(reply, (method, route, rel))
            reply = yield self.request(
                "POST", f"/files/raw?path={quote(rel)}", raw_body=b"planted", token="f"
            )
            self.assertGuarded(reply, ("POST", rel))
            reply = yield self.request(
                "POST",
                "/files/move",
                {"source": rel, "destination": "stolen"},
                token="f",
            )
            self.assertGuarded(reply, ("move", rel))
        # A new certificate planted in the directory the listener re-reads.
        reply = yield self.request(
            "POST", "/files/raw?path=tlsdir/evil.example.pem", raw_body=b"x", token="f"
        )
        self.assertGuarded(reply, "plant")
        for rel, data in self.secrets.items():
            self.assertEqual(self.read(rel), data, rel)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "stolen")))
        reply = yield self.request("GET", "/files/raw?path=notes.txt", token="f")
        self.assertEqual((reply.status, reply.body), (200, b"fine"))


class NamedFilesTests(SynchronousTestCase):
    """What names the daemon's files: endpoint strings, variables, twistd."""

    def setUp(self) -> None:
        self.addCleanup(log_observer._TWISTD.clear)

    def test_endpoint_strings(self) -> None:
        """A ``tls:`` directory (escaped colons too) and ``ssl:``'s files are named."""
        files = daemon_files(
            Settings(
                port="tls:/etc/sandboxd/tls:port=9443",
                pty_port="tls:/srv/a\\:b:port=9444",
                e2b_port="ssl:49999:privateKey=/k.pem:certKey=/c.pem"
                ":extraCertChain=/chain.pem:dhParameters=/dh.pem",
            ),
            {},
        )
        for name in (
            "/etc/sandboxd/tls",
            "/srv/a:b",
            "/k.pem",
            "/c.pem",
            "/chain.pem",
            "/dh.pem",
        ):
            self.assertIn(name, files)
        self.assertNotIn("9443", " ".join(files))

    def test_twistd_logfile(self) -> None:
        """twistd's ``--logfile`` (or its default ``twistd.log``) is absolute in the settings."""
        cases = (
            (["--logfile=relative.log"], os.path.abspath("relative.log")),
            ([], os.path.abspath("twistd.log")),
            (["-n"], None),
            (["-n", "--logfile=-"], None),
            (["--syslog"], None),
        )
        for args, expected in cases:
            config = ServerOptions()
            config.parseOptions([*args, "sandboxd", "--base-dir", "/tmp"])
            settings = config.subOptions.settings()
            self.assertEqual(settings.log_file, expected, args)
            if expected:
                self.assertIn(expected, daemon_files(settings, {}))
