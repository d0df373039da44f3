# -*- test-case-name: tests.browser.test_browser -*-
"""
The browser worker: asyncio Playwright in a child process of the daemon.

Run as ``python -I -u worker.py CONFIG_JSON``.  It owns one Chromium, one
context and one page, and speaks JSON lines: one request per stdin line
(``{"id", "op", ...}``), one reply per stdout line (``{"id", "ok": true,
"result"}`` or ``{"id", "ok": false, "error": {"status", "error", "type",
"code", ...}}``), after a first ``{"event": "ready"}`` (or ``{"event":
"fatal", "error"}`` when Playwright or Chromium cannot start).

It imports nothing from sandboxd (only the standard library, Playwright and
the sibling ``urlpolicy`` module; its bounds come in CONFIG_JSON, from the
daemon's policy defaults), so a browser crash, hang or leak stays in
this process tree, which the daemon kills and restarts.  Requests are
handled one at a time: there is one page.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import datetime
import json
import math
import os
import re
import socket
import sys
from typing import Any

if __package__:
    from .socksgate import SocksGate
    from .urlpolicy import (
        Refusal,
        UrlPolicy,
        check_addresses,
        check_host,
        check_url,
        error_fields,
        host_of,
        ip_literal,
    )
else:
    # Run as a script (``python -I worker.py``): load the sibling module
    # without importing sandboxd, which would pull in Twisted for nothing.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from socksgate import SocksGate  # type: ignore[import-not-found,no-redef]
    from urlpolicy import (  # type: ignore[import-not-found,no-redef]
        Refusal,
        UrlPolicy,
        check_addresses,
        check_host,
        check_url,
        error_fields,
        host_of,
        ip_literal,
    )

#: Chromium switches for a container with no network beyond what a page asks
#: for, no GPU, no display and (as root) no sandbox of its own.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    # window.open and pop-ups would be pages without the network rules.
    "--block-new-web-contents",
    # Keep cross-site frames in the page's process, where its request
    # interception sees them.
    "--disable-site-isolation-trials",
    "--disable-features=Translate,MediaRouter,OptimizationHints,IsolateOrigins,site-per-process",
]


#: JPEG's limit on an image's width and height, in pixels.
JPEG_MAX_SIDE = 65535


class WorkerError(Exception):
    """An error with the JSON fields the daemon passes on."""

    def __init__(
        self, status: int, message: str, type: str, code: str, **extra: Any
    ) -> None:
        super().__init__(message)
        self.fields = error_fields(status, message, type, code, **extra)


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG or JPEG, read from its header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(
                data[i + 5 : i + 7], "big"
            )
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 0, 0


def pdf_pages(data: bytes) -> int:
    """The page count of a PDF that Chromium printed."""
    pages = len(re.findall(rb"/Type\s*/Page(?![A-Za-z])", data))
    if pages:
        return pages
    counts = [int(n) for n in re.findall(rb"/Count\s+(\d+)", data)]
    return max(counts) if counts else 0


class TooLarge(Exception):
    """A value that would not fit its answer: its size so far."""

    def __init__(self, size: int, nodes: int) -> None:
        super().__init__(size)
        self.size = size
        self.nodes = nodes


#: JavaScript's own spelling of the numbers JSON cannot carry.
NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

#: What :func:`jsonable` writes for an object already on the path to it.
CIRCULAR = "[Circular]"


def jsonable(value: Any, max_bytes: int, max_nodes: int) -> Any:
    """
    ``value`` (what Playwright made of a script's result) as JSON can carry
    it: NaN and the infinities as JavaScript prints them (``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``), dates in ISO 8601, an object met
    again inside itself as ``"[Circular]"`` (Playwright hands back a cyclic
    result as shared Python objects), nothing below 64 levels.

    :raises TooLarge: past about ``max_bytes`` of JSON or ``max_nodes``
        values: the walk is synchronous, so it is bounded here rather than
        by the call's timeout.
    """
    size = 0
    nodes = 0
    path: set[int] = set()

    def walk(value: Any, depth: int) -> Any:
        nonlocal size, nodes
        nodes += 1
        if nodes > max_nodes or size > max_bytes:
            raise TooLarge(size, nodes)
        if depth > 64:
            size += 4
            return None
        if isinstance(value, float) and not math.isfinite(value):
            text = NONFINITE[str(value)]
            size += len(text) + 2
            return text
        if isinstance(value, str):
            size += len(value) + 2
            return value
        if isinstance(value, bool | int | float) or value is None:
            size += 6
            return value
        if isinstance(value, datetime.datetime | datetime.date):
            size += 28
            return value.isoformat()
        if isinstance(value, dict | list | tuple):
            if id(value) in path:
                size += len(CIRCULAR) + 2
                return CIRCULAR
            path.add(id(value))
            try:
                if isinstance(value, dict):
                    out: dict[str, Any] = {}
                    for k, v in value.items():
                        size += len(str(k)) + 4
                        out[str(k)] = walk(v, depth + 1)
                    return out
                return [walk(v, depth + 1) for v in value]
            finally:
                path.discard(id(value))
        text = str(value)
        size += len(text) + 2
        return text

    result = walk(value, 0)
    if size > max_bytes:
        raise TooLarge(size, nodes)
    return result


def script_values_as_javascript_says() -> None:
    """
    Read a script's Dates and RegExps as JavaScript writes them, before
    Playwright makes Python objects of them and loses what they were: a
    Date as ``toISOString()`` gives it (``1970-01-01T00:00:00.000Z``, not
    Python's ``+00:00``), a RegExp as ``String()`` gives it (``/re/g``, not
    ``re.compile('re')`` without the flags Python has not).  An invalid
    Date is the epoch already when it gets here (Playwright's driver makes
    it so).  Playwright's parser is private: if it is not where it was,
    results keep Playwright's own forms.
    """
    try:
        from playwright._impl.protocol import serializers
    except ImportError:
        return
    inner = getattr(serializers, "_inner_parse_serialized_value", None)
    if inner is None or getattr(inner, "as_javascript", False):
        return

    def parse(value: Any, *args: Any) -> Any:
        if isinstance(value, dict):
            if "d" in value:
                return value["d"]
            regexp = value.get("r")
            if isinstance(regexp, dict):
                return f"/{regexp.get('p', '')}/{regexp.get('f', '')}"
        return inner(value, *args)

    parse.as_javascript = True  # type: ignore[attr-defined]
    setattr(serializers, "_inner_parse_serialized_value", parse)  # noqa: B010


def cut_utf8(data: bytes, start: int, length: int) -> tuple[int, int]:
    """
    ``data[start:start + length]`` moved to whole UTF-8 characters: the
    start forward past continuation bytes, the end back before a cut one.
    """
    start = max(0, min(start, len(data)))
    while start < len(data) and 0x80 <= data[start] < 0xC0:
        start += 1
    end = min(len(data), start + max(0, length))
    if end < len(data):
        while end > start and 0x80 <= data[end] < 0xC0:
            end -= 1
    return start, end


def clip_text(text: str, max_bytes: int) -> tuple[str, int]:
    """``text`` cut to at most ``max_bytes`` of UTF-8; its whole size in bytes."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text, len(data)
    _, end = cut_utf8(data, 0, max_bytes)
    return data[:end].decode("utf-8", "replace"), len(data)


def now_iso() -> str:
    """The current time, ISO 8601 UTC (as file timestamps are)."""
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


#: Playwright's own messages (``Page.evaluate: Target crashed``), never a
#: page's: a script's error reads ``Page.evaluate: Error: ...``.
_CRASHED = re.compile(r"[\w.]+: (Target|Page) crashed")
_CLOSED = re.compile(r"[\w.]+: Target page, context or browser has been closed")

#: Call log lines that say only that Playwright tries again.
_RETRY_STEP = re.compile(r"(waiting \d+ms|retrying .*|attempting .* action)$")


class Worker:
    """One browser, one page, the console buffer and the URL policy."""

    def __init__(self, config: dict[str, Any], out: Any) -> None:
        self.config = config
        self.out = out
        self.console: collections.deque[dict[str, Any]] = collections.deque()
        self.console_max = int(config["console_max"])
        #: One console entry's text, and the buffer's texts together, in
        #: bytes: a page may log strings of any size, as often as it likes.
        self.console_entry_bytes = int(config["console_entry_bytes"])
        self.console_buffer_bytes = int(config["console_buffer_bytes"])
        self.console_bytes = 0
        #: Entries dropped (the oldest first) since the last read.
        self.console_dropped = 0
        #: A reply line at most, in bytes: the daemon ends a worker that
        #: sends more, so a bigger answer is refused here instead.
        self.max_reply = int(config["max_reply"])
        #: A reply's ``error`` message is cut here: Playwright appends call logs.
        self.message_chars = int(config["message_chars"])
        #: Values of a script's result walked at most (see :func:`jsonable`).
        self.max_values = int(config["max_values"])
        self.probe_seconds = float(config["probe_seconds"])
        self.close_seconds = float(config["close_seconds"])
        self.policy = UrlPolicy()
        self.blocked: list[Refusal] = []
        #: Destinations the gate could not reach since the navigation began,
        #: as ``(host, port, Chromium's error name)``.
        self.unreachable: collections.deque[tuple[str, int, str]] = collections.deque(
            maxlen=16
        )
        #: Every connection Chromium makes goes through this gate.
        self.gate = SocksGate(
            lambda: self.policy,
            self.blocked.append,
            lambda host, port, why: self.unreachable.append((host, port, why)),
        )
        self.playwright: Any = None
        self.browser: Any = None
        self.context: Any = None
        self.page: Any = None
        self.session: Any = None
        self.errors: Any = None
        self.tasks: set[asyncio.Future[Any]] = set()
        #: The page's renderer crashed (``page.is_closed()`` stays false).
        self.crashed = False
        #: Chromium itself is gone: this worker ends after its answer, and
        #: the daemon starts a fresh one for the next call.
        self.disconnected = False
        #: Set when this worker cannot go on: its next reply says so and it ends.
        self.ending = False
        #: The page's main frame waits for a new document: a navigation is
        #: under way and its server has not answered yet.
        self.navigating = False
        #: The request running now, and the operation's task.
        self.current: tuple[Any, asyncio.Future[Any]] | None = None
        #: The id of the request the daemon abandoned (its caller left).
        self.cancelled: Any = None

    def emit(self, message: dict[str, Any]) -> None:
        """
        Write one JSON line to the daemon: one over :attr:`max_reply` bytes
        becomes a 413 (the daemon would end the worker for it, and the page
        and its logins with it).
        """
        line = json.dumps(message, allow_nan=False).encode() + b"\n"
        if len(line) > self.max_reply and "id" in message:
            line = (
                json.dumps(
                    {
                        "id": message["id"],
                        "ok": False,
                        "ending": bool(message.get("ending")),
                        "error": error_fields(
                            413,
                            f"the browser's answer is {len(line)} bytes, over the "
                            f"{self.max_reply}-byte limit of one answer",
                            "ResourceError",
                            "payload_too_large",
                        ),
                    }
                ).encode()
                + b"\n"
            )
        self.out.write(line)
        self.out.flush()

    async def start(self) -> bool:
        """Start Playwright and Chromium; say ready or why not."""
        try:
            import playwright.async_api as api
        except ImportError:
            self.fatal(
                "Playwright is not installed. Install it with: pip install 'sandboxd[browser]'"
            )
            return False
        self.errors = api
        script_values_as_javascript_says()
        chromium = self.config.get("chromium") or "/usr/bin/chromium"
        if not os.access(chromium, os.X_OK):
            self.fatal(
                f"Chromium was not found at {chromium} (set SANDBOXD_CHROMIUM, or install Debian's chromium)"
            )
            return False
        try:
            await self.gate.start()
            self.playwright = await api.async_playwright().start()
            self.browser = await self.playwright.chromium.launch(
                executable_path=chromium,
                args=CHROMIUM_ARGS + self.gate.chromium_args(),
                headless=True,
                chromium_sandbox=False,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
            )
        except Exception as e:
            self.fatal(f"Chromium could not start: {self.first_line(e)}")
            return False
        self.browser.on("disconnected", self.on_disconnected)
        self.emit({"event": "ready", "version": self.browser.version})
        return True

    def fatal(self, message: str) -> None:
        """Tell the daemon the browser cannot be offered."""
        self.emit(
            {
                "event": "fatal",
                "error": error_fields(503, message, "RuntimeError", "unavailable"),
            }
        )

    async def ensure_page(self, op: str) -> Any:
        """
        The shared page, recreated after a crash or close.

        :raises WorkerError: 502 when Chromium is gone (this worker then
            ends, and the daemon starts another), or when the page crashed
            since the last call (it is replaced; only ``navigate`` goes on,
            since any other call would read a blank page as if it were the
            one the caller left).
        """
        if self.disconnected or not self.browser.is_connected():
            raise self.browser_gone(op)
        if self.crashed:
            await self.replace_page()
            if op != "navigate":
                raise self.page_crashed(op, "since the last call")
        if self.page is not None and not self.page.is_closed():
            return self.page
        if self.context is None:
            self.context = await self.browser.new_context(
                service_workers="block",
                accept_downloads=False,
                viewport=self.config.get("viewport") or {"width": 1280, "height": 720},
            )
            # WebSockets are not fetches: Playwright's WebSocket routing is
            # the only place to judge them.
            await self.context.route_web_socket(re.compile(".*"), self.on_websocket)
            self.context.on("page", self.on_new_page)
        self.page = None
        page = await self.context.new_page()
        page.on("console", self.on_console)
        page.on("pageerror", self.on_page_error)
        page.on("crash", self.on_crash)
        page.on("dialog", self.on_dialog)
        # Playwright's own routing skips redirect hops; the DevTools Fetch
        # domain pauses every request, each hop of a redirect included.
        session = await self.context.new_cdp_session(page)
        session.on(
            "Fetch.requestPaused",
            lambda event: self.spawn(self.on_paused(session, event)),
        )
        await session.send(
            "Fetch.enable",
            {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]},
        )
        # Whether a navigation waits for its server: a call that times out
        # then must keep the page, not take it for stuck.
        self.navigating = False
        tree = await session.send("Page.getFrameTree")
        main_frame = tree["frameTree"]["frame"]["id"]
        for event_name, navigating in (
            ("Page.frameStartedLoading", True),
            ("Page.frameNavigated", False),
            ("Page.frameStoppedLoading", False),
        ):
            session.on(
                event_name,
                lambda event, now=navigating: self.frame_navigating(
                    page, main_frame, event, now
                ),
            )
        await session.send("Page.enable")
        self.page = page
        self.session = session
        self.crashed = False
        return page

    def frame_navigating(
        self, page: Any, main_frame: str, event: dict[str, Any], navigating: bool
    ) -> None:
        """
        The page's main frame started loading a document (``navigating``),
        or the document came (it committed) or the load ended.
        """
        frame = event.get("frameId") or event.get("frame", {}).get("id")
        if page is self.page and frame == main_frame:
            self.navigating = navigating

    def on_crash(self, page: Any) -> None:
        if page is self.page:
            self.crashed = True

    def on_disconnected(self, browser: Any) -> None:
        self.disconnected = True

    async def replace_page(self) -> None:
        """
        Close the page (a crashed one, or one stuck in a script) so the
        next call gets a fresh one in the same context, whose cookies
        survive; when even that does not answer, the context goes too, and
        when that does not, the whole worker.
        """
        page, self.page, self.session = self.page, None, None
        self.crashed = False
        if page is None:
            return
        try:
            await asyncio.wait_for(
                page.close(run_before_unload=False), self.close_seconds
            )
            return
        except Exception:
            pass
        context, self.context = self.context, None
        try:
            await asyncio.wait_for(context.close(), self.close_seconds)
        except Exception:
            self.ending = True

    def browser_gone(self, op: str) -> WorkerError:
        """The answer when Chromium is gone: this worker ends after it."""
        self.ending = True
        return WorkerError(
            502,
            f"the browser (Chromium) exited during browser {op}; it is started "
            "afresh on the next call, without the page, its cookies or logins",
            "RuntimeError",
            "upstream_unavailable",
            kind="browser_exited",
        )

    def page_crashed(self, op: str, when: str) -> WorkerError:
        """The answer when the page's renderer crashed (it is replaced)."""
        return WorkerError(
            502,
            f"the page crashed {when} (browser {op}): its renderer ran out of "
            "memory or was killed; a fresh blank page replaces it (cookies "
            "kept, the URL and what was typed lost): navigate again",
            "RuntimeError",
            "upstream_unavailable",
            kind="page_crashed",
        )

    def spawn(self, coro: Any) -> None:
        """Run an event handler's coroutine, keeping a reference until done."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_new_page(self, page: Any) -> None:
        """Pop-ups get no network rules of their own: close them at once."""
        if page is not self.page and self.page is not None:
            self.spawn(page.close())

    async def on_paused(self, session: Any, event: dict[str, Any]) -> None:
        """Every request the page makes (each redirect hop too) meets the policy."""
        url = event.get("request", {}).get("url", "")
        request_id = event.get("requestId")
        try:
            try:
                check_url(self.policy, url)
                await self.check_network(url)
            except Refusal as refusal:
                self.blocked.append(refusal)
                await session.send(
                    "Fetch.failRequest",
                    {"requestId": request_id, "errorReason": "BlockedByClient"},
                )
                return
            await session.send("Fetch.continueRequest", {"requestId": request_id})
        except Exception:
            # The page went away while we decided; nothing left to answer.
            pass

    async def on_websocket(self, ws: Any) -> None:
        """A WebSocket is judged as the http(s) URL of its handshake."""
        url = ws.url
        http_url = "http" + url[2:] if url[:2].lower() == "ws" else url
        try:
            check_url(self.policy, http_url)
            await self.check_network(http_url)
        except Refusal as refusal:
            self.blocked.append(refusal)
            await ws.close(code=1008, reason="refused by policy")
            return
        ws.connect_to_server()

    def on_console(self, message: Any) -> None:
        self.log(message.type, message.text)

    def on_page_error(self, error: Any) -> None:
        self.log("pageerror", str(error))

    def on_dialog(self, dialog: Any) -> None:
        """
        A dialog is answered at once (no call may wait on a person), as
        Playwright does with none listening: ``alert``, ``confirm`` and
        ``prompt`` dismissed, ``beforeunload`` accepted so a navigation goes
        on.  It is kept as a console entry, so the caller learns it came.
        """
        self.log("dialog", dialog.message, dialog=dialog.type)
        if dialog.type == "beforeunload":
            self.spawn(dialog.accept())
        else:
            self.spawn(dialog.dismiss())

    def log(self, kind: str, text: str, **extra: str) -> None:
        """
        Keep one console entry: its text cut to :attr:`console_entry_bytes`
        (then ``truncated`` and its whole ``bytes``), the oldest entries
        dropped past the buffer's count or bytes.
        """
        kept, size = clip_text(text, self.console_entry_bytes)
        entry: dict[str, Any] = {
            "type": kind,
            "text": kept,
            "timestamp": now_iso(),
            **extra,
        }
        if len(kept) < len(text):
            entry["truncated"] = True
            entry["bytes"] = size
        cost = len(kept.encode("utf-8", "replace"))
        self.console.append(entry)
        self.console_bytes += cost
        while self.console and (
            len(self.console) > self.console_max
            or self.console_bytes > self.console_buffer_bytes
        ):
            old = self.console.popleft()
            self.console_bytes -= len(old["text"].encode("utf-8", "replace"))
            self.console_dropped += 1

    async def check_network(self, url: str) -> None:
        """
        With ``block_private_networks``, refuse loopback names and hosts
        that resolve privately or not at all, naming the URL.

        This is for the answer's sake (which URL, which rule): what is
        connected to is decided again, and pinned, by :attr:`gate`.
        """
        if not self.policy.block_private:
            return
        host = host_of(url)
        if not host:
            return
        check_host(self.policy, url, host)
        literal = ip_literal(host)
        if literal is not None:
            addresses = [literal]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, None, type=socket.SOCK_STREAM
                )
            except OSError:
                infos = []
            addresses = [str(info[4][0]) for info in infos]
            if not addresses:
                raise Refusal(
                    f"the URL {url} does not resolve; with block_private_networks "
                    "such a host counts as a private network host",
                    self.policy.rule("params.block_private_networks"),
                )
        check_addresses(self.policy, url, addresses)

    # -- operations ----------------------------------------------------------

    async def op_navigate(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        url = req["url"]
        check_url(self.policy, url)
        await self.check_network(url)
        self.blocked.clear()
        self.unreachable.clear()
        try:
            response = await page.goto(
                url, wait_until=req.get("wait_until", "load"), timeout=req["timeout"]
            )
        except self.errors.Error as e:
            if self.blocked:
                raise self.blocked[0] from None
            if "ERR_SOCKS_CONNECTION_FAILED" in str(e):
                self.say_unreachable(url)
            if "Download is starting" in str(e):
                raise WorkerError(
                    400,
                    f"the URL {url} answers with a file to download, and navigate "
                    "only shows pages: fetch the file with a command (curl -fLo "
                    "FILE URL through /shell) and read it with /files/download",
                    "ValueError",
                    "invalid_param",
                ) from None
            raise
        return {
            "url": page.url,
            "title": await page.title(),
            "status": response.status if response is not None else None,
        }

    def say_unreachable(self, url: str) -> None:
        """
        A navigation that failed at the gate: the error Chromium would have
        named without it (every SOCKS failure reads the same to Chromium),
        so that "nothing listens there yet" is told from "no such host".

        :raises WorkerError: 400 naming it, when the gate saw why.
        """
        host = (host_of(url) or "").lower()
        seen = [(p, w) for h, p, w in self.unreachable if h.lower() == host]
        if not seen:
            return
        port, why = seen[-1]
        shown = f"[{host}]" if ":" in host else host
        detail = (
            f"the host {host} does not resolve"
            if why == "net::ERR_NAME_NOT_RESOLVED"
            else f"nothing accepts connections on {shown}:{port}"
        )
        raise WorkerError(
            400,
            f"Page.goto: {why} at {url} ({detail})",
            "RuntimeError",
            "invalid_param",
        )

    async def op_screenshot(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        kind = req.get("type", "png")
        options: dict[str, Any] = {"type": kind, "timeout": req["timeout"]}
        if kind == "jpeg" and req.get("quality") is not None:
            options["quality"] = req["quality"]
        if req.get("selector"):
            # The element as the page is now, as agent-sandbox-server takes
            # it: one that is not there is a 404 at once, not a wait.
            element = await page.query_selector(req["selector"])
            if element is None:
                raise WorkerError(
                    404,
                    f"Selector not found: {req['selector']}",
                    "ValueError",
                    "not_found",
                )
            # A hidden one likewise: Playwright would wait the whole timeout
            # for it to show, which takes a further call to make happen.
            if not await element.is_visible():
                raise WorkerError(
                    400,
                    f"the element matching {req['selector']} is not visible (hidden, "
                    "display: none, or of no size): there is nothing of it to "
                    "capture; show it first, or capture the page",
                    "ValueError",
                    "invalid_param",
                )
            data = await element.screenshot(**options)
        else:
            data = await page.screenshot(
                full_page=bool(req.get("full_page")), **options
            )
        width, height = image_size(data)
        if not data or not width or not height:
            raise await self.empty_image(page, kind)
        return {
            "image_base64": base64.b64encode(data).decode(),
            "width": width,
            "height": height,
            "type": kind,
        }

    async def empty_image(self, page: Any, kind: str) -> WorkerError:
        """
        The answer when Chromium gave no image: it makes none past JPEG's
        limit of 65535 pixels a side, and an empty image is no answer (a
        model's API refuses one).
        """
        try:
            size = await asyncio.wait_for(
                page.evaluate(
                    "() => [document.documentElement.scrollWidth,"
                    " document.documentElement.scrollHeight]"
                ),
                self.probe_seconds,
            )
            shown = f" (the page is {int(size[0])}x{int(size[1])} pixels)"
        except Exception:
            shown = ""
        if kind == "jpeg":
            return WorkerError(
                413,
                f"the screenshot came back empty{shown}: a JPEG cannot be over "
                f"{JPEG_MAX_SIDE} pixels a side; take a png, a selector, or the "
                "viewport (no full_page)",
                "ResourceError",
                "payload_too_large",
                limit=JPEG_MAX_SIDE,
            )
        return WorkerError(
            413,
            f"the screenshot came back empty{shown}: the image is too large for "
            "the browser to make; take a selector, or the viewport (no full_page)",
            "ResourceError",
            "payload_too_large",
        )

    async def op_content(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("type") == "text":
            content = await page.evaluate(
                "() => document.body ? document.body.innerText : ''"
            )
        else:
            content = await page.content()
        # At most max_bytes of it, from offset, on whole characters: a page
        # may be any size, one answer may not.
        data = str(content).encode("utf-8", "replace")
        start, end = cut_utf8(
            data, int(req.get("offset") or 0), int(req.get("max_bytes") or len(data))
        )
        result: dict[str, Any] = {
            "content": data[start:end].decode("utf-8", "replace"),
            "url": page.url,
            "title": await page.title(),
            "total_bytes": len(data),
            "offset": start,
            "truncated": end < len(data),
        }
        if end < len(data):
            result["next_offset"] = end
        return result

    async def op_click(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        try:
            await page.click(req["selector"], timeout=req["timeout"])
        except self.errors.TimeoutError:
            await self.check_matches(page, req)
            raise
        return {"clicked": True, "selector": req["selector"]}

    async def op_type(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        try:
            if req.get("clear"):
                await page.fill(req["selector"], "", timeout=req["timeout"])
            await page.type(
                req["selector"],
                req["text"],
                delay=req.get("delay", 0),
                timeout=req["timeout"],
            )
        except self.errors.TimeoutError:
            await self.check_matches(page, req)
            raise
        return {"typed": True, "selector": req["selector"], "text": req["text"]}

    async def check_matches(self, page: Any, req: dict[str, Any]) -> None:
        """
        After a wait for an element ran out: a 408 that names the selector
        when nothing on the page matches it (else the timeout's own message
        says what was waited for).  A timeout still, not a 404: the seed's
        SDK reads a click on a missing element as its CommandTimeoutError.
        """
        try:
            found = await asyncio.wait_for(
                page.query_selector(req["selector"]), self.probe_seconds
            )
        except Exception:
            return
        if found is None:
            raise WorkerError(
                408,
                f"browser {req.get('op')} timed out after {req['timeout']} ms: "
                f"nothing on the page matches the selector {req['selector']}",
                "TimeoutError",
                "timeout",
            )

    async def op_evaluate(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        result = await page.evaluate(req["script"])
        limit = int(req.get("max_bytes") or self.max_reply // 2)
        try:
            return {"result": jsonable(result, limit, self.max_values)}
        except TooLarge as e:
            what = (
                f"has over {self.max_values} values"
                if e.nodes > self.max_values
                else f"is over {limit} bytes as JSON (the policy's limits.max_bytes)"
            )
            raise WorkerError(
                413,
                f"the script's result {what}: return a part of it, e.g. "
                "JSON.stringify(value).slice(0, N)",
                "ResourceError",
                "payload_too_large",
                limit=limit,
            ) from None

    async def op_pdf(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        data = await page.pdf(
            format=req.get("format", "A4"), landscape=bool(req.get("landscape"))
        )
        return {"pdf_base64": base64.b64encode(data).decode(), "pages": pdf_pages(data)}

    async def op_console(self, page: Any, req: dict[str, Any]) -> dict[str, Any]:
        logs = list(self.console)
        result: dict[str, Any] = {"logs": logs}
        if self.console_dropped:
            result["dropped"] = self.console_dropped
        self.console.clear()
        self.console_bytes = self.console_dropped = 0
        return result

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one request; the reply line (``ending`` when this worker ends after it)."""
        reply = await self.answer(req)
        if self.ending:
            reply["ending"] = True
        return reply

    async def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        rid = req.get("id")
        op = str(req.get("op"))
        page: Any = None
        try:
            if "policy" in req:
                self.policy = UrlPolicy.from_json(req["policy"])
            method = getattr(self, "op_" + op, None)
            if method is None:
                raise WorkerError(
                    400,
                    f"unknown operation {req.get('op')!r}",
                    "ValueError",
                    "invalid_param",
                )
            page = await self.ensure_page(op)
            budget = float(req.get("budget") or req["timeout"]) / 1000.0 + 1.0
            task = asyncio.ensure_future(method(page, req))
            self.current = (rid, task)
            if self.cancelled == rid:
                task.cancel()
            try:
                result = await asyncio.wait_for(task, budget)
            finally:
                self.current = None
            return {"id": rid, "ok": True, "result": result}
        except asyncio.CancelledError:
            if rid is None or self.cancelled != rid:
                raise
            # Its caller left: stop what it started, as a timeout does.
            return await self.stopped(
                rid,
                op,
                page,
                (499, f"browser {op} was cancelled: its caller left"),
                ("CancelledError", "client_closed"),
            )
        except Refusal as refusal:
            return {"id": rid, "ok": False, "error": refusal.as_json()}
        except WorkerError as e:
            return {"id": rid, "ok": False, "error": e.fields}
        except (TimeoutError, self.errors.TimeoutError) as e:
            message = (
                self.first_line(e) if isinstance(e, self.errors.TimeoutError) else ""
            )
            step = self.last_step(e)
            if step:
                message += f" (last step: {step})"
            return await self.stopped(
                rid,
                op,
                page,
                (
                    408,
                    f"browser {op} timed out after {req['timeout']} ms"
                    + (f": {message}" if message else ""),
                ),
                ("TimeoutError", "timeout"),
            )
        except self.errors.Error as e:
            return {"id": rid, "ok": False, "error": await self.failed(op, e)}
        except Exception as e:  # a bug here must not end the worker
            return {
                "id": rid,
                "ok": False,
                "error": error_fields(
                    500,
                    f"browser worker failed: {e!r}"[: self.message_chars],
                    "RuntimeError",
                    "internal",
                ),
            }

    async def failed(self, op: str, error: Exception) -> dict[str, Any]:
        """
        A Playwright error's answer: Chromium or the page gone is the
        browser's failure (502, and the page replaced or the worker
        ended), anything else the caller's (a script that threw, a bad
        selector, a URL that does not load): 400.
        """
        if self.disconnected or not self.browser.is_connected():
            return self.browser_gone(op).fields
        text = self.first_line(error)
        if self.crashed or _CRASHED.match(text):
            await self.replace_page()
            return self.page_crashed(op, "during the call").fields
        if self.page is None or self.page.is_closed() or _CLOSED.match(text):
            await self.replace_page()
            return WorkerError(
                502,
                f"the page was closed during browser {op} ({text}); a fresh blank "
                "page replaces it: navigate again",
                "RuntimeError",
                "upstream_unavailable",
                kind="page_closed",
            ).fields
        return error_fields(400, text, "RuntimeError", "invalid_param")

    async def stopped(
        self,
        rid: Any,
        op: str,
        page: Any,
        answer: tuple[int, str],
        kind: tuple[str, str],
    ) -> dict[str, Any]:
        """
        The answer to a call cut short (timed out, or its caller left):
        what it started is stopped first (:meth:`after_timeout`), and what
        that did is said after ``answer``'s message.
        """
        try:
            note = await self.after_timeout(op, page)
        except WorkerError as lost:
            return {"id": rid, "ok": False, "error": lost.fields}
        status, message = answer
        error_type, code = kind
        return {
            "id": rid,
            "ok": False,
            "error": error_fields(status, message + note, error_type, code),
        }

    async def after_timeout(self, op: str, page: Any) -> str:
        """
        After a call ran out of time: stop a navigation still under way
        (else the next call waits for it), then see whether the page still
        answers.  One that does not is stuck in a script that never yields
        and would time out every later call: it is replaced.  What was
        done is said in the answer's message.

        :raises WorkerError: 502 when the page crashed or Chromium is gone.
        """
        if page is None:
            return ""
        if self.disconnected or not self.browser.is_connected():
            raise self.browser_gone(op)
        stopped = False
        if op == "navigate" and self.session is not None:
            try:
                await asyncio.wait_for(
                    self.session.send("Page.stopLoading"), self.probe_seconds
                )
                stopped = True
            except Exception:
                pass
        if self.navigating and not stopped:
            # A navigation is under way (the page's own, or one a click
            # started): nothing reaches the page until its server answers,
            # a probe included, so a slow server would pass for a stuck
            # script.  The page is kept; a navigate stops the load.
            return (
                "; the page is still loading (a navigation is under way and its "
                "server has not answered yet): the page was kept, and the next "
                "call waits for it within its own timeout (a navigate stops it)"
            )
        try:
            await asyncio.wait_for(page.evaluate("1"), self.probe_seconds)
        except Exception:
            if self.disconnected or not self.browser.is_connected():
                raise self.browser_gone(op) from None
            if self.crashed:
                await self.replace_page()
                raise self.page_crashed(op, "during the call") from None
            await self.replace_page()
            return (
                "; the page stopped answering (a script that never yields?) and "
                "was replaced by a fresh blank page (cookies kept, the URL and "
                "what was typed lost)"
            )
        return (
            "; the navigation was stopped (the page shows what had loaded)"
            if stopped
            else ""
        )

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """
        Answer requests, one at a time, until stdin closes or this worker
        cannot go on.  Lines are read while a request runs: a ``cancel``
        (``{"op": "cancel", "target": ID}``, sent when the caller of the
        request left) stops it, and stdin closing stops it too.
        """
        requests: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def read() -> None:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:
                    # A line over the reader's limit: the daemon never sends one.
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("not an object")
                except ValueError:
                    continue
                if req.get("op") == "cancel":
                    self.cancel(req.get("target"))
                else:
                    requests.put_nowait(req)
            if self.current is not None:
                self.cancel(self.current[0])
            requests.put_nowait(None)

        reading = asyncio.ensure_future(read())
        try:
            while not self.ending:
                req = await requests.get()
                if req is None:
                    break
                self.emit(await self.handle(req))
        finally:
            reading.cancel()

    def cancel(self, rid: Any) -> None:
        """Stop request ``rid``: now when it runs, else as soon as it starts."""
        self.cancelled = rid
        if self.current is not None and self.current[0] == rid:
            self.current[1].cancel()

    def last_step(self, error: BaseException) -> str:
        """
        What Playwright's call log last said of the element (``element is
        not visible``), or of what it waited for; '' without a log.
        """
        text = str(getattr(error, "message", None) or error)
        if "\nCall log:" not in text:
            return ""
        steps = [
            re.sub(r"^(- |\d+ × )", "", line.strip()).strip()
            for line in text.split("\nCall log:", 1)[1].splitlines()
        ]
        steps = [s for s in steps if s and not _RETRY_STEP.match(s)]
        return steps[-1][:200] if steps else ""

    def first_line(self, error: BaseException) -> str:
        """An exception's message without Playwright's call log."""
        text = str(getattr(error, "message", None) or error).strip()
        text = text.split("\nCall log:", 1)[0].strip()
        return text[: self.message_chars] or type(error).__name__

    async def close(self) -> None:
        """Close the browser, Playwright and the gate, each bounded."""
        await self.gate.close()
        for closer in (self.browser, self.playwright):
            if closer is None:
                continue
            try:
                await asyncio.wait_for(
                    closer.close() if closer is self.browser else closer.stop(), 5
                )
            except Exception:
                pass


async def main(config: dict[str, Any]) -> int:
    # Our replies use a private copy of stdout; fd 1 itself goes to stderr
    # so nothing Playwright or a library prints can corrupt the protocol.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    worker = Worker(config, out)
    if not await worker.start():
        return 1
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=int(config["max_line"]))
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        await worker.serve(reader)
    finally:
        await worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
