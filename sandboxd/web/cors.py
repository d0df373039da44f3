# -*- test-case-name: tests.web.test_pipeline -*-
"""
CORS for the browser origins a policy allows (``allowed_origins``).

A page on an allowed origin (a web console, say) can call the REST routes:
its preflight ``OPTIONS`` request is answered without credentials (browsers
never send them on a preflight), and every response to an allowed origin
says so.  Any other origin never gets this far: the pipeline refuses it
with 403 ``origin_not_allowed`` (SPEC §3 step 5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandboxd.endpoints import HTTP_METHODS

#: Request headers a browser may send cross-origin.
ALLOW_HEADERS = "Authorization, Content-Type, If-Match, If-None-Match, Last-Event-ID, Range, X-Access-Token"
#: Response headers a browser script may read.
EXPOSE_HEADERS = "Content-Range, ETag, Last-Modified, Retry-After"
#: How long a browser may cache a preflight answer.
MAX_AGE_SECONDS = 600


def allowed_origin(
    headers: Mapping[bytes, Sequence[bytes]], allowed: Sequence[str]
) -> str | None:
    """The request's Origin when the policy allows it, else None."""
    values = headers.get(b"origin")
    if not values:
        return None
    origin = values[-1].decode("latin-1").strip()
    return origin if origin in allowed else None


def response_headers(origin: str) -> dict[str, str]:
    """Headers that let an allowed origin read a response."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": EXPOSE_HEADERS,
        "Vary": "Origin",
    }


def preflight_headers(origin: str) -> dict[str, str]:
    """The answer to an allowed origin's preflight."""
    return {
        **response_headers(origin),
        "Access-Control-Allow-Methods": ", ".join(HTTP_METHODS),
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": str(MAX_AGE_SECONDS),
    }


def is_preflight(method: str, headers: Mapping[bytes, Sequence[bytes]]) -> bool:
    """An ``OPTIONS`` request asking whether a cross-origin call may follow."""
    return method == "OPTIONS" and bool(headers.get(b"access-control-request-method"))
