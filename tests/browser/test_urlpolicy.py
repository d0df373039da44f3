"""
The ``url_allow``/``url_deny`` globs the browser, git remotes and
webhooks share: the host part of a glob matches the host alone (no ``*``
there reaches into the path), and a URL's ``user@`` names no place.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.browser.urlpolicy import (
    Refusal,
    UrlPolicy,
    UrlTarget,
    check_host,
    check_url,
    combined,
    glob_names,
    url_refusal,
)
from tests.helpers import DaemonTestCase


def target(url: str) -> UrlTarget:
    found = UrlTarget.of(url)
    assert found is not None, url
    return found


class CombinedTests(SynchronousTestCase):
    """The browser's one rule, from the rules of its endpoints."""

    def refused_by(self, policy: UrlPolicy, url: str) -> str | None:
        try:
            check_url(policy, url)
        except Refusal as refusal:
            return refusal.rule
        return None

    def test_strictest_wins(self) -> None:
        """
        Every endpoint's url_deny refuses, naming its own rule; a URL must
        be in every url_allow list; block_private_networks on one holds
        for the whole rule; equal rules make one.
        """
        navigate = UrlPolicy(
            deny=("*/admin*",),
            allow=("*.example.com", "example.org"),
            block_private=True,
            rules={
                "params.url_deny": "policy:endpoints.browser_navigate",
                "params.url_allow": "policy:endpoints.browser_navigate",
                "params.block_private_networks": "policy:endpoints.browser_navigate",
            },
        )
        click = UrlPolicy(
            deny=("*/billing*",),
            allow=("*.example.com",),
            rules={
                "params.url_deny": "policy:endpoints.browser_click",
                "params.url_allow": "policy:endpoints.browser_click",
            },
        )
        plain = UrlPolicy()
        rule = combined([plain, navigate, click, plain])
        self.assertEqual(
            self.refused_by(rule, "https://a.example.com/admin"),
            "policy:endpoints.browser_navigate",
        )
        self.assertEqual(
            self.refused_by(rule, "https://a.example.com/billing"),
            "policy:endpoints.browser_click",
        )
        self.assertEqual(
            self.refused_by(rule, "https://example.org/"),
            "policy:endpoints.browser_click",
        )
        self.assertIsNone(self.refused_by(rule, "https://a.example.com/x"))
        self.assertTrue(rule.block_private)
        with self.assertRaises(Refusal) as caught:
            check_host(rule, "http://localhost/", "localhost")
        self.assertEqual(caught.exception.rule, "policy:endpoints.browser_navigate")
        self.assertEqual(UrlPolicy.from_json(rule.to_json()), rule)
        self.assertEqual(combined([navigate, navigate]), navigate)


class GlobTests(SynchronousTestCase):
    """What one glob names."""

    def test_host_glob_stays_in_the_host(self) -> None:
        """``*`` in a glob's host matches within the host, never across ``/``."""
        glob = "http://*.example.com/*"
        self.assertTrue(glob_names(glob, target("http://a.example.com/x")))
        self.assertTrue(glob_names(glob, target("http://A.b.Example.com")))
        for url in (
            "http://127.0.0.1:9432/.example.com/",
            "http://127.0.0.1:9432/?.example.com/",
            "http://evil.test/a.example.com/b",
            "https://a.example.com/x",
        ):
            self.assertFalse(glob_names(glob, target(url)), url)

    def test_userinfo_names_no_place(self) -> None:
        """``user:pass@`` before the host is not part of what is matched."""
        self.assertTrue(
            glob_names("http://localhost:9432/*", target("http://u@localhost:9432/p"))
        )
        self.assertTrue(
            glob_names(
                "*://169.254.169.254/*", target("http://x:y@169.254.169.254/latest")
            )
        )

    def test_ports(self) -> None:
        """A glob without a port names every port; one with a port, that port (or the default)."""
        self.assertTrue(glob_names("example.com", target("https://example.com:8443/a")))
        self.assertTrue(glob_names("example.com:443", target("https://example.com/a")))
        self.assertFalse(glob_names("example.com:80", target("https://example.com/a")))
        self.assertTrue(glob_names("[::1]:80", target("http://[::1]/")))
        self.assertFalse(glob_names("[::2]", target("http://[::1]/")))

    def test_paths(self) -> None:
        """A glob's path part matches the path and query; none means any path."""
        self.assertTrue(glob_names("*/private/*", target("https://h/private/x?q=1")))
        self.assertFalse(glob_names("*/private/*", target("https://h/public/private")))
        self.assertTrue(
            glob_names("github.com/org/*", target("https://github.com/org/r"))
        )
        self.assertFalse(
            glob_names("github.com/org/*", target("https://github.com/other/r"))
        )


class RefusalTests(SynchronousTestCase):
    """Deny and allow lists together."""

    def test_deny_also_as_one_glob_over_the_url(self) -> None:
        """A deny glob written over the whole URL still refuses what it matches."""
        self.assertEqual(
            url_refusal(("*secret*",), None, target("https://h/a/secret.txt")),
            ("*secret*", "params.url_deny"),
        )
        self.assertEqual(
            url_refusal(
                ("http://localhost:9432/*",), None, target("http://u@localhost:9432/p")
            ),
            ("http://localhost:9432/*", "params.url_deny"),
        )

    def test_allow_names_the_host(self) -> None:
        """An allowed host carried in another URL's path does not let it through."""
        allow = ("https://*.example.com/*",)
        self.assertIsNone(url_refusal((), allow, target("https://a.example.com/x")))
        self.assertEqual(
            url_refusal((), allow, target("https://evil.test/a.example.com/x")),
            ("", "params.url_allow"),
        )


class BrowserRefusalTests(DaemonTestCase):
    """The browser refuses by these rules before any browser starts."""

    policy = {
        "groups": {"browser": True},
        "endpoints": {
            "browser_*": {
                "params": {
                    "url_allow": ["http://*.example.com/*", "http://127.0.0.1:*/*"],
                    "url_deny": ["http://127.0.0.1:*/private*"],
                }
            }
        },
    }

    @inlineCallbacks
    def test_refused_before_a_browser_starts(self) -> Any:
        """A deny dodged with ``user@``, an allowed host faked in a path: 403."""
        denied, outside = "is denied by policy", "is not in the allowed list"
        for url, why in (
            ("http://user@127.0.0.1:9/private", denied),
            ("http://10.9.9.9:9/.example.com/", outside),
            ("http://10.9.9.9:9/?.example.com/", outside),
        ):
            reply = yield self.request("POST", "/browser/navigate", {"url": url})
            self.assertEqual(reply.status, 403, (url, reply.body))
            body = reply.json()
            self.assertEqual(body["code"], "url_not_allowed", url)
            self.assertEqual(body["rule"], "policy:endpoints.browser_*", url)
            self.assertIn(why, body["error"], url)
        browser = self.daemon.context.browser
        assert browser is not None
        self.assertEqual(browser.starts, 0)
