"""
What the sync and the async client share: settings, request descriptions,
error mapping, the SSE parser and the PTY frame parser.  No I/O here.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from sandboxd.client._resultjson import loads_result
from sandboxd.client.errors import (
    ConnectionFailed,
    ProtocolError,
    RequestTimeout,
    SandboxError,
    error_for,
)
from sandboxd.client.models import PtyEvent, SSEEvent

#: Seconds for an ordinary call (connect, read and write each).
DEFAULT_TIMEOUT = 30.0
#: Seconds between two bytes of an SSE stream before it counts as cut
#: (the daemon sends a heartbeat after 4 s of silence).
STREAM_READ_TIMEOUT = 30.0
#: Seconds a call answered when its child ends (``commands.run``,
#: ``code.run``) waits past the child's own time limit: the daemon ends the
#: child at its limit and answers 408 with the output so far.
RUN_MARGIN = 15.0
#: Seconds of silence after which the daemon sends an SSE heartbeat (a
#: ``:`` comment line), with a little slack.
HEARTBEAT_SECONDS = 5.0
#: Retries of an idempotent call, or a resumable stream, after a lost connection.
DEFAULT_RETRIES = 3
#: The longest ``Retry-After`` a 429 is waited out for (when asked to).
MAX_RATE_WAIT = 60.0
#: Bytes read from disk per chunk of a raw upload (downloads take what the
#: socket gives, without re-chunking).
CHUNK_BYTES = 1024 * 1024
#: Files from this size up are sent by ``files.upload`` as a resumable
#: upload (``/files/uploads``), smaller ones in one ``POST /files/raw``.
RESUMABLE_UPLOAD_BYTES = 8 * 1024 * 1024
#: Transport errors after which a call may be sent again.
RETRYABLE = (
    httpx.ConnectError,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): 0.1, 0.2, 0.4 ... at most 2."""
    return float(min(2.0, 0.1 * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Settings:
    """
    How to reach one daemon.

    :param url: the HTTP base URL (``http://127.0.0.1:9000``).
    :param token: the access token, or None in local mode.
    :param timeout: seconds for every call unless the call says otherwise.
    :param retries: how often an idempotent call or a resumable stream is
        retried after a lost connection.
    :param wait_on_rate_limit: wait ``retry_after`` and retry on a 429
        (at most ``max_rate_wait`` seconds per wait) instead of raising.
    :param pty_url: the PTY WebSocket base (``ws://host:9001``); default:
        the session's ``ws_url`` as the daemon gives it (at create, and
        from ``GET /pty/sessions/{id}`` to attach), else the HTTP port + 1.
    """

    url: str
    token: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    wait_on_rate_limit: bool = False
    max_rate_wait: float = MAX_RATE_WAIT
    pty_url: str | None = None

    def headers(self) -> dict[str, str]:
        """The headers every request carries."""
        out = {"User-Agent": "sandboxd-client", "Accept": "application/json"}
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def client_options(self) -> dict[str, Any]:
        """How a new httpx client (of either kind) is made for this daemon."""
        return {
            "base_url": self.url,
            "headers": self.headers(),
            "timeout": self.timeout,
            "trust_env": False,
        }

    def base_pty_url(self) -> str:
        """``ws://host:port`` of the PTY port when nothing better is known."""
        if self.pty_url:
            return self.pty_url.rstrip("/")
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        port = (parts.port or (443 if scheme == "wss" else 80)) + 1
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{port}"


def settings_from(
    url: str | None,
    token: str | None,
    timeout: float,
    retries: int,
    wait_on_rate_limit: bool,
    pty_url: str | None,
) -> Settings:
    """
    Settings from arguments, then ``SANDBOXD_URL``/``SANDBOXD_TOKEN``/``SANDBOXD_PTY_URL``.

    The token loses surrounding whitespace: one read from a file, a
    Kubernetes secret or a ``.env`` line often ends with a newline, which
    no header may carry.

    :raises ValueError: the URL is not an http(s) URL with a host, or the
        token holds what a header cannot carry (a control character, or one
        that is not ASCII).
    """
    url = url or os.environ.get("SANDBOXD_URL") or "http://127.0.0.1:9000"
    if token is None:
        token = os.environ.get("SANDBOXD_TOKEN")
    if token is not None:
        token = token.strip() or None
    bad = next((c for c in token or "" if not " " <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"the token must be printable ASCII, and it holds {bad!r}: "
            "check --token or SANDBOXD_TOKEN"
        )
    pty_url = pty_url or os.environ.get("SANDBOXD_PTY_URL") or None
    if "://" not in url:
        url = "http://" + url
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise ValueError(f"invalid daemon URL {url!r}: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"invalid daemon URL {url!r}: use http://HOST:PORT or https://..."
        )
    return Settings(
        url.rstrip("/"),
        token,
        timeout,
        retries,
        wait_on_rate_limit,
        MAX_RATE_WAIT,
        pty_url,
    )


@dataclass
class Req:
    """
    One JSON call: what to send, and whether sending it twice is harmless.

    :ivar idempotent: retried after a lost connection (GET is by default).
    """

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    idempotent: bool | None = None
    timeout: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: The whole httpx timeout, when connecting and reading differ (a call
    #: answered when its child ends); over :attr:`timeout`.
    timeouts: httpx.Timeout | None = None

    @property
    def retry_safe(self) -> bool:
        """Whether a lost answer may be asked for again."""
        if self.idempotent is not None:
            return self.idempotent
        return self.method in ("GET", "HEAD")


def seg(value: object) -> str:
    """One path segment, percent-encoded (a ``/`` never splits it)."""
    return quote(str(value), safe="")


def clean(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Drop None values; booleans as ``true``/``false``."""
    if params is None:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the fields left None."""
    return {k: v for k, v in fields.items() if v is not None}


def timeout_of(seconds: float | None, default: float) -> httpx.Timeout:
    """An httpx timeout: ``seconds`` for connect, read, write and pool."""
    return httpx.Timeout(default if seconds is None else seconds)


def stream_timeout(connect: float, read: float | None) -> httpx.Timeout:
    """A stream's timeouts: ``connect`` to get the headers, ``read`` between bytes."""
    return httpx.Timeout(connect, read=read)


def retry_after(response: httpx.Response, error: SandboxError) -> float | None:
    """Seconds a 429 asks to wait (body ``retry_after``, else ``Retry-After``)."""
    value = error.body.get("retry_after")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    header = response.headers.get("retry-after")
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None


#: 429s waited out in a row for one call before the error is raised.
MAX_RATE_WAITS = 10


def rate_wait(
    settings: Settings, response: httpx.Response, error: SandboxError, waits: int
) -> float | None:
    """
    Seconds to wait before sending a call again after ``response``, or
    None to raise ``error``: only a 429, with ``wait_on_rate_limit`` on,
    fewer than :data:`MAX_RATE_WAITS` waits so far and a wait within
    ``max_rate_wait``.
    """
    if response.status_code != 429 or not settings.wait_on_rate_limit:
        return None
    wait = retry_after(response, error)
    if waits >= MAX_RATE_WAITS or wait is None or wait > settings.max_rate_wait:
        return None
    return max(wait, 0.05)


def error_from(response: httpx.Response) -> SandboxError:
    """The exception for an error answer whose body has been read."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        text = response.text.strip()[:500]
        data = {
            "error": text or f"HTTP {response.status_code} {response.reason_phrase}"
        }
    return error_for(response.status_code, data)


def decode(response: httpx.Response) -> Any:
    """The JSON of a success answer."""
    return _decoded(response, json.loads)


def decode_result(response: httpx.Response) -> Any:
    """
    The JSON of a code execution's result document (its big output read
    without the parser where it can be: :mod:`sandboxd.client._resultjson`).
    """
    return _decoded(response, loads_result)


def _decoded(response: httpx.Response, loads: Callable[[bytes], Any]) -> Any:
    """``response``'s body read by ``loads``; not JSON, a :class:`ProtocolError`."""
    try:
        return loads(response.content)
    except ValueError:
        raise ProtocolError(
            f"the daemon answered {response.status_code} with a body that is not JSON",
            status=response.status_code,
        ) from None


def transport_error(error: Exception, what: str) -> SandboxError:
    """
    A client-side failure as a :class:`SandboxError`.  A failed TLS
    handshake says so and names the likeliest cause (an ``https://`` URL
    for a port that speaks plain HTTP, which the daemon answers in plain
    HTTP at once), rather than only OpenSSL's words for it.
    """
    if isinstance(error, httpx.TimeoutException):
        return RequestTimeout(f"{what}: no answer in time ({type(error).__name__})")
    if _tls_failure(error):
        return ConnectionFailed(
            f"{what}: the TLS handshake failed ({error}); if this port speaks "
            "plain HTTP, use http:// rather than https://"
        )
    return ConnectionFailed(f"{what}: {error or type(error).__name__}")


def open_client(client: httpx.Client | httpx.AsyncClient) -> None:
    """
    :raises ConnectionFailed: ``client`` was closed (``close()`` on the
        sandbox, from another thread while a stream still read): said as
        the client's failure, not httpx's ``RuntimeError``.
    """
    if client.is_closed:
        raise ConnectionFailed("the client was closed")


def _tls_failure(error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, an :class:`ssl.SSLError`."""
    seen: BaseException | None = error
    for _ in range(5):  # httpx -> httpcore -> ssl, at most
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError) and not isinstance(
            seen, ssl.SSLCertVerificationError
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class SSELines:
    """
    An event stream's text cut into lines where the SSE format ends them:
    at CRLF, LF or CR, and nowhere else.

    httpx's ``iter_lines`` cuts where ``str.splitlines`` does, which also
    ends a line at NEL, U+2028 and U+2029 (and a few control characters):
    a ``data:`` line whose JSON holds one of those unescaped (as JSON
    allows) would arrive as two pieces, neither of them the event.
    """

    def __init__(self) -> None:
        self._held: list[str] = []
        #: The last text ended with CR: a LF opening the next belongs to it.
        self._after_cr = False

    def feed(self, text: str) -> list[str]:
        """The lines ``text`` completes (without their ends)."""
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            if text:
                self._held.append(text)
            return []
        lines = text.split("\n")
        if self._held:
            lines[0] = "".join(self._held) + lines[0]
            self._held = []
        rest = lines.pop()
        if rest:
            self._held.append(rest)
        return lines

    def end(self) -> list[str]:
        """The last line, if the stream ended inside one."""
        held, self._held = self._held, []
        return ["".join(held)] if held else []


class SSEParser:
    """
    Server-Sent Events from lines (``text/event-stream``, as the daemon
    writes it: ``id:``, ``event:``, ``data:`` and ``:`` comments).
    """

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> SSEEvent | None:
        """One line without its end; an event when a blank line completes one."""
        if line == "":
            if not self._data and not self._event:
                self._id = None
                return None
            raw = "\n".join(self._data)
            event = self._event or "message"
            ident = self._id
            self._event, self._data, self._id = "", [], None
            try:
                data: Any = json.loads(raw) if raw else None
            except ValueError:
                data = raw
            seq = int(ident) if ident is not None and ident.isdigit() else None
            return SSEEvent(event, data, seq)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def feed_lines(self, lines: Iterable[str]) -> list[SSEEvent]:
        """Every event the lines complete."""
        out = []
        for line in lines:
            event = self.feed(line)
            if event is not None:
                out.append(event)
        return out


def pty_ws_url(base: str, session_id: str, offset: int | None) -> str:
    """The WebSocket URL of one session (SPEC §8), from a base or a ``ws_url``."""
    parts = urlsplit(base)
    query = f"session_id={seg(session_id)}"
    if offset is not None:
        query += f"&offset={int(offset)}"
    return urlunsplit((parts.scheme, parts.netloc, "/pty", query, ""))


def pty_event(message: str | bytes) -> PtyEvent | None:
    """One server frame of the PTY WebSocket, or None for anything else."""
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    kind = frame.get("type")
    if kind == "output":
        offset = frame.get("offset")
        return PtyEvent(
            "output",
            data=str(frame.get("data", "")),
            offset=offset if isinstance(offset, int) else None,
            raw=frame,
        )
    if kind == "event" and frame.get("event") in ("started", "exited"):
        code = frame.get("exit_code")
        return PtyEvent(
            frame["event"],
            exit_code=code if isinstance(code, int) else None,
            raw=frame,
        )
    return None


def output_end(event: PtyEvent, current: int | None) -> int | None:
    """The output offset after ``event`` (bytes of output seen)."""
    if event.kind != "output":
        return current
    end = event.raw.get("end")
    if isinstance(end, int) and not isinstance(end, bool):
        # The daemon's own count: output that was not UTF-8 arrived as
        # U+FFFD, whose length is not the bytes it stands for.
        return end
    size = len(event.data.encode("utf-8", "surrogatepass"))
    start = event.offset if event.offset is not None else (current or 0)
    return start + size


def ws_headers(settings: Settings) -> dict[str, str]:
    """The handshake's headers: the same token as HTTP (SPEC §4)."""
    return {"Authorization": f"Bearer {settings.token}"} if settings.token else {}


def exit_status(code: int | None) -> int:
    """A child's exit code as a shell reports it (a signal N is 128 + N)."""
    if code is None:
        return 1
    if code < 0:
        return 128 + (-code)
    return code & 0xFF
