"""
SPEC §20, behind proxies: the ``ws_url`` a terminal is given, and which
``X-Forwarded-*`` headers are believed.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.daemon.proxies import Forwarded, forwarded, is_trusted, pty_url
from sandboxd.daemon.tap import Options
from sandboxd.policy import PolicyError, load_policy
from sandboxd.routes import default_table
from tests.routes.test_terminal import TerminalCase


class PtyUrlTests(SynchronousTestCase):
    """How the URL is put together."""

    def test_public_url_wins(self) -> None:
        """A configured public URL is the base whatever the request or a proxy says."""
        self.assertEqual(
            pty_url(
                "wss://sb.example.com/term/",
                "ws",
                "127.0.0.1",
                9001,
                "s1",
                Forwarded("http", "evil.example"),
            ),
            "wss://sb.example.com/term/pty?session_id=s1",
        )

    def test_forwarded(self) -> None:
        """A trusted proxy's scheme picks ws/wss and its host replaces host and port."""
        self.assertEqual(
            pty_url(None, "ws", "10.0.0.5", 9001, "s1", Forwarded("https", None)),
            "wss://10.0.0.5:9001/pty?session_id=s1",
        )
        self.assertEqual(
            pty_url(
                None, "ws", "10.0.0.5", 9001, "s1", Forwarded("https", "sb.io:8443")
            ),
            "wss://sb.io:8443/pty?session_id=s1",
        )
        self.assertEqual(
            pty_url(None, "ws", "::1", 9001, "s1"), "ws://[::1]:9001/pty?session_id=s1"
        )

    def test_trust(self) -> None:
        """Forwarded headers count only from an address or network in trusted_proxies."""
        headers = {"x-forwarded-proto": "https", "x-forwarded-host": "sb.io"}
        self.assertEqual(forwarded(headers, "10.1.2.3", ()), Forwarded())
        self.assertEqual(forwarded(headers, "10.1.2.3", ("10.0.0.1",)), Forwarded())
        self.assertEqual(
            forwarded(headers, "10.1.2.3", ("10.0.0.0/8",)), Forwarded("https", "sb.io")
        )
        self.assertTrue(is_trusted("::ffff:10.1.2.3", ("10.0.0.0/8",)))
        self.assertFalse(is_trusted("not-an-address", ("0.0.0.0/0",)))

    def test_forwarded_host_checked(self) -> None:
        """A forwarded host that could add a path or credentials to the URL is ignored."""
        for bad in ("a.io/x", "user@a.io", "a.io b", "a.io?q", ""):
            self.assertIsNone(
                forwarded({"x-forwarded-host": bad}, "127.0.0.1", ("127.0.0.1",)).host
            )

    def test_policy_keys_validated(self) -> None:
        """pty_public_url must be ws(s) with a host; trusted_proxies addresses or CIDRs."""
        table = default_table()
        for doc, text in (
            ({"pty_public_url": "http://x"}, "pty_public_url"),
            ({"pty_public_url": "wss://x/?a=1"}, "query"),
            ({"trusted_proxies": ["10.0.0.0/33"]}, "trusted_proxies"),
            ({"trusted_proxies": "10.0.0.1"}, "trusted_proxies"),
        ):
            with self.assertRaises(PolicyError) as cm:
                load_policy(table, explicit=doc, base_dir="/tmp", environ={})
            self.assertIn(text, str(cm.exception))
        policy = load_policy(
            table,
            explicit={
                "pty_public_url": "wss://x.io/t/",
                "trusted_proxies": ["10.0.0.0/8", "::1"],
            },
            base_dir="/tmp",
            environ={},
        )
        self.assertEqual(policy.document.pty_public_url, "wss://x.io/t")
        self.assertEqual(policy.document.trusted_proxies, ("10.0.0.0/8", "::1"))

    def test_option_validated(self) -> None:
        """--pty-public-url is checked when the options are parsed."""
        base = os.path.abspath(self.mktemp())
        os.makedirs(base)
        self.patch(os, "environ", {})
        with self.assertRaises(usage.UsageError):
            Options().parseOptions(["--base-dir", base, "--pty-public-url", "ftp://x"])
        options = Options()
        options.parseOptions(["--base-dir", base, "--pty-public-url", "ws://h:19001"])
        self.assertEqual(options.settings().pty_public_url, "ws://h:19001")


class WsUrlTests(TerminalCase):
    """What POST /pty/sessions answers, behind a port mapping or a proxy."""

    @inlineCallbacks
    def ws_url(self, headers: dict[str, str] | None = None) -> Any:
        created = yield self.create(headers=headers)
        yield self.request("DELETE", f"/pty/sessions/{created['session_id']}")
        return created["ws_url"].split("/pty?")[0]

    @inlineCallbacks
    def test_settings_public_url(self) -> Any:
        """--pty-public-url (docker -p 19001:9001) is the base of ws_url."""
        yield self.daemon.stop()
        yield self.start(pty_public_url="ws://localhost:19001")
        self.assertEqual((yield self.ws_url()), "ws://localhost:19001")

    @inlineCallbacks
    def test_policy_public_url(self) -> Any:
        """The policy's pty_public_url is used when no option is given."""
        yield self.daemon.stop()
        yield self.start(policy={"pty_public_url": "wss://sb.example.com/t"})
        self.assertEqual((yield self.ws_url()), "wss://sb.example.com/t")

    @inlineCallbacks
    def test_forwarded_only_from_trusted(self) -> Any:
        """X-Forwarded-Proto/Host change ws_url from a trusted proxy, not from anyone else."""
        spoof = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "sb.example.com"}
        plain = yield self.ws_url(spoof)
        self.assertEqual(plain, f"ws://127.0.0.1:{self.pty_port}")
        yield self.daemon.stop()
        yield self.start(policy={"trusted_proxies": ["127.0.0.0/8"]})
        self.assertEqual((yield self.ws_url(spoof)), "wss://sb.example.com")
