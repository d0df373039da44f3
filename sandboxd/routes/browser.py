# -*- test-case-name: tests.browser.test_browser -*-
"""
Handlers of the ``browser`` group (SPEC §7.8).

Each handler checks its request here, in the daemon, and hands one
operation to the browser supervisor, which runs it on the one shared page
in the worker process.  A URL is refused here by scheme and glob before any
browser starts; the worker checks it again, with its resolved addresses,
for the navigation itself and every request the page makes after it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from sandboxd.browser.urlpolicy import Refusal, UrlPolicy, check_url, combined
from sandboxd.errors import Code, bad_request, forbidden, unavailable
from sandboxd.policy import defaults
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import resolve_user
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import flag, integer, number, one_of, required, string

WAIT_UNTIL = ("load", "domcontentloaded", "networkidle", "commit")
IMAGE_TYPES = ("png", "jpeg")
PDF_FORMATS = (
    "Letter",
    "Legal",
    "Tabloid",
    "Ledger",
    "A0",
    "A1",
    "A2",
    "A3",
    "A4",
    "A5",
    "A6",
)


def url_policy(rule: EffectiveRule) -> UrlPolicy:
    """The URL rules of an endpoint's merged rule."""
    params = rule.params
    leaves = (
        "params.url_allow",
        "params.url_deny",
        "params.url_schemes",
        "params.block_private_networks",
    )
    return UrlPolicy(
        allow=params.url_allow,
        deny=params.url_deny,
        schemes=tuple(s.lower() for s in params.url_schemes),
        block_private=params.block_private_networks,
        rules={leaf: source for leaf in leaves if (source := rule.source(leaf))},
    )


def browser_url_policy(request: ServerRequest) -> UrlPolicy:
    """
    The URL rules of the whole browser: the strictest of every browser
    endpoint's (see :func:`combined`).  The page is one, and so is the rule
    its requests meet: the rule of the endpoint called last would let a
    click or a script load what a rule on navigate alone refuses.
    """
    rules = request.context.policy.rules
    return combined(
        [url_policy(rules[endpoint]) for endpoint in HANDLERS if endpoint in rules]
        or [url_policy(request.rule)]
    )


def timeout_ms(request: ServerRequest, op: str, value: Any = None) -> int:
    """
    A call's timeout in milliseconds: the request's, else the default; at
    most the endpoint's ``limits.timeout_seconds`` (or the built-in ceiling).
    """
    if value is None:
        value = (
            request.body.get("timeout")
            if request.method == "POST"
            else request.arg("timeout")
        )
    ceiling = defaults.BROWSER_MAX_TIMEOUT_MS
    if request.rule.limits.timeout_seconds is not None:
        ceiling = int(request.rule.limits.timeout_seconds * 1000)
    if value is None:
        return min(defaults.BROWSER_TIMEOUTS_MS[op], ceiling)
    millis = number(value, "timeout")
    if millis <= 0:
        raise bad_request("'timeout' must be a positive number of milliseconds")
    return max(1, min(int(millis), ceiling))


async def _call(
    request: ServerRequest, op: str, args: dict[str, Any], timeout: int
) -> dict[str, Any]:
    service = request.context.browser
    if service is None:
        raise unavailable("the browser service is not running")
    args = {"policy": browser_url_policy(request).to_json(), **args}
    run_as = resolve_user(None, request.rule)
    return await service.get().call(
        op,
        args,
        timeout,
        run_as=run_as,
        start_timeout=request.rule.limits.start_timeout_seconds,
        idle_timeout=request.rule.limits.idle_timeout_seconds,
    )


def absolute_url(url: str) -> None:
    """
    Refuse, as the caller's mistake (400), a URL that is no absolute URL:
    one with no scheme (``example.com``, ``127.0.0.1:8000/``, which would
    otherwise read as the scheme ``127.0.0.1``) or a web URL with no host.
    Only what the policy refuses is a 403.
    """
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname
    except ValueError:
        raise bad_request(f"'url' is not a valid URL: {url!r}") from None
    # "localhost:8000/x": a host and port, not the scheme "localhost".
    lone_host = (
        bool(scheme)
        and not parts.netloc
        and re.match(r"\d+(/|$)", parts.path) is not None
    )
    if not scheme or lone_host:
        raise bad_request(
            f"'url' must be an absolute URL with a scheme, such as "
            f"http://{url.lstrip('/')} (got {url!r})"
        )
    if scheme in ("http", "https", "ws", "wss") and not host:
        raise bad_request(f"'url' has no host: {url!r}")


async def navigate(request: ServerRequest) -> dict[str, Any]:
    """``POST /browser/navigate {"url", "wait_until"?, "timeout"?}``."""
    url = required(request.body.get("url"), "url")
    absolute_url(url)
    try:
        check_url(browser_url_policy(request), url)
    except Refusal as refusal:
        if refusal.rule == "guard:url":
            # Not the policy's refusal: a URL that cannot be judged at all.
            raise bad_request(f"'url': {refusal.message}") from None
        raise forbidden(
            refusal.message, Code.URL_NOT_ALLOWED, rule=refusal.rule
        ) from None
    wait_until = one_of(
        request.body.get("wait_until", "load"), "wait_until", WAIT_UNTIL
    )
    timeout = timeout_ms(request, "navigate")
    return await _call(
        request, "navigate", {"url": url, "wait_until": wait_until}, timeout
    )


def image_type(body: dict[str, Any]) -> str:
    """
    The image type asked for: ``type``, or ``format`` as the seed's SDK
    sends it (both given, they must agree); png unless one is given.
    """
    given = {name: body[name] for name in ("type", "format") if name in body}
    for name, value in given.items():
        # Compared, never hashed: a JSON object or array here is a 400 too.
        if not isinstance(value, str) or value not in (*IMAGE_TYPES, "jpg"):
            raise bad_request(f"'{name}' must be png or jpeg")
    kinds = {"jpeg" if v == "jpg" else v for v in given.values()}
    if len(kinds) > 1:
        raise bad_request("'type' and 'format' disagree: give one of them")
    kind = kinds.pop() if kinds else "png"
    return str(kind)


async def screenshot(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /browser/screenshot {"full_page"?, "selector"?, "type"?}``;
    ``format`` is the seed's name for ``type``.
    """
    body = request.body
    kind = image_type(body)
    full_page = flag(body.get("full_page", False), "full_page", words=False)
    args: dict[str, Any] = {"type": kind, "full_page": full_page}
    selector = string(body.get("selector"), "selector", None)
    if selector:
        args["selector"] = selector
    quality = body.get("quality")
    if quality is not None:
        value = number(quality, "quality")
        if kind != "jpeg" or not 0 <= value <= 100:
            raise bad_request("'quality' is for jpeg, from 0 to 100")
        args["quality"] = int(value)
    return await _call(request, "screenshot", args, timeout_ms(request, "screenshot"))


def max_bytes(request: ServerRequest, endpoint: str, value: Any) -> int:
    """
    The bytes one answer may carry: ``value`` (the request's), else the
    endpoint's ``limits.max_bytes``, never more than that limit.
    """
    ceiling = (
        request.rule.limits.max_bytes or defaults.ENDPOINT_LIMITS[endpoint]["max_bytes"]
    )
    asked = integer(value, "max_bytes", None, low=1)
    return min(asked, ceiling) if asked is not None else int(ceiling)


async def content(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /browser/content?type=html|text&offset=&max_bytes=``: at most
    ``max_bytes`` of the page's UTF-8 text from byte ``offset`` (moved to
    whole characters); ``truncated`` and ``next_offset`` when more follows.
    """
    kind = request.arg("type") or "html"
    if kind not in ("html", "text"):
        raise bad_request("'type' must be html or text")
    args = {
        "type": kind,
        "offset": integer(request.arg("offset"), "offset", 0, low=0),
        "max_bytes": max_bytes(request, "browser_content", request.arg("max_bytes")),
    }
    return await _call(request, "content", args, timeout_ms(request, "content"))


async def click(request: ServerRequest) -> dict[str, Any]:
    """``POST /browser/click {"selector", "timeout"?}``."""
    selector = required(request.body.get("selector"), "selector")
    return await _call(
        request, "click", {"selector": selector}, timeout_ms(request, "click")
    )


async def type_text(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /browser/type {"selector", "text", "clear"?, "delay"?, "timeout"?}``:
    with ``clear``, the field is emptied before the text is typed.
    """
    body = request.body
    selector = required(body.get("selector"), "selector")
    text = string(body.get("text"), "text")
    clear = flag(body.get("clear", False), "clear", words=False)
    delay = number(body.get("delay", 0), "delay", low=0)
    timeout = timeout_ms(request, "type")
    # Typing with a delay takes delay x characters on top of finding the element.
    budget = timeout + int(delay * len(text))
    ceiling = defaults.BROWSER_MAX_TIMEOUT_MS
    if budget > ceiling:
        raise bad_request(
            f"typing {len(text)} characters {delay:g} ms apart would take longer than {ceiling} ms"
        )
    args = {
        "selector": selector,
        "text": text,
        "delay": delay,
        "timeout": timeout,
        "clear": clear,
    }
    return await _call(request, "type", args, budget)


async def evaluate(request: ServerRequest) -> dict[str, Any]:
    """``POST /browser/evaluate {"script", "timeout"?}``."""
    script = required(request.body.get("script"), "script")
    args = {
        "script": script,
        "max_bytes": max_bytes(request, "browser_evaluate", None),
    }
    return await _call(request, "evaluate", args, timeout_ms(request, "evaluate"))


async def pdf(request: ServerRequest) -> dict[str, Any]:
    """``POST /browser/pdf {"format"?, "landscape"?}``."""
    body = request.body
    page_format = body.get("format", "A4")
    if not isinstance(page_format, str):
        raise bad_request("'format' must be a paper format name")
    known = {f.lower(): f for f in PDF_FORMATS}
    if page_format.lower() not in known:
        raise bad_request(f"'format' must be one of {', '.join(PDF_FORMATS)}")
    landscape = flag(body.get("landscape", False), "landscape", words=False)
    args = {"format": known[page_format.lower()], "landscape": landscape}
    return await _call(request, "pdf", args, timeout_ms(request, "pdf"))


async def console(request: ServerRequest) -> dict[str, Any]:
    """``GET /browser/console``: the messages since the last read, then cleared."""
    result = await _call(
        request, "console", {}, timeout_ms(request, "console", value=None)
    )
    limit = request.rule.limits.max_entries
    logs = result.get("logs") or []
    dropped = int(result.get("dropped") or 0)
    if limit is not None and len(logs) > limit:
        dropped += len(logs) - limit
        logs = logs[-limit:]
    return {"logs": logs, "dropped": dropped} if dropped else {"logs": logs}


HANDLERS: dict[str, Any] = {
    "browser_navigate": navigate,
    "browser_screenshot": screenshot,
    "browser_content": content,
    "browser_click": click,
    "browser_type": type_text,
    "browser_evaluate": evaluate,
    "browser_pdf": pdf,
    "browser_console": console,
}
