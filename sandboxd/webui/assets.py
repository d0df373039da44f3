# -*- test-case-name: tests.webui.test_assets -*-
"""
The web console's files as the daemon serves them: the page, the app's ES
modules and the vendored xterm.js, read once from the package and kept.

The page lives at ``/ui/``; everything it loads lives below a versioned
path, ``/ui/v{version}-{digest}/NAME``, where the digest covers every
asset, so an asset's URL changes whenever its bytes do and its answer can
be cached as immutable.  The page itself is never cached (it names the
current version).

The daemon's origin is trusted (a same-origin WebSocket is always
allowed), so what it serves there must not run anybody's script but its
own: every answer carries the console's strict CSP (no inline script, no
``eval``, nothing fetched from elsewhere), and the app renders files as
text nodes or blob images only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from sandboxd._version import __version__

STATIC = Path(__file__).resolve().parent / "static"

#: The console's Content-Security-Policy.  ``style-src 'unsafe-inline'``
#: is for styles only: xterm.js sets element styles at run time.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' blob: data:; connect-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)

#: Response headers every console file carries.
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".LICENSE": "text/plain; charset=utf-8",
}

#: What the page's template calls the versioned directory.
VERSION_MARK = b"{{ASSETS}}"


@attrs.frozen
class Asset:
    """One file: its bytes, type and entity tag."""

    body: bytes
    content_type: str
    etag: str


def _asset(body: bytes, name: str) -> Asset:
    suffix = name[name.rfind(".") :] if "." in name else ""
    digest = hashlib.sha256(body).hexdigest()[:20]
    return Asset(body, _TYPES.get(suffix, "application/octet-stream"), f'"{digest}"')


@attrs.frozen
class Assets:
    """
    The page and the files below its versioned directory.

    :ivar version: the directory's name (``v0.1.0-1a2b3c4d``).
    """

    version: str
    page: Asset
    files: dict[str, Asset]

    def get(self, name: str) -> Asset | None:
        """One asset by its name (flat: the app and the vendored files)."""
        return self.files.get(name)


def read(static: Path = STATIC) -> Assets:
    """Read every asset from ``static`` (the app) and ``static/vendor``."""
    files: dict[str, bytes] = {}
    for folder in (static, static / "vendor"):
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name != "index.html":
                files[path.name] = path.read_bytes()
    digest = hashlib.sha256()
    for name, body in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(body).digest())
    version = f"v{__version__}-{digest.hexdigest()[:8]}"
    page = (static / "index.html").read_bytes().replace(VERSION_MARK, version.encode())
    return Assets(
        version,
        _asset(page, "index.html"),
        {name: _asset(body, name) for name, body in files.items()},
    )


_loaded: Assets | None = None


def assets() -> Assets:
    """The package's assets, read on the console's first request (≈ 400 KB)."""
    global _loaded
    if _loaded is None:
        _loaded = read()
    return _loaded


__all__ = ["CSP", "SECURITY_HEADERS", "STATIC", "Asset", "Assets", "assets", "read"]
