"""What the endpoints of the headless browser take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Field, Schema

_BROWSER = (
    E(
        403,
        "url_not_allowed",
        "a URL refused by url_allow/url_deny/schemes/private networks",
    ),
    E(
        408,
        "timeout",
        "the call ran past its timeout: a navigate's own navigation is stopped; "
        "a page still waiting for a slow server (a click or a script started a "
        "navigation) is kept, and the message says it is still loading; a page "
        "that no longer answers (a script that never yields) is replaced by a "
        "fresh blank one (cookies kept), as the message says",
        "TimeoutError",
    ),
    E(
        429,
        "concurrency_limited",
        "too many calls queued for the shared page",
        "ResourceError",
    ),
    E(
        502,
        "upstream_unavailable",
        "the browser failed, not the request (kind page_crashed: the page's "
        "renderer crashed and a fresh blank page replaces it; kind browser_exited: "
        "Chromium exited and the next call starts it afresh, without cookies)",
        "RuntimeError",
    ),
    E(
        503,
        "unavailable",
        "Playwright or Chromium is not installed, or did not start within "
        "start_timeout_seconds (a later call starts it again)",
        "RuntimeError",
    ),
)


def _timeout(default: int) -> Field:
    return F("timeout", "number", "milliseconds", default=default)


SCHEMAS: dict[str, Schema] = {
    "browser_navigate": Schema(
        body=(
            F("url", required=True, example="https://example.com"),
            F(
                "wait_until",
                enum=("load", "domcontentloaded", "networkidle", "commit"),
                default="load",
            ),
            _timeout(30000),
        ),
        response=(F("url"), F("title"), F("status", "integer")),
        errors=(
            E(
                400,
                "invalid_param",
                "a url with no scheme or no host, one that answers with a file to "
                "download, one that does not load; bad wait_until or timeout",
            ),
            *_BROWSER,
        ),
        notes="Only http and https unless the policy allows another scheme. With "
        "block_private_networks, localhost, localhost. and *.localhost are refused by "
        "name, a name that does not resolve counts as private, and every connection the "
        "page opens (redirects, subresources, fetches, WebSockets) goes to the address "
        "the worker resolved and checked. A URL with no scheme (example.com, "
        "127.0.0.1:8000/) is a 400, not a policy refusal. navigate does not "
        "download files: fetch one with a command (curl -fLo FILE URL) and read it "
        "with /files/download.",
    ),
    "browser_screenshot": Schema(
        body=(
            F("full_page", "boolean", default=False),
            F("selector", doc="an element to capture, as the page is now"),
            F("type", enum=("png", "jpeg"), default="png"),
            F(
                "format",
                enum=("png", "jpeg"),
                doc="agent-sandbox-server's name for type",
            ),
            F("quality", "integer", "jpeg only, 0..100"),
            _timeout(30000),
        ),
        response=(F("image_base64"), F("width", "integer"), F("height", "integer")),
        errors=(
            E(
                400,
                "invalid_param",
                "bad type or format, quality or timeout; the selector's element "
                "is not visible",
            ),
            E(404, "not_found", "no element matches selector", "ValueError"),
            E(
                413,
                "payload_too_large",
                "the image is too large to make or to send: a JPEG over 65535 "
                "pixels a side (limit 65535), or an answer over the browser's "
                "limit; take a png, a selector or the viewport",
                "ResourceError",
            ),
            *_BROWSER,
        ),
    ),
    "browser_content": Schema(
        query=(
            F("type", enum=("html", "text"), default="html", example="text"),
            F(
                "offset",
                "integer",
                "the first byte of the page's text to give",
                default=0,
            ),
            F(
                "max_bytes",
                "integer",
                "bytes to give at most; the policy's limits.max_bytes (1 MiB) "
                "when absent, and never more",
            ),
            F("timeout", "number", "milliseconds", default=30000),
        ),
        response=(
            F("content"),
            F("url"),
            F("title"),
            F("total_bytes", "integer", "the whole text's size, in UTF-8 bytes"),
            F("offset", "integer", "where content starts"),
            F("truncated", "boolean", "more follows: read on from next_offset"),
            F("next_offset", "integer", "with truncated: the offset to ask next"),
        ),
        errors=(E(400, "invalid_param", "bad type, offset or max_bytes"), *_BROWSER),
        notes="Offsets count bytes of the UTF-8 text and are moved to whole "
        "characters. Each call reads the page as it is then: a page that changes "
        "between calls gives parts of different texts. Through MCP, content is cut "
        "further to fit one tool result (truncated and next_offset say so).",
    ),
    "browser_click": Schema(
        body=(F("selector", required=True, example="button#submit"), _timeout(5000)),
        response=(F("clicked", "boolean"), F("selector")),
        errors=(E(400, "invalid_param", "missing selector"), *_BROWSER),
    ),
    "browser_type": Schema(
        body=(
            F("selector", required=True, example="input[name=q]"),
            F("text", required=True, example="sandboxd"),
            F("clear", "boolean", "empty the field first", default=False),
            F("delay", "number", "milliseconds between keys", default=0),
            _timeout(5000),
        ),
        response=(F("typed", "boolean"), F("selector"), F("text")),
        errors=(
            E(400, "invalid_param", "missing selector or text, or too slow to type"),
            *_BROWSER,
        ),
    ),
    "browser_evaluate": Schema(
        body=(F("script", required=True, example="document.title"), _timeout(10000)),
        response=(F("result", "any"),),
        errors=(
            E(400, "invalid_param", "missing script, or the script threw"),
            E(
                413,
                "payload_too_large",
                "the result is over the policy's limits.max_bytes (1 MiB) as JSON",
                "ResourceError",
            ),
            *_BROWSER,
        ),
        notes="The result as JSON can carry it: NaN, Infinity and -Infinity as "
        "those strings (as JavaScript prints them), a Date as its toISOString() "
        "(an invalid Date reads as the epoch: return String(date) to tell), a RegExp "
        'as its String() (/re/g), an object met again inside itself as "[Circular]", '
        "nothing below 64 levels (null).",
    ),
    "browser_pdf": Schema(
        body=(
            F("format", doc="paper: Letter, Legal, A0..A6 ...", default="A4"),
            F("landscape", "boolean", default=False),
            _timeout(30000),
        ),
        response=(F("pdf_base64"), F("pages", "integer")),
        errors=(E(400, "invalid_param", "unknown format"), *_BROWSER),
    ),
    "browser_console": Schema(
        query=(F("timeout", "number", "milliseconds", default=5000),),
        response=(
            F(
                "logs",
                "array",
                "[{type, text, timestamp}]; an entry cut to 16 KiB has "
                "truncated: true and its whole size in bytes; a dialog the page "
                "opened is type dialog, its kind (alert, confirm, prompt, "
                "beforeunload) in dialog",
                items="object",
            ),
            F(
                "dropped",
                "integer",
                "only when some were: the oldest entries left out since the last read",
            ),
        ),
        errors=_BROWSER,
        notes="The buffer (1000 entries, 1 MiB of text) is cleared by each read; past "
        "either bound the oldest entries are dropped and counted.",
    ),
}
