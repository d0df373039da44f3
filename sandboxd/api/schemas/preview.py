"""What the endpoints of the preview door's exposures take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema
from sandboxd.api.fragments import LINK_MINTED

_EXPOSURE = (
    F("port", "integer"),
    F("label", nullable=True),
    F("public", "boolean"),
    F("host_header"),
    F("url", doc="where a browser opens it"),
    F("listening", "boolean", "something listens on the port now"),
    F("exposed_by", doc="the identity that exposed it"),
    F("created_at", doc="ISO 8601 UTC"),
    F("expires_at", doc="ISO 8601 UTC, or null", nullable=True),
    F("requests", "integer"),
    F("bytes_in", "integer"),
    F("bytes_out", "integer"),
    F("open_websockets", "integer"),
)


SCHEMAS: dict[str, Schema] = {
    "preview_ports_list": Schema(
        response=(
            F(
                "ports",
                "array",
                "[{port, label, public, url, listening, exposed, previewable, "
                "exposed_by, ...}]: every exposure, and every other listening port "
                "(exposed: false); previewable: a preview of the port can open now "
                "(the door listens and POST /preview/ports would not answer "
                "port_not_allowed: not one of the daemon's own ports, inside "
                "params.ports, outside params.deny_ports; and the port listens on "
                "127.0.0.1, ::1 or a wildcard address, where the door connects)",
                items="object",
            ),
        ),
    ),
    "preview_expose": Schema(
        body=(
            F(
                "port",
                "integer",
                "a port of an app in the sandbox",
                required=True,
                example=3000,
                minimum=1,
                maximum=65535,
            ),
            F(
                "label",
                doc="a name in the URL: PORT-LABEL.DOMAIN, or /p/PORT-LABEL/ in"
                " path mode; a labelled exposure answers to its label only",
            ),
            F(
                "public",
                "boolean",
                "anyone who can reach the door may use it",
                default=False,
            ),
            F("ttl_seconds", "number", "the exposure ends then (cut to 366 days)"),
            F(
                "host_header",
                doc="the Host the app sees",
                enum=("upstream", "preserve"),
                default="upstream",
            ),
        ),
        status=201,
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "a port, label or ttl it cannot take"),
            E(
                403,
                "port_not_allowed",
                "outside params.ports, or one of the daemon's own ports",
            ),
            E(403, "param_not_allowed", "public while params.allow_public is false"),
            E(
                403,
                "permission_denied",
                "another identity exposed the port (only it, or an identity "
                "holding *, may expose it again)",
            ),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (64) exposures, or the caller's share of "
                "them (max_per_identity: half when more than one identity can "
                "log in)",
                "ResourceError",
            ),
            E(
                503,
                "unavailable",
                "the preview door does not listen (--preview-port)",
                "RuntimeError",
            ),
        ),
        notes="Exposing a port the caller exposed again replaces its exposure.",
    ),
    "preview_get": Schema(
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "port is not 1-65535"),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
    ),
    "preview_unexpose": Schema(
        response=_EXPOSURE,
        errors=(
            E(400, "invalid_param", "port is not 1-65535"),
            E(
                403,
                "permission_denied",
                "another identity exposed the port (only it, or an identity "
                "holding *, may unexpose it)",
            ),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
        notes="Requests and WebSockets in flight to the port are closed.",
    ),
    "preview_link": Schema(
        body=(
            F(
                "ttl_seconds",
                "number",
                "cut to limits.max_link_ttl_seconds (3600)",
                default=900,
                example=900,
            ),
            F("uses", "integer", "how many times it may be opened", minimum=1),
        ),
        status=201,
        response=(*LINK_MINTED,),
        errors=(
            E(400, "invalid_param", "port, ttl or uses malformed"),
            E(
                403,
                "missing_scope",
                "the caller lacks preview:use, which the link carries",
            ),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
        ),
        notes="url opens the preview in a browser: the door sets a cookie for the "
        "port's host and redirects to the same URL without the link.",
    ),
    "preview_proxy": Schema(
        produces="binary",
        errors=(
            E(
                401,
                "link_invalid",
                "no credential for a private preview, or a bad, revoked or used-up link",
                "AuthError",
            ),
            E(401, "link_expired", "the link expired", "AuthError"),
            E(
                403,
                "port_not_allowed",
                "the port may not be previewed (to a caller without a credential:"
                " 401 link_invalid)",
            ),
            E(
                403,
                "origin_not_allowed",
                "the door's cookie, from another page's Origin",
            ),
            E(404, "port_not_exposed", "nobody exposed this port", "NotFoundError"),
            E(
                421,
                "misdirected_request",
                "a Host that names no preview, or on the door's own names a path"
                " that names no port",
            ),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (64) WebSockets are open through the door, or"
                " the holder's share of them (max_per_identity; the public previews'"
                " visitors are one holder), none idle for a minute",
                "ResourceError",
            ),
            E(
                502,
                "upstream_unavailable",
                "nothing answers on the port (browsers get a page that retries; an"
                " EventSource a 200 event stream asking it to retry), or the app"
                " answered something the door cannot pass on (the message says what),"
                " or it listens only where the door does not connect (listens_on"
                " names where, the message how to bind)",
                "ConnectionError",
            ),
            E(
                504,
                "upstream_timeout",
                "no response head within limits.timeout_seconds (60)",
                "TimeoutError",
            ),
        ),
        notes="On the preview port (--preview-port), not the HTTP port: any method "
        "and path at http://PORT.localhost:PREVIEW_PORT/ (or PORT-LABEL.DOMAIN, or "
        "/p/PORT/ or /p/PORT-LABEL/ in path mode) is proxied to 127.0.0.1:PORT, "
        "WebSocket upgrades included. See docs/preview.md.",
    ),
}
