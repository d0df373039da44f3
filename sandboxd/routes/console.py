# -*- test-case-name: tests.webui.test_assets -*-
"""The ``console`` group: the web console's page and assets at ``/ui/``."""

from __future__ import annotations

from sandboxd.errors import not_found
from sandboxd.web.messages import ServerRequest, ServerResponse
from sandboxd.webui.assets import SECURITY_HEADERS, Asset, assets

#: A versioned asset never changes (its URL does), so a year is safe.
IMMUTABLE = "public, max-age=31536000, immutable"


def _answer(request: ServerRequest, asset: Asset, cache: str) -> ServerResponse:
    headers = {
        **SECURITY_HEADERS,
        "Content-Type": asset.content_type,
        "Cache-Control": cache,
        "ETag": asset.etag,
    }
    if request.headers.get("if-none-match") == asset.etag:
        return ServerResponse(status=304, headers=headers, raw=b"")
    return ServerResponse(status=200, headers=headers, raw=asset.body)


def ui_assets(request: ServerRequest) -> ServerResponse:
    """
    ``GET /ui/``: the page (never cached: it names the current assets);
    ``GET /ui/{release}/{asset}``: one asset, immutable.  Another version's
    asset is 404, so a stale page reloads rather than mixing versions.
    """
    found = assets()
    version = request.path_params.get("release")
    if version is None:
        return _answer(request, found.page, "no-cache")
    asset = found.get(request.path_params.get("asset", ""))
    if version != found.version or asset is None:
        raise not_found(f"no console asset {request.path}")
    return _answer(request, asset, IMMUTABLE)


HANDLERS = {"ui_assets": ui_assets}
