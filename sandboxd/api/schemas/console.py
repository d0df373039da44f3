"""What the endpoints of the web console's page and assets take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema

SCHEMAS: dict[str, Schema] = {
    "ui_assets": Schema(
        produces="binary",
        headers=(F("If-None-Match", doc="an asset's ETag: 304 when it still matches"),),
        errors=(
            E(404, "not_found", "no such asset, or another version's", "NotFoundError"),
        ),
        notes="`/ui/` is the page (never cached); `/ui/{release}/{asset}` its ES "
        "modules, styles and the vendored xterm.js (immutable: the version names "
        "their digest). Static code only: no token needed; the page logs in with "
        "a link (`sandboxd ui`). Every answer carries the console's strict "
        "Content-Security-Policy. See docs/console.md.",
    ),
}
