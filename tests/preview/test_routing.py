"""Which port a Host (or a /p/PORT path) names, and the URLs the door gives out."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.preview.headers import cookie_allowed, rewrite_location
from sandboxd.preview.routing import Routes, Target


class RoutesTests(SynchronousTestCase):
    """Host mode, path mode, the public URL, and what matches nothing."""

    def test_default_domain(self) -> None:
        """``PORT.localhost`` and ``PORT-LABEL.localhost``; path mode on loopback names."""
        routes = Routes("localhost")
        self.assertEqual(
            routes.match("3000.localhost:9002", b"/a?b=1"),
            Target(3000, None, "", b"/a?b=1"),
        )
        self.assertEqual(routes.match("3000-web.LOCALHOST", b"/").label, "web")  # type: ignore[union-attr]
        self.assertEqual(
            routes.match("127.0.0.1:9002", b"/p/5173/src/main.ts"),
            Target(5173, None, "/p/5173", b"/src/main.ts"),
        )
        self.assertEqual(routes.match("localhost", b"/p/5173").path, b"/")  # type: ignore[union-attr]
        self.assertEqual(
            routes.match("localhost", b"/p/5173-web/a?b"),
            Target(5173, "web", "/p/5173-web", b"/a?b"),
        )
        self.assertEqual(
            routes.match("localhost", b"/p/5173-web?b"),
            Target(5173, "web", "/p/5173-web", b"/?b"),
        )
        for host, target in [
            ("evil.example", b"/"),
            ("3000.localhost.evil.example", b"/"),
            ("99999.localhost", b"/"),
            ("0.localhost", b"/"),
            ("evil.example", b"/p/3000/"),
            ("127.0.0.1", b"/other"),
            ("127.0.0.1", b"/p/3000-/"),
            ("127.0.0.1", b"/p/3000-Web/"),
            ("127.0.0.1", b"/p/3000web/"),
        ]:
            self.assertIsNone(routes.match(host, target), host)
        self.assertEqual(routes.url(3000, None, 9002), "http://3000.localhost:9002/")
        self.assertEqual(
            routes.url(3000, "web", 9002), "http://3000-web.localhost:9002/"
        )

    def test_public_url(self) -> None:
        """A public URL with {port} adds a host pattern; without it, path mode on its host."""
        hosts = Routes("localhost", "https://{port}-sbx42.example.com")
        self.assertEqual(hosts.match("3000-sbx42.example.com", b"/").port, 3000)  # type: ignore[union-attr]
        self.assertEqual(hosts.url(3000, None, 9002), "https://3000-sbx42.example.com/")
        paths = Routes("localhost", "https://sbx42.example.com")
        self.assertEqual(paths.match("sbx42.example.com", b"/p/8080/x").port, 8080)  # type: ignore[union-attr]
        self.assertIsNone(paths.match("sbx43.example.com", b"/p/8080/x"))
        self.assertEqual(
            paths.url(8080, None, 9002), "https://sbx42.example.com/p/8080/"
        )
        # The label is in the path as it is in a host name: the URL handed
        # out for a labelled exposure is one its label answers to.
        url = paths.url(8080, "web", 9002)
        self.assertEqual(url, "https://sbx42.example.com/p/8080-web/")
        found = paths.match(
            "sbx42.example.com", url.encode()[len("https://sbx42.example.com") :]
        )
        self.assertEqual(found, Target(8080, "web", "/p/8080-web", b"/"))


class HeaderRulesTests(SynchronousTestCase):
    """Cookies an app may set, and Locations rewritten."""

    def test_cookies(self) -> None:
        """The app's own cookies pass; ours and wider domains' do not."""
        host = "3000.localhost"
        self.assertTrue(cookie_allowed(b"a=1; Path=/", host))
        self.assertTrue(cookie_allowed(b"a=1; Domain=3000.localhost", host))
        self.assertFalse(cookie_allowed(b"sbx_p_3001=x", host))
        self.assertFalse(cookie_allowed(b"a=1; Domain=.localhost", host))
        self.assertFalse(cookie_allowed(b"a=1; domain=localhost", host))

    def test_location(self) -> None:
        """The app's own localhost:PORT becomes the preview; other ports and hosts stay."""
        origin = "http://3000.localhost:9002"
        self.assertEqual(
            rewrite_location(b"http://localhost:3000/x?y", 3000, origin, ""),
            b"http://3000.localhost:9002/x?y",
        )
        self.assertEqual(
            rewrite_location(b"http://127.0.0.1:3000", 3000, origin, ""),
            b"http://3000.localhost:9002/",
        )
        self.assertEqual(
            rewrite_location(b"http://localhost:4000/x", 3000, origin, ""),
            b"http://localhost:4000/x",
        )
        self.assertEqual(
            rewrite_location(b"/login", 3000, origin, "/p/3000"), b"/p/3000/login"
        )
        self.assertEqual(
            rewrite_location(b"//cdn/x", 3000, origin, "/p/3000"), b"//cdn/x"
        )

    def test_protocol_relative_location(self) -> None:
        """
        ``//localhost:PORT/x`` (no scheme) is the app's own address as much
        as ``http://localhost:PORT/x`` is: rewritten the same, in host
        mode and path mode; another port or host stays.
        """
        origin = "http://3000.localhost:9002"
        for local in (b"localhost", b"127.0.0.1", b"[::1]", b"0.0.0.0", b"LOCALHOST"):
            self.assertEqual(
                rewrite_location(b"//" + local + b":3000/x?y", 3000, origin, ""),
                b"http://3000.localhost:9002/x?y",
                local,
            )
        self.assertEqual(
            rewrite_location(
                b"//localhost:3000", 3000, "http://127.0.0.1:9002", "/p/3000"
            ),
            b"http://127.0.0.1:9002/p/3000/",
        )
        for kept in (b"//localhost:4000/x", b"//cdn.example/x", b"//localhost/x"):
            self.assertEqual(rewrite_location(kept, 3000, origin, ""), kept)
