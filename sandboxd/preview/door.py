# -*- test-case-name: tests.preview.test_door -*-
"""
The preview door (SPEC §16, §23): a listener of its own that forwards
browsers to the web apps running in the sandbox.

It is a door, not a route: a proxied app must never run script in the
daemon's own origin (which the API trusts), and the API's body rules would
break ordinary web apps.  Each request is one :class:`Exchange`, decided
when its head arrives (before any body byte): the Host names the port
(:mod:`sandboxd.preview.routing`, else 421), the port must be exposed and
allowed (:mod:`sandboxd.preview.exposures`), and the caller must pass the
one gate as ``preview_proxy``: nobody for a public exposure, else a token
holding ``preview:use`` or a link for this port, in a header, in the
door's cookie, or as ``?sbx_link=`` on a GET (which sets the cookie and
redirects to the same URL without it).  Then the request goes to
``127.0.0.1:PORT`` (the port is the only input) with its body streaming
(:mod:`sandboxd.preview.upstream`), or, for an ``Upgrade``, as raw bytes
after the app's 101 (:mod:`sandboxd.preview.splice`).  Every exchange is
one audit line with ``via: preview``.
"""

from __future__ import annotations

import html
import io
import time
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import CancelledError
from twisted.internet.error import (
    ConnectError,
    ConnectionDone,
    ConnectionLost,
    ConnectionRefusedError,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web._newclient import ParseError
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Request

from sandboxd.access import gate
from sandboxd.access import held as held_connections
from sandboxd.access.audit import should_record
from sandboxd.access.links import is_link, preview_audience
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    forbidden,
    limit_exceeded,
    limit_rule,
    link_refused,
    listens_elsewhere,
    misdirected,
    payload_too_large,
    unexpected,
    upstream_timeout,
    upstream_unavailable,
)
from sandboxd.policy.defaults import (
    LARGE_BODY_BYTES,
    LARGE_READ_BYTES,
    PREVIEW_DERIVED_ENTRIES,
    PREVIEW_RETRY_SECONDS,
    PREVIEW_WS_RECLAIM_IDLE_SECONDS,
    identity_cap,
)
from sandboxd.preview import headers as h
from sandboxd.preview.answer import Answer, NotHttp, Rules
from sandboxd.preview.channel import DoorChannel, DoorRequest, canonical, drained
from sandboxd.preview.exposures import LOOPBACKS, Exposure, reached
from sandboxd.preview.rawpool import (
    BodyTransport,
    RawConnection,
    RawPool,
    UpstreamBroken,
)
from sandboxd.preview.routing import Target
from sandboxd.preview.upstream import BodyRelay, StreamBody
from sandboxd.web.channel import close_after_answer
from sandboxd.web.connections import ConnectionLimits
from sandboxd.web.dispatch import reason_phrase
from sandboxd.web.factory import HardenedSite
from sandboxd.web.portdoor import raw_headers

if TYPE_CHECKING:
    from sandboxd.access.auth import Identity
    from sandboxd.policy.rules import EffectiveRule
    from sandboxd.preview.exposures import ExposureTable
    from sandboxd.preview.routing import Routes

log = Logger(namespace="sandboxd.preview")


#: The key of a request's Host, as read, in a connection's memo of its
#: header lines (:attr:`Exchange.derived`).
_HOST = "host"

#: Client-address headers the door sets itself (``X-Forwarded-*`` too):
#: a browser's own would reach the app as the address the door vouches for.
_SET_BY_DOOR = frozenset({b"forwarded", b"x-real-ip"})

#: The door's name in the metrics (as :func:`gate.audit` counts it).
_PREVIEW = str(gate.Door.PREVIEW)


class PreviewService(Protocol):
    """What an exchange asks of the door's service (:mod:`sandboxd.preview.service`)."""

    context: Any
    exposures: ExposureTable
    agent: Any
    raw: RawPool
    secure: bool
    door_port: int | None

    @property
    def routes(self) -> Routes:
        """The Host patterns in force."""

    def check_port(self, port: int, rule: EffectiveRule) -> None:
        """403 ``port_not_allowed`` for a port never previewed."""

    def not_exposed(self, port: int) -> ApiError:
        """404 ``port_not_exposed``."""


def _ignore(_: object) -> None:
    """Nothing to do (a response nobody waits for any more)."""


def _unusable(failure: Failure) -> str | None:
    """
    What was wrong with an app's answer the door could not pass on, in
    words (a bad head, a close before any answer), or None.
    """
    if failure.check(UpstreamBroken, NotHttp):
        return str(failure.value)
    reasons = getattr(failure.value, "reasons", None) or [failure]
    if any(r.check(ParseError, ValueError) for r in reasons):
        # Twisted's client: a bad status line or header, or two lengths.
        return "a malformed response head"
    if any(r.check(ConnectionDone, ConnectionLost) for r in reasons):
        return "the app closed the connection"
    return None


def wants_html(accept: bytes | None) -> bool:
    """Whether the client is a browser navigating (it asked for HTML first)."""
    return accept is not None and b"text/html" in accept


def error_page(error: ApiError) -> bytes:
    """A small HTML page for a browser; a 502 retries by itself."""
    refresh = (
        f'<meta http-equiv="refresh" content="{PREVIEW_RETRY_SECONDS}">'
        if error.status == 502
        else ""
    )
    retry = ""
    if error.status == 502:
        # (An app listening where the door does not reach is no app still
        # starting: the message says what to change.)
        nothing = (
            "" if error.extra.get("listens_on") else "Nothing is listening there yet. "
        )
        retry = (
            f"<p>{nothing}This page retries every {PREVIEW_RETRY_SECONDS} seconds.</p>"
        )
    title = f"{error.status} {html.escape(reason_phrase(error.status))}"
    return (
        f"<!doctype html><html><head><meta charset=utf-8>{refresh}"
        f"<title>{title}</title></head><body><h1>{title}</h1>"
        f"<p>{html.escape(error.message)}</p>{retry}"
        f"<p><code>{html.escape(str(error.code or ''))}</code></p></body></html>"
    ).encode()


def wants_events(accept: bytes | None) -> bool:
    """Whether the client is an ``EventSource`` (it asked for an event stream)."""
    return accept is not None and b"text/event-stream" in accept


def retry_events(error: ApiError) -> bytes:
    """
    An event stream that only says why and when to come back: for an
    ``EventSource`` a 502 or 504 (any status but 200) is final, while a
    stream that ends is retried, as a refused connection is when the page
    talks to the app directly.  A dev server restarting (nodemon,
    ``--reload``) must not leave the page's live parts dead for good.
    """
    why = " ".join(f"{error.code}: {error.message}".split())
    return f": {why}\nretry: {PREVIEW_RETRY_SECONDS * 1000}\n\n".encode()


def error_response(
    error: ApiError, accept: bytes | None
) -> tuple[bytes, bytes, dict[str, str]]:
    """``(content type, body, extra headers)`` of an error, for a browser or an API client."""
    from sandboxd.web.jsonbody import json_bytes

    extra = dict(error.headers)
    if error.status == 502:
        extra.setdefault("Retry-After", str(PREVIEW_RETRY_SECONDS))
    if wants_html(accept):
        return b"text/html; charset=utf-8", error_page(error), extra
    return b"application/json", json_bytes(error.body()), extra


class PreviewRequest(Request):
    """
    A request on the preview door: decided and forwarded when its head
    arrives, its body streamed to the app rather than kept.
    """

    exchange: Exchange | None = None

    def gotLength(self, length: int | None) -> None:
        """The head is in: decide, and start the app's request now."""
        self.content = io.BytesIO()  # the body is streamed, never kept
        site: PreviewSite = self.channel.site  # type: ignore[attr-defined]
        self.exchange = Exchange(site.service, self, length)
        self.exchange.head()

    def handleContentChunk(self, data: bytes) -> None:
        """One chunk of the body, straight on to the app."""
        if self.exchange is not None:
            self.exchange.body(data)

    def process(self) -> None:
        """The body is complete."""
        if self.exchange is not None:
            self.exchange.body_done()

    def relay_head(
        self, code: int, phrase: bytes, pairs: list[tuple[bytes, list[bytes]]]
    ) -> None:
        """The app's status and (already filtered) headers, as the response's."""
        self.setResponseCode(code, phrase)
        self.responseHeaders = Headers()
        self.defaultContentType = None
        for name, values in pairs:
            self.responseHeaders.setRawHeaders(name, values)


class PreviewSite(HardenedSite):
    """
    The door's site: its own channel for plain requests
    (:mod:`sandboxd.preview.channel`), handing anything else to the
    hardened Twisted channel with one request class and no resources.
    """

    requestFactory = PreviewRequest
    door = "preview"
    silence_ends_requests = True

    def __init__(
        self, service: PreviewService, limits: ConnectionLimits | None = None
    ) -> None:
        super().__init__(Resource(), service.context, service.context.reactor, limits)
        self.service = service
        idle = service.context.policy.rules["preview_proxy"].limits.idle_timeout_seconds
        self.timeOut = idle

    def buildProtocol(self, addr: Any) -> Any:
        """The door's own channel (it asks for Twisted's when it hands over)."""
        return DoorChannel(self, addr)

    def twisted_channel(self, addr: Any) -> Any:
        """The hardened Twisted channel, for a connection the door's hands over."""
        return super().buildProtocol(addr)  # type: ignore[no-untyped-call]

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """
        A request the door's HTTP front refused: answered as the door's own
        errors are (never as the app: the app never saw the request), a
        page for a browser that asked for HTML, the JSON error with its
        ``code`` for anything else (the page's scripts, an API client);
        never stored by a cache in between.
        """
        kind, body, extra = error_response(error, accept)
        extra.setdefault("Cache-Control", "no-store")
        return kind, body, extra

    def exchange(self, request: DoorRequest) -> None:
        """A plain request on the door's channel: no body, so decided and sent at once."""
        Exchange(self.service, request, 0).plain()


class Exchange:
    """
    One request through the door, from its head to its audit line.

    :ivar refusal: the error to answer, once decided.
    """

    # What an exchange starts with, as class attributes: a small GET sets
    # only what it changes (twenty attributes stored per request were a
    # visible share of it).
    refusal: ApiError | None = None
    #: An answer of the door's own with no body, once decided: its status
    #: and headers (the link's cookie redirect, the path mode's missing
    #: slash, the favicon of the door's own host).
    redirect: tuple[int, list[tuple[bytes, bytes]]] | None = None
    passed: gate.Passed | None = None
    identity: Identity | None = None
    target: Target | None = None
    exposure: Exposure | None = None
    body_producer: StreamBody | None = None
    relay: BodyRelay | None = None
    pending: Any = None
    response: Any = None
    processed = False
    answered_early = False
    finished = False
    gone = False
    bytes_in = 0
    bytes_out = 0
    status = 0
    code: str | None = None
    rule: str | None = None
    upgrade = False
    #: The status is the app's own answer (a 404 of its own is no
    #: refusal of the door's: the audit line says ``allow``).
    from_app = False
    #: Where the app is tried, in order (the first refused is dropped).
    addresses: tuple[str, ...] = LOOPBACKS
    _timer: Any = None
    timed_out = False
    #: The raw connection to the app answering this exchange directly
    #: (:meth:`upstream_answer`), on the door's own channel.
    upstream: RawConnection | None = None
    producing = False
    widened: Any = None
    host = ""
    _audited = False
    #: What was worked out from this request's header lines, shared with
    #: the requests on its connection that repeat them byte for byte
    #: (:class:`~sandboxd.preview.channel.HeadMemo`), or None.
    derived: dict[Any, Any] | None = None
    #: Its entry among the connections a reload asks again, while the
    #: app's answer is awaited or streams (:meth:`track` to :meth:`_release`).
    held: held_connections.Held | None = None

    def __init__(
        self,
        service: PreviewService,
        request: PreviewRequest | DoorRequest,
        length: int | None,
    ) -> None:
        self.service = service
        self.context = service.context
        # Twisted's Request is untyped: held as Any.
        self.request: Any = request
        self.length = length
        self.started = time.monotonic()
        channel: Any = request.channel
        self.method: bytes = channel._command
        self.raw_target: bytes = channel._path
        self.client = getattr(channel, "peer_host", "") or ""
        if isinstance(request, DoorRequest):
            # The door's channel tells the exchange itself (no Deferred).
            self.direct = True
            request.on_end = self._ended
            memo = channel.memo
            if memo is not None and memo.fields is request.requestHeaders.fields:
                # The same header lines as the last request on this
                # connection: what was worked out from them serves again.
                self.derived = memo.derived
        else:
            self.direct = False
            request.notifyFinish().addBoth(self._ended)

    # -- the head -------------------------------------------------------------

    def header(self, name: bytes) -> list[bytes]:
        """The raw values of a request header (read, never changed)."""
        return self.request.requestHeaders.getRawHeaders(name) or []

    def head(self) -> None:
        """Route, check the port and the caller, and start the app's request."""
        try:
            self._decide()
        except ApiError as e:
            self._refuse(e)
            return
        except Exception as e:  # a bug must still be one answer and one audit line
            log.failure("preview: deciding a request failed")
            self._refuse(unexpected(e))
            return
        if self.redirect is not None or self.upgrade:
            return  # answered (or spliced) once the (empty) body is in
        self._start_upstream()

    def plain(self) -> None:
        """
        A request without a body on the door's own channel: :meth:`head`
        and :meth:`body_done` in one step, since its whole request is in.
        """
        try:
            self._decide()
        except ApiError as e:
            error = e
        except Exception as e:  # a bug must still be one answer and one audit line
            log.failure("preview: deciding a request failed")
            error = unexpected(e)
        else:
            if self.redirect is not None:
                self.processed = True
                self._respond_own(*self.redirect)
                return
            self._send(self.addresses[0])
            self.processed = True
            timeout = self.context.policy.rules["preview_proxy"].limits.timeout_seconds
            if timeout and self.upstream is not None:
                self.service.raw.expect(self.upstream, timeout)
            return
        self.processed = True
        self._refuse(error)
        self._respond_error(error)

    def _decide(self) -> None:
        derived = self.derived
        host = derived.get(_HOST) if derived is not None else None
        if host is None:
            hosts = self.header(b"host")
            if len(hosts) != 1 or not hosts[0].strip():
                raise bad_request("exactly one Host header is required")
            host = hosts[0].decode("latin-1").strip()
            if derived is not None:
                derived[_HOST] = host
        self.host = host
        if not self.raw_target.startswith(b"/"):
            raise bad_request("the request target must be a path")
        target = self.service.routes.match(self.host, self.raw_target)
        if target is None:
            if self._favicon():
                # Path mode: every page makes the browser ask the door's
                # own root for its icon; no app is there to answer, and a
                # 421 is an error in the page's console on every load.
                self.redirect = (204, [(b"cache-control", b"max-age=86400")])
                return
            name = gate.host_name(self.host)
            raise misdirected(name, self.service.routes.path_hosts(name))
        self.target = target
        if target.prefix and self._slash_missing(target):
            # ``/p/3000`` is the preview's root without its slash: the
            # door's cookie (``Path=/p/3000/``) is not sent there, so the
            # browser is sent to ``/p/3000/`` rather than told it has no
            # credential.  (Nothing about the port is decided yet: the
            # redirect says nothing an unexposed port would not.)
            _, _, query = self.raw_target.partition(b"?")
            location = target.prefix.encode() + b"/" + (b"?" + query if query else b"")
            self.redirect = (301, [(b"location", location)])
            return
        rule = self.context.policy.rules["preview_proxy"]
        try:
            self.service.check_port(target.port, rule)
        except ApiError:
            # To a stranger, the ports never previewed (the daemon's own
            # among them) look like any other it may not open: a 403
            # would map the daemon's ports.  (A public exposure the
            # policy now denies is no secret: its visitors hear why.)
            shown = self.service.exposures.by_port.get(target.port)
            if (shown is None or not shown.public) and not self._known_caller(target):
                raise link_refused("this preview needs a link or a token") from None
            raise
        exposure = self.service.exposures.by_port.get(target.port)
        if exposure is not None:
            exposure = self.service.exposures.get(target.port)  # expired?
        # A labelled exposure answers only to its label (in the host name,
        # or the path mode's ``/p/PORT-LABEL``); an unlabelled one to any
        # (``{port}-{sandbox_id}.DOMAIN``, E2B's ``get_host``).
        if exposure is None or (
            exposure.label is not None and target.label != exposure.label
        ):
            # Told only to a caller who could open a private preview: to
            # anyone else "not exposed" and "needs a link" would tell which
            # ports are exposed.
            if not self._known_caller(target):
                raise link_refused("this preview needs a link or a token")
            if exposure is not None:
                # Exposed, under a label: say which, rather than deny what
                # preview_get shows (this caller may see the exposures).
                raise self.service.not_exposed(target.port).reworded(
                    f"port {target.port} is exposed as {target.port}-"
                    f"{exposure.label}: a labelled exposure answers to its label "
                    f"only ({target.port}-{exposure.label}.localhost, or "
                    f"/p/{target.port}-{exposure.label}/ in path mode)"
                )
            raise self.service.not_exposed(target.port)
        self.exposure = exposure
        limit = rule.limits.max_request_bytes
        if limit is not None and self.length is not None and self.length > limit:
            raise payload_too_large(limit)
        if not self.direct and self.header(b"upgrade"):
            connection = self.header(b"connection")
            self.upgrade = b"upgrade" in h.connection_listed(
                [(b"connection", connection)]
            )
        self._admit(exposure, target)
        self.track()
        if self.upgrade:
            self._check_room(rule)

    def _favicon(self) -> bool:
        """Whether this is a browser's ``GET /favicon.ico`` at the door's own host (path mode)."""
        return (
            self.method in (b"GET", b"HEAD")
            and self.raw_target.partition(b"?")[0] == b"/favicon.ico"
            and self.service.routes.path_hosts(gate.host_name(self.host))
        )

    def _slash_missing(self, target: Target) -> bool:
        """
        Whether a path mode GET names the preview's root without its
        slash (``/p/3000`` or ``/p/3000?q``); a link in the query is left
        to the link's own redirect, and an upgrade cannot follow one.
        """
        rest = self.raw_target[len(target.prefix) :]
        if rest and not rest.startswith(b"?"):
            return False
        if self.method not in (b"GET", b"HEAD") or self.header(b"upgrade"):
            return False
        return h.query_value(rest[1:], h.LINK_PARAM) is None

    def _check_room(self, rule: EffectiveRule) -> None:
        """
        Room for one more upgraded connection (WebSocket): at most
        ``limits.max_sessions`` through the door, and one holder (an
        identity with the links it minted; every visitor of a public
        preview together as ``anonymous``) at most its share of them
        (``max_per_identity``: half when more than one can hold any), so
        that strangers on a public preview cannot lock its owner or the
        other identities out.  A socket idle for
        ``PREVIEW_WS_RECLAIM_IDLE_SECONDS`` gives its place to the new
        one (its holder's own when the share is full) rather than hold
        it until ``ws_idle_timeout_seconds``.

        :raises ApiError: 429 ``too_many_sessions`` naming the bound.
        """
        limit = rule.limits.max_sessions
        if limit is None:
            return
        exposures = self.service.exposures.by_port.values()
        spliced: list[Any] = [
            item
            for exposure in exposures
            for item in exposure.open
            if getattr(item, "holder", None) is not None
        ]
        holder = self.identity.root if self.identity is not None else "anonymous"
        holders = len(self.context.policy.tokens.ids())
        if any(exposure.public for exposure in exposures):
            holders += 1
        share = identity_cap(limit, holders, rule.limits.max_per_identity)
        mine = [item for item in spliced if item.holder == holder]
        if len(mine) >= share:
            if self._reclaim(mine):
                return
            who = (
                "visitors of public previews have"
                if holder == "anonymous"
                else "you have"
            )
            raise limit_exceeded(
                429,
                f"{who} {len(mine)} WebSockets open through the preview door, "
                f"the share of {limit} one holder may have (max_per_identity); "
                "close one first",
                Code.TOO_MANY_SESSIONS,
                limit_rule(rule, "max_per_identity"),
                limit="max_per_identity",
            )
        if len(spliced) >= limit and not self._reclaim(spliced):
            raise limit_exceeded(
                429,
                f"{len(spliced)} WebSockets are open through the preview door",
                Code.TOO_MANY_SESSIONS,
                limit_rule(rule, "max_sessions"),
                limit=limit,
            )

    def _reclaim(self, candidates: list[Any]) -> bool:
        """
        Close the longest idle of ``candidates`` (spliced upgrades) when it
        passed no byte for ``PREVIEW_WS_RECLAIM_IDLE_SECONDS``; whether one was.
        """
        if not candidates:
            return False
        idlest = min(candidates, key=lambda item: item.last_active)
        quiet = self.context.reactor.seconds() - idlest.last_active
        if quiet < PREVIEW_WS_RECLAIM_IDLE_SECONDS:
            return False
        idlest.close(f"closed after {int(quiet)} s idle, to make room for a new one")
        return True

    def _admit(self, exposure: Exposure, target: Target) -> None:
        """The gate, with the first credential that passes (see the module)."""
        endpoint = self.context.table.get("preview_proxy")
        if exposure.public:
            self.passed = gate.admit(
                self.context, endpoint, {}, public=True, host_rules=False
            )
            self.identity = self.passed.identity
            return
        audience = preview_audience(target.port)
        candidates: list[tuple[bytes, bool, str]] = []
        header_tokens = self._header_credentials()
        if header_tokens:
            candidates.append((b"", True, "header"))
        _path, _, query = target.path.partition(b"?")
        link = h.query_value(query, h.LINK_PARAM)
        if link is not None and self.method in (b"GET", b"HEAD"):
            candidates.append((link, True, "query"))
        cookie = h.our_cookie(self.header(b"cookie"), target.port)
        if cookie is not None:
            candidates.append((cookie, False, "cookie"))
        if not candidates:
            if not self.context.policy.tokens.local_mode:
                raise link_refused("this preview needs a link or a token")
            candidates.append((b"", True, "local"))
        refusal: gate.Refused | None = None
        for credential, consume, where in candidates:
            if where in ("query", "cookie") and not is_link(credential):
                continue  # tokens are never carried in URLs or cookies
            if where == "header":
                # Both headers, as sent: the gate decides between two
                # tokens as on every door (400 ambiguous_credentials for
                # two that log in as different identities).
                headers = header_tokens
            else:
                headers = {b"x-access-token": [credential]} if credential else {}
            try:
                self.passed = gate.admit(
                    self.context,
                    endpoint,
                    headers,
                    audience=audience,
                    consume=consume,
                    host_rules=False,
                )
            except gate.Refused as e:
                if e.error.status != 401:
                    # Known, but not let in (disabled, a scope, a rate).
                    self.identity = e.identity
                    raise e.error from None
                if refusal is None or e.error.code == Code.LINK_EXPIRED:
                    refusal = e
                continue
            self.identity = self.passed.identity
            if where == "cookie":
                self._check_cookie_origin()
            if where == "query" and not self.upgrade:
                # A WebSocket handshake cannot follow a redirect: the link
                # in its URL is enough (and never reaches the app).
                self.redirect = self._cookie_redirect(credential, target, query)
            return
        if refusal is None or refusal.error.code == Code.UNAUTHORIZED:
            raise link_refused("this preview needs a link or a token")
        raise refusal.error

    def _known_caller(self, target: Target) -> bool:
        """
        Whether the request carries a credential that logs in here (a
        token, or a link or the door's cookie for this port), checked
        without spending a use or a slot.
        """
        from sandboxd.access.auth import presented_tokens

        tokens = self.context.policy.tokens
        if tokens.local_mode:
            return True
        shown: list[bytes] = []
        try:
            shown += presented_tokens(
                {
                    b"x-access-token": self.header(b"x-access-token"),
                    b"authorization": self.header(b"authorization"),
                }
            )
        except ApiError:
            return True  # answered 400 ambiguous_credentials when exposed too
        _path, _, query = target.path.partition(b"?")
        link = h.query_value(query, h.LINK_PARAM)
        if link is not None:
            shown.append(link)
        cookie = h.our_cookie(self.header(b"cookie"), target.port)
        if cookie is not None:
            shown.append(cookie)
        audience = preview_audience(target.port)
        for credential in shown:
            if not is_link(credential):
                if tokens.identify(credential) is not None:
                    return True
                continue
            try:
                self.context.links.verify(
                    credential, audience, consume=False, tokens=tokens
                )
            except ApiError:
                continue
            return True
        return False

    def _check_cookie_origin(self) -> None:
        """
        A request the door's cookie lets in must come from the preview's
        own page when it names its origin: every preview under one domain
        is the same *site* to a browser, so another preview's page (or a
        form it posts, or a WebSocket it opens) would otherwise be sent
        this preview's cookie.

        :raises ApiError: 403 ``origin_not_allowed``.
        """
        origins = self.header(b"origin")
        if not origins:
            return
        origin = origins[-1].decode("latin-1")
        if gate.same_origin(origin, self.host, self.service.secure):
            return
        if self.passed is not None:
            gate.release(self.context, self.passed)
            self.passed = None
        raise forbidden(
            f"the preview's cookie is not accepted from the page at {origin!r}",
            Code.ORIGIN_NOT_ALLOWED,
            rule="preview:cookie_origin",
        )

    def _header_credentials(self) -> dict[bytes, list[bytes]]:
        """
        ``X-Access-Token`` and ``Authorization`` as sent, when they present
        a token or link (``Authorization: Basic``, the app's own, does not).

        :raises ApiError: 400 ``ambiguous_credentials`` for two differing
            values of one of them.
        """
        from sandboxd.access.auth import presented_tokens

        headers = {
            b"x-access-token": list(self.header(b"x-access-token")),
            b"authorization": list(self.header(b"authorization")),
        }
        if not presented_tokens(headers):
            return {}
        return {name: values for name, values in headers.items() if values}

    def _cookie_redirect(
        self, link: bytes, target: Target, query: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The 303 that trades ``?sbx_link=`` for the door's cookie."""
        text = link.decode("latin-1")
        claims_exp = self.context.links.links.get(self.identity_id_suffix())
        now = self.context.reactor.seconds()
        max_age = int(claims_exp.claims.exp - now) if claims_exp is not None else 900
        path, _, _ = target.path.partition(b"?")
        rest = h.query_without(query, h.LINK_PARAM)
        location = target.prefix.encode() + path + (b"?" + rest if rest else b"")
        cookie = h.set_cookie(
            target.port,
            text,
            max(1, max_age),
            (target.prefix + "/") if target.prefix else "/",
            self.service.secure,
        )
        return 303, [
            (b"location", location),
            (b"set-cookie", cookie),
            (b"referrer-policy", b"no-referrer"),
        ]

    def identity_id_suffix(self) -> str:
        """The link id of the caller, when it is a link."""
        ident = self.identity.id if self.identity is not None else ""
        return ident.removeprefix("link:")

    def _refuse(self, error: ApiError) -> None:
        """Answer an error: now, when a body would follow; else once it is in."""
        self.refusal = error
        self._release()
        if self.length != 0:
            self._answer_early(error)

    def _answer_early(self, error: ApiError) -> None:
        """Write the error straight to the socket and close (a body would follow)."""
        self.answered_early = True
        self.request.requestHeaders.removeHeader(b"expect")
        kind, body, extra = error_response(error, self._accept())
        head = [
            f"HTTP/1.1 {error.status} {reason_phrase(error.status)}",
            f"Content-Type: {kind.decode()}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in extra.items()),
        ]
        transport: Any = self.request.channel.transport
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.bytes_out += len(body)
        self._audit(error.status, error.code, error.rule)
        close_after_answer(self.request.channel)

    def _accept(self) -> bytes | None:
        values = self.header(b"accept")
        return values[0] if values else None

    # -- the body -------------------------------------------------------------

    def body(self, data: bytes) -> None:
        """A chunk of the browser's body, on to the app."""
        if self.answered_early or self.refusal is not None:
            return
        self.bytes_in += len(data)
        limit = self.context.policy.rules["preview_proxy"].limits.max_request_bytes
        if limit is not None and self.bytes_in > limit:
            if self.pending is not None:
                self.pending.cancel()
            self._refuse(payload_too_large(limit))
            if not self.answered_early:
                self._answer_early(payload_too_large(limit))
            return
        if self.body_producer is not None:
            self.body_producer.feed(data)

    def body_done(self) -> None:
        """The request is whole: answer what was decided, or wait for the app."""
        self.processed = True
        if self.answered_early:
            return
        if self.refusal is not None:
            self._respond_error(self.refusal)
            return
        if self.redirect is not None:
            self._respond_own(*self.redirect)
            return
        if self.upgrade:
            from sandboxd.preview.splice import Upgrade

            assert self.target is not None and self.exposure is not None
            Upgrade(self).start()
            return
        if self.body_producer is not None:
            self.body_producer.finish()
        timeout = self.context.policy.rules["preview_proxy"].limits.timeout_seconds
        if timeout and self.pending is not None:
            if self.upstream is not None:
                self.service.raw.expect(self.upstream, timeout)
            else:
                self._timer = self.context.reactor.callLater(timeout, self._head_late)
        if self.response is not None:
            self._relay(self.response)

    # -- the app's answer -----------------------------------------------------

    def upstream_headers(
        self, keep_upgrade: bool = False
    ) -> list[tuple[bytes, list[bytes]]]:
        """The request's headers as the app gets them (see :mod:`headers`)."""
        assert self.target is not None and self.exposure is not None
        raw = [
            (name, list(values))
            for name, values in self.request.requestHeaders.getAllRawHeaders()
        ]
        out = []
        for name, values in h.end_to_end(raw, keep_upgrade):
            lower = name.lower()
            if lower in (b"host", b"expect", b"content-length"):
                continue
            if lower in (b"x-access-token",) or (
                lower == b"authorization" and self._ours(values)
            ):
                continue
            if lower == b"cookie":
                values = h.cookies_without_ours(values)
                if not values:
                    continue
            elif lower == b"origin":
                values = self._app_origin(values)
            out.append((name, values))
        if self.exposure.host_header == "preserve":
            host = self.host
        else:
            host = f"localhost:{self.target.port}"
        out.insert(0, (b"Host", [host.encode("latin-1")]))
        door_port = self.service.door_port
        return h.forwarded(
            out,
            self.client,
            self.host,
            "https" if self.service.secure else "http",
            door_port,
            self.target.prefix,
        )

    def app_head(self) -> bytes:
        """
        The request head the app gets, from the door's own channel: the
        rules of :meth:`upstream_headers` in one pass over the parsed
        fields, written as one bytes string.
        """
        target = self.target
        exposure = self.exposure
        assert target is not None and exposure is not None
        line = self.method + b" " + self.upstream_target() + b" HTTP/1.1\r\n"
        derived = self.derived
        if derived is None:
            return line + self._app_fields(target, exposure)
        key = (exposure, target.port, target.prefix)
        policy = self.context.policy
        known = derived.get(key)
        if known is not None and known[0] is policy:
            kept: bytes = known[1]
            return line + kept
        lines = self._app_fields(target, exposure)
        if b"authorization" not in self.request.requestHeaders.fields:
            # (A bearer value is ours or not by the tokens of the moment:
            # never kept.)
            if len(derived) >= PREVIEW_DERIVED_ENTRIES:
                derived.clear()
            derived[key] = (policy, lines)
        return line + lines

    def _app_fields(self, target: Target, exposure: Exposure) -> bytes:
        """The header lines of :meth:`app_head`, the blank line included."""
        fields: dict[bytes, list[bytes]] = self.request.requestHeaders.fields
        drop = h.NOT_TO_APP
        listed = fields.get(b"connection")
        if listed is not None:
            drop = drop | h.connection_listed([(b"connection", listed)])
        if exposure.host_header == "preserve":
            host = self.host.encode("latin-1")
        else:
            host = b"localhost:%d" % target.port
        lines = [b"Host: " + host]
        before: list[bytes] | None = None
        for lower, values in fields.items():
            if lower in drop:
                continue
            if lower.startswith(b"x-forwarded-") or lower in _SET_BY_DOOR:
                if lower == b"x-forwarded-for":
                    before = values
                continue
            if lower == b"authorization":
                if self._ours(values):
                    continue
            elif lower == b"cookie":
                values = h.cookies_without_ours(values)
                if not values:
                    continue
            elif lower == b"origin":
                values = self._app_origin(values)
            name = canonical(lower)
            for value in values:
                lines.append(name + b": " + value)
        client = self.client.encode()
        chain = b", ".join([*before, client]) if before else client
        lines.append(b"X-Forwarded-For: " + chain)
        lines.append(b"X-Real-IP: " + client)
        lines.append(
            b"X-Forwarded-Proto: https"
            if self.service.secure
            else b"X-Forwarded-Proto: http"
        )
        lines.append(b"X-Forwarded-Host: " + self.host.encode("latin-1"))
        door_port = self.service.door_port
        if door_port is not None:
            lines.append(b"X-Forwarded-Port: %d" % door_port)
        if target.prefix:
            lines.append(b"X-Forwarded-Prefix: " + target.prefix.encode())
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    def _app_origin(self, values: list[bytes]) -> list[bytes]:
        """
        ``Origin`` as the app gets it: with the default ``host_header``
        (``upstream``) the app sees ``Host: localhost:PORT``, so the
        preview's own origin becomes ``http://localhost:PORT`` with it.
        Apps that check a WebSocket's (or a form's) Origin against Host
        (tornado, and so Jupyter) would otherwise refuse every one through
        the door.  Any other origin (another site's page) is passed as it
        came, for the app to judge.
        """
        exposure, target = self.exposure, self.target
        if exposure is None or target is None or exposure.host_header == "preserve":
            return values
        own = b"http://localhost:%d" % target.port
        secure = self.service.secure
        return [
            own if gate.same_origin(v.decode("latin-1"), self.host, secure) else v
            for v in values
        ]

    def _ours(self, values: list[bytes]) -> bool:
        """Whether an ``Authorization`` header carried our credential."""
        for value in values:
            scheme, _, rest = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and (
                is_link(rest.strip())
                or self.context.policy.tokens.identify(rest.strip())
            ):
                return True
        return False

    def upstream_target(self) -> bytes:
        """The path and query the app gets (never our link)."""
        assert self.target is not None
        path, _sep, query = self.target.path.partition(b"?")
        if not query:
            return path
        if h.LINK_PARAM in query:
            query = h.query_without(query, h.LINK_PARAM)
        return path + (b"?" + query if query else b"")

    def _start_upstream(self) -> None:
        assert self.target is not None
        if self.length != 0:
            self.body_producer = StreamBody(
                self.length,
                self.request.channel.transport,
            )
        self._send(self.addresses[0])

    def _send(self, address: str) -> None:
        assert self.target is not None
        if self.body_producer is None:
            # No body: one raw write on a pooled connection (rawpool).
            if self.direct:
                head = self.app_head()
                # The door's channel: the connection answers this exchange
                # itself (:meth:`upstream_head` and on), no Deferred.
                raw = self.service.raw
                connection = raw.take(address, self.target.port)
                if connection is None:
                    connection = raw.connect_to(
                        (address, self.target.port), self.method, head, self
                    )
                else:
                    connection.send_to(self.method, head, self)
                self.pending = self.upstream = connection
                return
            head = h.request_head(
                self.method, self.upstream_target(), self.upstream_headers()
            )
            self.pending = self.service.raw.request(
                address, self.target.port, self.method, head
            )
            self.pending.addCallbacks(self._got_response, self._failed)
            return
        host = f"[{address}]" if ":" in address else address
        url = f"http://{host}:{self.target.port}".encode() + self.upstream_target()
        headers = Headers()
        for name, values in self.upstream_headers():
            headers.setRawHeaders(name, values)
        self.pending = self.service.agent.request(
            self.method, url, headers, self.body_producer
        )
        self.pending.addCallbacks(self._got_response, self._failed)

    def _got_response(self, response: Any) -> None:
        self.pending = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self.gone or self.refusal is not None:
            response.deliverBody(BodyRelay(_ignore, _ignore, _ignore))
            return
        self.response = response
        if self.processed:
            self._relay(response)

    def _failed(self, failure: Failure) -> None:
        self.pending = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self.gone or self.answered_early or self.finished:
            return  # (answered already: a reload's refusal)
        assert self.target is not None
        timeout = self.context.policy.rules["preview_proxy"].limits.timeout_seconds
        if self.timed_out or failure.check(CancelledError):
            error = upstream_timeout(self.target.port, timeout or 0)
        else:
            refused = failure.check(ConnectionRefusedError, ConnectError)
            inner = getattr(failure.value, "reasons", None)
            if not refused and inner:
                refused = any(
                    r.check(ConnectionRefusedError, ConnectError) for r in inner
                )
            if (
                refused
                and len(self.addresses) > 1
                and (self.body_producer is None or not self.body_producer.started)
            ):
                self.addresses = self.addresses[1:]
                self._send(self.addresses[0])
                return
            if refused:
                self._refused_everywhere(self.target.port)
                return
            error = upstream_unavailable(self.target.port, _unusable(failure))
        self._unavailable(error)

    def _refused_everywhere(self, port: int) -> None:
        """
        Every loopback refused: say so, or, when the app listens only
        where the door does not connect (the sandbox's own address), say
        that and how to bind (asked in a thread: the kernel's table of
        listeners may be read from ``/proc``).
        """
        from sandboxd import sysinfo

        def told(found: dict[int, set[str]]) -> None:
            addresses = found.get(port, set())
            if reached(addresses):
                self._unavailable(upstream_unavailable(port))
            else:
                self._unavailable(listens_elsewhere(port, sorted(addresses)))

        asked = self.context.in_thread(sysinfo.listening_addresses)
        asked.addCallbacks(
            told, lambda _: self._unavailable(upstream_unavailable(port))
        )

    def _unavailable(self, error: ApiError) -> None:
        """Answer ``error`` for the app's part (once the request is whole)."""
        if self.gone or self.answered_early or self.finished:
            return
        if self.body_producer is not None:
            self.body_producer.stopProducing()
        self.refusal = error
        self._release()
        if self.processed:
            self._respond_error(error)

    def _head_late(self) -> None:
        self._timer = None
        self.timed_out = True
        if self.pending is not None:
            self.pending.cancel()

    # -- the app's answer, told directly (the door's own channel) -------------

    @property
    def rules(self) -> Rules:
        """How the app's answer is read for this preview (see :mod:`answer`)."""
        target = self.target
        assert target is not None
        return Rules(
            gate.host_name(self.host), target.port, self._origin(), target.prefix
        )

    def upstream_answer(self, answer: Answer) -> None:
        """The app's head, its rules applied, as the browser's."""
        self.pending = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self.gone or self.refusal is not None:
            if self.upstream is not None:
                self.upstream.let_go()
            return
        self.request.relay_answer(answer)
        self.status = answer.code
        self.from_app = True
        length = answer.length
        if length is not None and length > LARGE_BODY_BYTES and self.upstream:
            # Twisted reads 64 KiB per recv: a large download would be many
            # reactor turns.  Read it in large reads (until its end).
            socket = self.upstream.transport
            if socket is not None and hasattr(socket, "bufferSize"):
                socket.bufferSize = LARGE_READ_BYTES
                self.widened = socket

    def upstream_whole(self, answer: Answer, body: bytes) -> None:
        """
        The app's whole answer, read in one piece (its connection already
        back in the pool): on to the browser in one write, and the
        exchange is done (:meth:`upstream_answer`, :meth:`dataReceived`
        and :meth:`upstream_done` in one step).
        """
        self.pending = self.upstream = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self.gone or self.finished or self.refusal is not None:
            return
        self.status = answer.code
        self.from_app = True
        self.bytes_out += len(body)
        self.finished = True
        self.request.answer_whole(answer, body)

    def dataReceived(self, data: bytes) -> None:
        """Body bytes from the app, on to the browser; the app waits while it is slow."""
        if self.gone:
            return
        self.bytes_out += len(data)
        request = self.request
        request.write(data)
        if not self.producing and self.upstream is not None:
            transport = request.channel.transport
            if transport is not None and not drained(transport):
                # Only a response the browser is slower than pays for a
                # producer: the app's socket pauses while the browser's is full.
                self.producing = True
                transport.registerProducer(BodyTransport(self.upstream), True)

    def upstream_done(self, reason: Failure | None) -> None:
        """The app's body is whole (None) or was cut short."""
        self.upstream = None
        if self.widened is not None:
            if "bufferSize" in vars(self.widened):
                del self.widened.bufferSize  # the pooled connection reads small again
            self.widened = None
        if self.producing:
            self.producing = False
            transport = self.request.channel.transport
            if transport is not None:
                transport.unregisterProducer()
        if self.gone or self.finished:
            return
        if reason is None or reason.check(PotentialDataLoss):
            # Whole, or read to the close (its only end).
            self.finished = True
            self.request.finish()
        else:
            self.close()

    def upstream_failed(self, reason: Failure) -> None:
        """No answer from the app (refused, closed, not HTTP, cancelled)."""
        self.upstream = None
        self._failed(reason)

    def upstream_retry(self, connection: RawConnection) -> None:
        """The request is sent again on a fresh connection."""
        self.pending = self.upstream = connection

    def _relay(self, response: Any) -> None:
        """Send the app's status and headers, then stream its body."""
        assert self.target is not None and self.exposure is not None
        raw = [(n, list(vs)) for n, vs in response.headers.getAllRawHeaders()]
        origin = self._origin()
        out = []
        for name, values in h.end_to_end(raw):
            lower = name.lower()
            if lower == b"set-cookie":
                values = [
                    v for v in values if h.cookie_allowed(v, gate.host_name(self.host))
                ]
                if not values:
                    continue
            elif lower == b"location":
                values = [
                    h.rewrite_location(v, self.target.port, origin, self.target.prefix)
                    for v in values
                ]
            out.append((name, values))
        length = response.length if isinstance(response.length, int) else None
        if (
            length is not None
            and self.request.method != b"HEAD"
            and response.code not in (204, 304)
        ):
            # Twisted's client keeps the length out of the headers: without
            # it the answer would go out chunked, and a browser would show
            # a download with no size or progress.
            out.append((b"content-length", [str(length).encode()]))
        self.request.relay_head(response.code, response.phrase, out)
        self.status = response.code
        self.from_app = True
        self.relay = BodyRelay(self._register, self._write, self._body_ended, length)
        response.deliverBody(self.relay)

    def _origin(self) -> str:
        scheme = "https" if self.service.secure else "http"
        return f"{scheme}://{self.host}"

    def _register(self, producer: Any) -> None:
        if not self.gone:
            self.request.registerProducer(producer, True)

    def _write(self, data: bytes) -> None:
        if self.gone:
            return
        self.bytes_out += len(data)
        self.request.write(data)

    def _body_ended(self, reason: Failure | None) -> None:
        if self.gone or self.finished:
            return
        self.request.unregisterProducer()
        if reason is None:
            self.finished = True
            self.request.finish()
        else:
            # Cut short: the browser must see a broken response, not a
            # complete one.
            self.close()

    # -- answers of our own ---------------------------------------------------

    def _respond_error(self, error: ApiError) -> None:
        if self.gone or self.finished:
            return
        self.status = error.status
        self.code = str(error.code) if error.code else None
        self.rule = error.rule
        accept = self._accept()
        if error.status in (502, 504) and wants_events(accept):
            self._respond_retry(error)
            return
        kind, body, extra = error_response(error, accept)
        request = self.request
        request.setResponseCode(error.status)
        request.setHeader(b"content-type", kind)
        request.setHeader(b"content-length", str(len(body)).encode())
        request.setHeader(b"cache-control", b"no-store")
        for key, value in extra.items():
            request.setHeader(key.encode(), value.encode())
        self.bytes_out += len(body)
        request.write(body)
        self.finished = True
        request.finish()

    def _respond_retry(self, error: ApiError) -> None:
        """
        The app is not answering an ``EventSource``: 200, an event stream
        naming the error in a comment and the ``retry`` delay, then its
        end (see :func:`retry_events`).  The audit line keeps the code.
        """
        body = retry_events(error)
        request = self.request
        self.status = 200
        request.setResponseCode(200)
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"content-length", str(len(body)).encode())
        request.setHeader(b"cache-control", b"no-store")
        self.bytes_out += len(body)
        request.write(body)
        self.finished = True
        request.finish()

    def _respond_own(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """An answer of the door's own with no body (see :attr:`redirect`)."""
        request = self.request
        self.status = status
        request.setResponseCode(status)
        request.setHeader(b"cache-control", b"no-store")
        if status != 204:  # (a 204 never has a length, RFC 9110 §8.6)
            request.setHeader(b"content-length", b"0")
        for name, value in headers:
            request.setHeader(name, value)
        self.finished = True
        self._release()
        request.finish()

    # -- the end --------------------------------------------------------------

    def track(self) -> None:
        """
        Count the exchange as in flight to its port (closed on unexpose),
        and hold it among the connections a policy reload asks again: an
        answer may last as long as the app keeps writing (an event stream,
        a long poll, a download), and a caller the policy no longer lets
        in must stop receiving it, as its WebSockets do.  (An upgrade is
        held by its splice once it is one.)
        """
        exposure = self.exposure
        if exposure is not None:
            exposure.requests += 1
            exposure.open.add(self)
        if self.identity is not None and not self.upgrade:
            self.held = held_connections.hold(
                self.context,
                self.identity,
                self.context.table.get("preview_proxy"),
                self._revoked,
                public=exposure is not None and exposure.public,
            )

    def _revoked(self, error: ApiError) -> None:
        """
        The caller is no longer let in (a reload, its link revoked or
        expired: ``error`` says which): an answer the app has not
        begun is the refusal instead; one already under way (an event
        stream, a download) is cut short, so the browser sees it broken,
        never complete, and meets the refusal when it asks again.
        """
        self.held = None
        if self.gone or self.finished or self.answered_early:
            return
        log.info(
            "preview: {method} {path} of {identity} ended: {why}",
            method=self.method.decode("latin-1"),
            path=self.raw_target.partition(b"?")[0].decode("latin-1"),
            identity=self.identity.id if self.identity is not None else "",
            why=error.message,
        )
        if self.status == 0 and self.processed:
            self.refusal = error
            self._respond_error(error)
            self._drop_upstream()
            if self.body_producer is not None:
                self.body_producer.stopProducing()
            return
        self.close()

    def close(self, why: str | None = None) -> None:
        """
        End it now: the port was unexposed (``why``), or the app's answer
        broke.  The connection is aborted: an answer cut short must look
        broken to the browser, never complete.  An upgrade spliced is
        its :class:`~sandboxd.preview.splice.Upgrade`'s to close (with a
        close frame, which an abort here would lose).
        """
        if self.upgrade and self.status == 101:
            return
        self._drop_upstream()
        transport: Any = (
            self.request.channel.transport if self.request.channel else None
        )
        if transport is not None:
            transport.abortConnection()

    def _drop_upstream(self) -> None:
        """Stop waiting on the app: its connection attempt, relay and connection."""
        if self.pending is not None:
            self.pending.cancel()
        if self.relay is not None:
            self.relay.stop()
        if self.upstream is not None:
            self.upstream.let_go()
            self.upstream = None

    def _ended(self, result: Any) -> None:
        """The response is done, or the browser left."""
        if isinstance(result, Failure):
            self.gone = True
            self._drop_upstream()
            if self.body_producer is not None:
                self.body_producer.stopProducing()
            if not self.status:
                self.status = 499
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._release()
        if not self.upgrade or self.status != 101:
            self._audit(self.status or 200, self.code, self.rule)
        return None

    def _release(self) -> None:
        if self.held is not None:
            held_connections.release(self.context, self.held)
            self.held = None
        if self.exposure is not None:
            self.exposure.open.discard(self)
        if self.passed is not None:
            gate.release(self.context, self.passed)

    def _audit(self, status: int, code: Any, decided_by: str | None) -> None:
        if self._audited:
            return
        self._audited = True
        if self.exposure is not None:
            self.exposure.bytes_in += self.bytes_in
            self.exposure.bytes_out += self.bytes_out
        rule = self.context.policy.rules["preview_proxy"]
        refused = False if self.from_app else None
        if (
            not should_record(rule.audit, status, refused)
            and not self.context.tracer.exporting
        ):
            # Counted, as every exchange is; neither a record nor a span
            # is built.
            self.context.metrics.request(
                "preview_proxy",
                _PREVIEW,
                status,
                str(code) if code else None,
                time.monotonic() - self.started,
            )
            return
        endpoint = self.context.table.get("preview_proxy")
        path, _, query = self.raw_target.partition(b"?")
        gate.audit(
            self.context,
            door=gate.Door.PREVIEW,
            endpoint=endpoint,
            identity=self.identity,
            rule=rule,
            method=self.method.decode("latin-1"),
            path=path.decode("latin-1"),
            query=query.decode("latin-1"),
            status=status,
            code=str(code) if code else None,
            decided_by=decided_by,
            refused=refused,
            started=self.started,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            client=self.client,
            extra={
                "host": self.host,
                "port": self.target.port if self.target is not None else None,
            },
            headers=getattr(self.request.requestHeaders, "fields", None)
            or raw_headers(self.request),
        )
