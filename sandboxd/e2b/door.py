# -*- test-case-name: tests.e2b.test_door -*-
"""
The E2B door (SPEC §16, §18): envd's API on a port of its own, each call
passed through the one gate as the sandboxd endpoint doing the same job.

The machinery of a call (admission as ``e2b`` then as the mapped
endpoint, body caps, one audit line with ``via: e2b``) is the port door's,
:mod:`sandboxd.web.portdoor`, which the KEP door shares; this module gives
what is envd's: which procedure a request is (the procedure's ``endpoint``
decides what it is governed as, sometimes from the message: ``Start`` with
a ``pty`` is ``pty_create_session``), Connect's codecs, deadlines and
streams, and the framing of errors: handlers raise
:class:`~sandboxd.errors.ApiError`; this module alone turns them into
Connect errors (unary: a JSON error with the code's HTTP status; streams:
the end-of-stream message) or envd's REST errors (``{"code", "message"}``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import posixpath
import pwd
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.logger import Logger

from sandboxd.access import gate
from sandboxd.api.fields import Field
from sandboxd.e2b import connect
from sandboxd.errors import (
    ApiError,
    bad_request,
    exhausted,
    internal,
    invalid_path,
    malformed_request,
    payload_too_large,
    unsupported,
)
from sandboxd.files import walk
from sandboxd.policy.defaults import (
    E2B_INPUT_RECHECK_SECONDS,
    E2B_KEEPALIVE_MAX_SECONDS,
    E2B_KEEPALIVE_MIN_SECONDS,
    E2B_MAX_MESSAGE_BYTES,
    MIB,
)
from sandboxd.policy.paths import decide
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import resolve_user
from sandboxd.web import portdoor
from sandboxd.web.delivery import Delivery, delivery, stalled
from sandboxd.web.params import declared_types
from sandboxd.web.portdoor import (
    CLIENT_STREAM,
    REST,
    SERVER_STREAM,
    UNARY,
    DoorRequest,
    DoorSite,
    Pauser,
    PortDoor,
    Procedure,
    raw_headers,
    run_each,
)

log = Logger(namespace="sandboxd.e2b")


# -- the E2B door's calls -------------------------------------------------------

#: The E2B door's request, site and procedure: the port door's (the names
#: its modules and tests have used since before the KEP door shared them).
E2BRequest = DoorRequest
E2BSite = DoorSite


def basic_user(headers: dict[bytes, list[bytes]]) -> str | None:
    """
    The user envd reads from ``Authorization: Basic base64(user:)``.

    :raises ApiError: 400 for a Basic credential that does not decode.
    """
    for value in headers.get(b"authorization", []):
        scheme, _, rest = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            continue
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise bad_request("the Basic credential does not decode") from None
        name = decoded.partition(":")[0]
        return name or None
    return None


def home_of(rule: EffectiveRule, user: str | None) -> str:
    """
    The home directory of the user a call's commands run as (``user``,
    else ``params.default_user``, else the daemon's own): the ``HOME``
    those commands get.

    :raises ApiError: 400 for an unknown user or one without a home, 403
        for a user the policy refuses.
    """
    run_as = resolve_user(user, rule)
    if run_as is not None:
        home = run_as.home
    else:
        home = os.environ.get("HOME", "")
        if not home:
            try:
                home = pwd.getpwuid(os.geteuid()).pw_dir
            except KeyError:
                home = ""
    if not home.startswith("/"):
        raise invalid_path("cannot expand '~': the user has no home directory")
    return home


def expand_home(path: str, rule: EffectiveRule, user: str | None) -> str:
    """
    ``path`` with a leading ``~`` taken as the user's home, as envd
    expands it (so ``files.write("~/x")`` and ``cat ~/x`` name one file);
    the result still goes through the path guard.

    :raises ApiError: 400 ``invalid_path`` for ``~name``, another user's
        home, which envd does not expand either.
    """
    if not path.startswith("~"):
        return path
    if len(path) > 1 and path[1] not in "/\\":
        raise invalid_path(
            f"cannot expand another user's home directory: {path[:100]!r}"
            " (only '~' and '~/...')"
        )
    rest = path[1:].lstrip("/")
    home = home_of(rule, user)
    return posixpath.join(home, rest) if rest else home


def as_listed(path: str, rule: EffectiveRule) -> str:
    """
    ``path``, or the name a listing showed as ``path``: a name that is not
    UTF-8 is listed with its bad bytes as ``\\xNN`` (JSON strings, and so
    the SDKs, cannot carry them), and this takes that spelling back to the
    name on disk, so what ``files.list`` shows can be read, described,
    renamed and removed.  Only when no entry is spelled ``path`` itself
    and the other one exists: a name typed with a literal ``\\x`` is
    never turned into bytes, nor anything created under such a name.  The
    name chosen goes through the path guard as any other.
    """
    raw = walk.shown_as(path)
    if raw is None:
        return path
    as_typed = decide(rule, path, "read").target
    on_disk = decide(rule, raw, "read").target
    if os.path.lexists(as_typed) or not os.path.lexists(on_disk):
        return path
    return raw


@attrs.define(eq=False)
class Call(portdoor.Call):
    """One request through the E2B door: envd's user, Connect's deadlines."""

    def user(self) -> str | None:
        """The envd user (``Authorization: Basic``), §7.4's ``user``."""
        return basic_user(self.headers)

    def expand(self, path: str, user: str | None = None) -> str:
        """
        ``path`` with a leading ``~`` as the home of ``user`` (default:
        the call's envd user): :func:`expand_home`.
        """
        path = expand_home(path, self.rule, user if user is not None else self.user())
        return as_listed(path, self.rule)

    def timeout_seconds(self) -> float | None:
        """
        ``Connect-Timeout-Ms`` in seconds (None when absent).

        :raises ApiError: 400 for a value that is not a positive integer.
        """
        raw = self.header("connect-timeout-ms")
        if raw is None or raw == "":
            return None
        digits = raw.isascii() and raw.isdigit()
        if not digits or len(raw) > 10 or int(raw) <= 0:
            raise bad_request(
                f"Connect-Timeout-Ms must be a positive integer, not {raw[:20]!r}"
            )
        return int(raw) / 1000.0

    def keepalive_seconds(self) -> float | None:
        """The ``Keepalive-Ping-Interval`` the client asked for, bounded."""
        raw = self.header("keepalive-ping-interval")
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            return None
        if value != value or value <= 0:
            return None
        return min(max(value, E2B_KEEPALIVE_MIN_SECONDS), E2B_KEEPALIVE_MAX_SECONDS)


# -- server streams -------------------------------------------------------------


class Stream:
    """
    The response of a server stream: enveloped messages, keepalives at the
    client's interval while nothing else is sent, and one end-of-stream
    message (with the error, if any) at the end.
    """

    def __init__(self, call: Call, keepalive: Callable[[], dict[str, Any]] | None):
        self.call = call
        self.request = call.request
        self.clock = call.context.reactor
        self.ended = False
        self._keepalive_message = keepalive
        self._interval = call.keepalive_seconds() if keepalive is not None else None
        self._timer: Any = None
        self._deadline: Any = None
        self._end_hooks: list[Callable[[], None]] = []
        self._producer: Pauser | None = None
        #: While the source waits for a client that reads nothing: the
        #: timer of the bound on that wait.
        self._unread: Any = None
        #: A follower's lag (:meth:`register_follower`): whether its socket
        #: is full, what was sent since (or last found waiting), the timer
        #: of its next look, and what the client had taken at the last one.
        self._lagging = False
        self._behind = 0
        self._lag_timer: Any = None
        self._lag_seen: Delivery | None = None
        self._lag_bounds: tuple[float, int, Callable[[str], ApiError]] | None = None
        self.request.setResponseCode(200)
        self.request.setHeader(b"content-type", connect.STREAM_CONTENT_TYPE.encode())
        call.on_close(self._client_gone)
        self._arm()
        # A reload that takes the call's scope or identity away ends it.
        call.hold(self.end)

    def _client_gone(self) -> None:
        """The client left: stop the timers and let go of what was followed."""
        if not self.ended:
            self.ended = True
            self._stop()

    def _arm(self) -> None:
        if self._interval is None or self.ended:
            return
        if self._timer is not None and self._timer.active():
            self._timer.reset(self._interval)
        else:
            self._timer = self.clock.callLater(self._interval, self._ping)

    def _ping(self) -> None:
        self._timer = None
        if self.ended or self.call.closed or self._keepalive_message is None:
            return
        self._write(connect.envelope(self._keepalive_message()))
        self._arm()

    def deadline(self, seconds: float | None, on_expiry: Callable[[], None]) -> None:
        """End the stream with ``deadline_exceeded`` after ``seconds``."""
        if seconds is None:
            return

        def expire() -> None:
            self._deadline = None
            if not self.ended:
                on_expiry()

        self._deadline = self.clock.callLater(seconds, expire)

    def on_end(self, callback: Callable[[], None]) -> None:
        """
        Call ``callback`` once the stream is over (ended, or the client
        left); at once when it is over already.
        """
        if self.ended:
            callback()
        else:
            self._end_hooks.append(callback)

    def _write(self, data: bytes) -> None:
        if self.call.closed or self.ended:
            return
        self.call.bytes_out += len(data)
        self.request.write(data)

    def register_producer(
        self,
        pause: Callable[[], None],
        resume: Callable[[], None],
        patience: float | None = None,
        too_long: Callable[[float], ApiError] | None = None,
    ) -> None:
        """
        Let a client that reads slowly pause what feeds the stream.

        :param patience: how long the source may stay paused for a client
            that takes nothing, as envd's programs wait on backpressure:
            the connection is not cut as stalled meanwhile, and past it
            the stream ends with ``too_long(patience)``.  None: the HTTP
            front's bound on a stalled client (``--idle-timeout``) applies.
        """

        def paused() -> None:
            if patience is not None and too_long is not None and self._unread is None:
                self._unread = self.clock.callLater(
                    patience, lambda: self._waited(too_long(patience))
                )
            pause()

        def resumed() -> None:
            self._stop_waiting()
            resume()

        self._producer = Pauser(paused, resumed)
        if patience is not None:
            self.request.patient = lambda: self._unread is not None
        self.request.registerProducer(self._producer, True)

    def register_follower(
        self,
        patience: float,
        behind: int,
        dropped: Callable[[str], ApiError],
    ) -> None:
        """
        Let a client that reads slowly fall behind a source it never
        pauses (a follower of a program someone else started: pausing the
        program would stop it for everyone), within two bounds: a client
        that takes nothing at all for ``patience`` seconds, or that has
        ``behind`` bytes waiting for it, is dropped, its stream ended with
        ``dropped(why)``.  What the kernel says the client acknowledged
        (:mod:`sandboxd.web.delivery`) tells a slow client from one that
        takes nothing.
        """
        self._lag_bounds = (patience, behind, dropped)
        self._producer = Pauser(self._lag_started, self._lag_over)
        self.request.registerProducer(self._producer, True)

    def _transport(self) -> Any:
        channel = self.request.channel
        return channel.transport if channel is not None else None

    def _lag_started(self) -> None:
        if self._lagging or self._lag_bounds is None:
            return
        self._lagging = True
        self._behind = 0
        self._lag_seen = delivery(self._transport())
        self._lag_timer = self.clock.callLater(self._lag_bounds[0], self._lag_look)

    def _lag_over(self) -> None:
        self._lagging = False
        self._behind = 0
        timer, self._lag_timer = self._lag_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _lag_look(self) -> None:
        """The follower's bound on taking nothing is over: took it any?"""
        self._lag_timer = None
        if self.ended or self._lag_bounds is None:
            return
        patience, _, dropped = self._lag_bounds
        now = delivery(self._transport())
        before = self._lag_seen
        if before is not None and now is not None and not stalled(before, now):
            self._lag_seen = now
            self._lag_timer = self.clock.callLater(patience, self._lag_look)
            return
        self._lag_over()
        self.end(dropped(f"took none of the output for {patience:g} seconds"))

    def _lag_grew(self, size: int) -> None:
        """``size`` more bytes wait for a lagging follower."""
        assert self._lag_bounds is not None
        _, behind, dropped = self._lag_bounds
        self._behind += size
        if self._behind <= behind:
            return
        # The count of bytes sent since the pause overstates a client that
        # is taking some: ask what really waits for it.
        now = delivery(self._transport())
        waiting = now.waiting if now is not None else self._behind
        if waiting <= behind:
            self._behind = waiting
            return
        self._lag_over()
        self.end(dropped(f"fell more than {behind} bytes behind the output"))

    def _waited(self, error: ApiError) -> None:
        """The client read nothing for the whole bound: the stream ends."""
        self._unread = None
        self.end(error)

    def _stop_waiting(self) -> None:
        timer, self._unread = self._unread, None
        if timer is not None and timer.active():
            timer.cancel()

    def _stop(self) -> None:
        self._stop_waiting()
        self._lag_over()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            if self.request.channel is not None:
                self.request.unregisterProducer()
            producer.resume()
        for timer in (self._timer, self._deadline):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._deadline = None
        hooks, self._end_hooks = self._end_hooks, []
        run_each(hooks, "sandboxd: e2b stream cleanup failed")

    def send(self, message: dict[str, Any]) -> None:
        """One response message."""
        data = connect.envelope(message)
        self._write(data)
        if self._lagging and not self.ended:
            self._lag_grew(len(data))
        self._arm()

    def end(self, error: ApiError | None = None) -> None:
        """The end-of-stream message, then the response is over (idempotent)."""
        if self.ended:
            return
        if error is not None and self.call.error is None:
            self.call.error = error
        if not self.call.closed:
            self._write(connect.end_stream(error))
        self.ended = True
        self._stop()
        if not self.call.closed:
            self.request.finish()
        self.call.done()


# -- client streams, live ------------------------------------------------------


class Feeder(Protocol):
    """What a live client stream's procedure returns for its next messages."""

    def message(self, message: dict[str, Any]) -> None:
        """Apply one message (in order, as it arrives)."""

    def waiting(self) -> bool:
        """Whether it cannot take more now: the client is not read meanwhile."""

    def alive(self) -> bool:
        """Whether what it feeds is still there (its client may be quiet)."""

    def end(self) -> Any:
        """The client's stream ended: the response message."""


class LiveInput:
    """
    A live client stream's body (``StreamInput``), read as it arrives, as
    envd reads it: each whole envelope is taken off at once, the first
    admits the call as the endpoint it maps to and starts its
    :class:`Feeder`, and every next one is applied in order.  Each message
    is bounded (:data:`E2B_MAX_MESSAGE_BYTES`), the stream is not.  While
    the feeder cannot take more (a process that is not reading its stdin)
    the client's socket is not read, so its input waits in the client.
    """

    def __init__(self, door: Door, call: Call) -> None:
        self.door = door
        self.call = call
        self.buffer = bytearray()
        self.feeder: Feeder | None = None
        #: The end-of-stream envelope was read: what follows is dropped.
        self.ended = False
        self.paused = False
        self._check: Any = None
        self._ending = False
        live = call.request.live
        live.feed = self.feed
        live.end = self.drain
        call.request.patient = self.patient
        call.on_close(self._stop)

    def patient(self) -> bool:
        """A started stream may be quiet while its process runs."""
        return (
            self.feeder is not None and not self.call.finished and self.feeder.alive()
        )

    def feed(self, data: bytes) -> None:
        """Body bytes arrived."""
        self.call.bytes_in += len(data)
        if not self.ended:
            self.buffer += data
        self.drain()

    def drain(self) -> None:
        """Apply every whole message the feeder can take now; end once all is in."""
        self._cancel_check()
        if self.call.finished or self._ending:
            return
        try:
            while True:
                if self.feeder is not None and self.feeder.waiting():
                    self._pause()
                    return
                taken = (
                    None
                    if self.ended
                    else connect.next_envelope(self.buffer, E2B_MAX_MESSAGE_BYTES)
                )
                if taken is None:
                    break
                flags, message = taken
                if flags & connect.FLAG_END_STREAM:
                    self.ended = True
                    self.buffer.clear()
                    break
                self._apply(message)
                if self.call.finished:
                    return
            self._resume()
            live = self.call.request.live
            if live is not None and live.complete:
                self._end()
        except ApiError as e:
            self._fail(e)
        except Exception as e:
            refused = exhausted(e)
            if refused is None:
                log.failure("sandboxd: e2b live stream failed")
            self._fail(refused or internal("the call failed"))

    def _apply(self, message: dict[str, Any]) -> None:
        if self.feeder is None:
            self.door.admit_endpoint(self.call, message)
            self.feeder = self.call.procedure.run(self.call, message)
            self.call.hold(self._fail)
        else:
            self.feeder.message(message)

    def _end(self) -> None:
        if self.buffer:
            raise connect.malformed("a truncated Connect envelope")
        if self.feeder is None:
            raise bad_request("the input stream must begin with a 'start' message")
        self._ending = True
        value = self.feeder.end()
        self._stop()
        self.door.succeed(self.call, value)

    def _fail(self, error: ApiError) -> None:
        self._stop()
        self.buffer.clear()
        self.ended = True
        self.door.fail(self.call, error)

    def _pause(self) -> None:
        live = self.call.request.live
        transport = self.call.request.channel.transport
        if not self.paused and live is not None and not live.complete and transport:
            self.paused = True
            transport.pauseProducing()
        self._check = self.call.context.reactor.callLater(
            E2B_INPUT_RECHECK_SECONDS, self.drain
        )

    def _resume(self) -> None:
        if self.paused:
            self.paused = False
            transport = self.call.request.channel.transport
            if transport is not None:
                transport.resumeProducing()

    def _cancel_check(self) -> None:
        timer, self._check = self._check, None
        if timer is not None and timer.active():
            timer.cancel()

    def _stop(self) -> None:
        self._cancel_check()
        self._resume()


# -- the door -------------------------------------------------------------------


class Door(PortDoor):
    """
    envd's API through the gate: Connect procedures
    (``"package.Service/Method"``) and REST routes (``"METHOD /path"``).
    """

    name = "e2b"
    via = gate.Door.E2B
    endpoint_id = "e2b"
    call_class = Call
    #: The procedure of a path no procedure serves that is still answered
    #: for what it is (E2B's control-plane calls), or None: set by the
    #: service, since those calls' module builds on this one.
    fallback: Callable[[str], Procedure | None] | None = None

    def body_cap(self, path: bytes) -> int:
        """The body cap of a request to ``path`` (uploads: ``max_bytes``)."""
        if path.rstrip(b"/") == b"/files":
            limit = self.context.policy.rules["files_write_raw"].limits.max_bytes
            # Multipart framing adds a little to the file bytes.
            return int(limit or 100 * MIB) + MIB
        return E2B_MAX_MESSAGE_BYTES * 4 + 64 * 1024

    def paced_by_its_source(self, method: bytes, path: bytes) -> bool:
        """
        A streamed upload (``files.write`` of an iterable) comes as its
        client's source gives it: envd bounds a stalled one on each read,
        not a slow one, and so does this door (``--idle-timeout``).
        """
        return method == b"POST" and path.rstrip(b"/") == b"/files"

    def find(self, request: Any) -> Procedure | None:
        """A Connect procedure by its path, a REST route by method and path."""
        return self._route(request.method, request.path)

    def _route(self, method: bytes, path: bytes) -> Procedure | None:
        where = path.decode("latin-1")
        verb = method.decode("latin-1")
        if verb == "POST" and procedure_path(where):
            return self.procedures.get(where.lstrip("/"))
        key = f"{verb} {where.rstrip('/') or '/'}"
        return self.procedures.get(key) or self.procedures.get(_templated(key))

    def check_head(
        self, method: bytes, path: bytes, headers: dict[bytes, list[bytes]]
    ) -> ApiError | None:
        """
        The credential (E2B's as :meth:`admit` takes them: ``X-API-Key`` on
        a control-plane call, ``E2B-Traffic-Access-Token``), the door's
        scopes and those of the endpoint a route is governed as (when the
        path alone names it; ``Start`` picks its own from its message),
        from the head: an upload's body is neither read nor spooled for a
        caller who would be refused.  A route that needs no credential
        (``/health``) is left to its call, as :meth:`_admit_door` leaves it.
        """
        procedure = self._route(method, path)
        if procedure is None and self.fallback is not None:
            procedure = self.fallback(path.decode("latin-1", "replace")[:200])
        endpoint_ids = [self.endpoint_id]
        if procedure is not None and isinstance(procedure.endpoint, str):
            mapped = self.context.table.get(procedure.endpoint)
            if not mapped.auth_required:
                return None
            if mapped.id != self.endpoint_id:
                endpoint_ids.append(mapped.id)
        presented = dict(headers)
        if procedure is not None and procedure.api_key:
            present_api_key(presented)
        try:
            for endpoint_id in endpoint_ids:
                gate.check_head(
                    self.context,
                    self.context.table.get(endpoint_id),
                    presented,
                    query_tokens=traffic_tokens(presented),
                )
        except ApiError as e:
            return e
        return None

    def unknown(self, request: Any) -> Procedure:
        """
        ``unimplemented``, as a stream when the client asked for one; a
        control-plane call of E2B's cloud API that is not served is
        refused as such, with the SDK's API key taken as the token (not
        401 for a key the SDK sends only there).
        """
        name = request.path.decode("latin-1", "replace")[:200]
        if self.fallback is not None:
            found = self.fallback(name)
            if found is not None:
                return found
        content_type = request.getHeader(b"content-type") or b""
        streaming = content_type.startswith(b"application/connect+")
        return Procedure(
            name,
            SERVER_STREAM if streaming else UNARY,
            "e2b",
            _unknown,
        )

    def refusal(
        self, error: ApiError, path: str, accept: bytes | None
    ) -> tuple[bytes, bytes, dict[str, str]]:
        """
        A request the HTTP front refused, in the framing its client reads
        (the status unchanged): a Connect error on a procedure's path (the
        SDK's Connect client reads ``code`` as a Connect code, and takes
        any other string for an unreachable sandbox), envd's REST error
        elsewhere and when no path was read (the SDK reads ``message``).
        """
        if procedure_path(path):
            body: dict[str, Any] = connect.error_json(error)
        else:
            body = rest_error(error)
        return b"application/json", json.dumps(body).encode(), dict(error.headers)

    def live(self, path: bytes) -> bool:
        """A client stream whose messages are applied as they arrive (envd's)."""
        if not procedure_path(path.decode("latin-1")):
            return False
        procedure = self.procedures.get(path.decode("latin-1").lstrip("/"))
        return procedure is not None and procedure.live

    def begin_live(self, call: portdoor.Call) -> None:
        """Read the call's stream as it comes (:class:`LiveInput`)."""
        assert isinstance(call, Call)
        LiveInput(self, call)

    def succeed(self, call: portdoor.Call, value: Any) -> None:
        """Answer a call that ended late (a live stream) with ``value``."""
        self._succeed(call, value)

    def prepare(self, call: portdoor.Call) -> None:
        """A Connect call's codec, before anything is read."""
        if call.procedure.run is not _unknown:
            check_content_type(
                call.procedure.kind, call.request.getHeader(b"content-type")
            )

    def admit(
        self, call: portdoor.Call, endpoint: Any, spend: bool = True
    ) -> gate.Passed:
        """The gate, with E2B's ``X-API-Key`` and traffic tokens as credentials."""
        if call.procedure.api_key:
            present_api_key(call.headers)
        return gate.admit(
            self.context,
            endpoint,
            call.headers,
            query_tokens=traffic_tokens(call.headers),
            spend=spend,
        )

    def read_message(
        self, call: portdoor.Call
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A Connect call's message(s), a JSON route's object."""
        procedure = call.procedure
        request = call.request
        message: dict[str, Any] = {}
        messages: list[dict[str, Any]] = []
        if procedure.kind in (UNARY, SERVER_STREAM, CLIENT_STREAM):
            body = request.content.read() if request.content is not None else b""
            if procedure.kind == UNARY:
                if len(body) > E2B_MAX_MESSAGE_BYTES:
                    raise payload_too_large(
                        E2B_MAX_MESSAGE_BYTES, f"a Connect message of {len(body)} bytes"
                    )
                message = connect.decode_json(body)
            else:
                messages = connect.split_envelopes(body, E2B_MAX_MESSAGE_BYTES)
                message = messages[0] if messages else {}
        elif procedure.fields is not None:
            message = rest_body(request.content, procedure.fields)
        return message, messages

    def encode(self, call: portdoor.Call, value: Any) -> tuple[bytes, bytes]:
        """The body of a call's successful answer, by the procedure's kind."""
        kind = call.procedure.kind
        content_type = {
            REST: b"application/json",
            CLIENT_STREAM: connect.STREAM_CONTENT_TYPE.encode(),
        }.get(kind, connect.UNARY_CONTENT_TYPE.encode())
        return content_type, _encoded(kind, value)

    def error_response(
        self, call: portdoor.Call, error: ApiError
    ) -> tuple[int, bytes, bytes, dict[str, str]]:
        """
        envd's REST error, the end-of-stream message of a stream (200), or
        a unary call's Connect error.
        """
        kind = call.procedure.kind
        if kind == REST:
            status = error.status
            body = json.dumps(rest_error(error)).encode()
            content_type = b"application/json"
        elif kind in (SERVER_STREAM, CLIENT_STREAM):
            status = 200
            body = connect.end_stream(error)
            content_type = connect.STREAM_CONTENT_TYPE.encode()
        else:
            code = connect.connect_code(error)
            status = connect.HTTP_STATUS[code]
            body = json.dumps(connect.error_json(error)).encode()
            content_type = b"application/json"
        if error.status == UNSUPPORTED_MEDIA_TYPE:
            # Before any message is read, whatever the call's kind: the
            # Connect protocol answers a codec it does not take with 415.
            status = UNSUPPORTED_MEDIA_TYPE
            body = json.dumps(connect.error_json(error)).encode()
            content_type = b"application/json"
        return status, content_type, body, {}


UNSUPPORTED_MEDIA_TYPE = 415

#: The Content-Type of a Connect call's body, by kind (the JSON codec only).
CONTENT_TYPES = {
    UNARY: connect.UNARY_CONTENT_TYPE,
    SERVER_STREAM: connect.STREAM_CONTENT_TYPE,
    CLIENT_STREAM: connect.STREAM_CONTENT_TYPE,
}


#: A call's answer: a non-finite number raises ValueError (it has no JSON form).
_STRICT = json.JSONEncoder(allow_nan=False)
_STRICT_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encoded(kind: str, value: Any) -> bytes:
    """The body of a call's successful answer, by the procedure's kind."""
    if kind == REST:
        return _STRICT.encode(value).encode()
    if kind == CLIENT_STREAM:
        return connect.envelope(value) + connect.end_stream()
    return _STRICT_COMPACT.encode(value).encode()


def procedure_path(path: str) -> bool:
    """Whether ``path`` names a Connect procedure (``/package.Service/Method``)."""
    return path.count("/") == 2 and "." in path


def rest_error(error: ApiError) -> dict[str, Any]:
    """
    envd's REST error (its OpenAPI ``Error``): the HTTP status as ``code``,
    the message with sandboxd's code and rule.
    """
    return {"code": error.status, "message": connect.error_message(error)}


def traffic_tokens(headers: dict[bytes, list[bytes]]) -> list[bytes]:
    """
    The tokens E2B's SDKs send as ``E2B-Traffic-Access-Token`` (alone on
    ``/contexts*``): on this door it presents a token as X-Access-Token does.
    """
    return headers.get(b"e2b-traffic-access-token", [])


def present_api_key(headers: dict[bytes, list[bytes]]) -> None:
    """
    Take E2B's ``X-API-Key`` as the access token when no other credential
    is given: what the SDK sends its control plane, where sandboxd is the
    control plane too.
    """
    if b"x-access-token" not in headers and b"authorization" not in headers:
        key = headers.get(b"x-api-key")
        if key:
            headers[b"x-access-token"] = list(key)


def rest_body(content: Any, fields: tuple[Field, ...]) -> dict[str, Any]:
    """
    A JSON route's body, read as strictly as every other door reads one
    and checked against the fields it reads.

    :raises ApiError: 400 ``invalid_json`` for a body that is no JSON
        object, ``invalid_param`` for a field of another type.
    """
    raw = content.read() if content is not None else b""
    message = connect.decode_json(raw)
    declared_types(message, fields)
    return message


def check_content_type(kind: str, value: bytes | None) -> None:
    """
    Refuse a Connect call whose body is not in the codec its kind takes
    (a unary call's ``application/json``, a stream's
    ``application/connect+json``; a ``charset`` parameter only as UTF-8).

    A form, multipart or ``text/plain`` body is what a web page may send
    to a local port without asking first; it is never executed.

    :raises ApiError: 415 ``malformed_request`` naming the type wanted.
    """
    wanted = CONTENT_TYPES.get(kind)
    if wanted is None:
        return  # a REST route: its handler reads the Content-Type
    text = (value or b"").decode("latin-1")
    media, _, parameters = text.partition(";")
    ok = media.strip().lower() == wanted
    for parameter in parameters.split(";") if parameters.strip() else ():
        name, _, given = parameter.partition("=")
        if name.strip().lower() != "charset":
            ok = False
        elif given.strip().strip('"').lower() not in ("utf-8", "utf8"):
            ok = False
    if not ok:
        error = malformed_request(
            f"this call takes Content-Type {wanted}, not {text[:100]!r}",
            UNSUPPORTED_MEDIA_TYPE,
        )
        error.headers["Accept-Post"] = wanted
        raise error


def _templated(key: str) -> str:
    """
    ``POST /contexts/ID/restart`` as its route, ``POST /contexts/{id}/restart``;
    ``GET /code/contexts/ID/outputs/OID`` as ``GET /code/contexts/{id}/outputs/{oid}``.
    """
    method, _, path = key.partition(" ")
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "contexts" and parts[2]:
        parts[2] = "{id}"
    elif (
        len(parts) == 6
        and parts[1:3] == ["code", "contexts"]
        and parts[4] == "outputs"
        and parts[3]
        and parts[5]
    ):
        parts[3], parts[5] = "{id}", "{oid}"
    return f"{method} {'/'.join(parts)}"


def _unknown(call: Call, message: dict[str, Any], *rest: Any) -> Any:
    raise unsupported(f"no such procedure: {call.procedure.name}")


__all__ = [
    "CLIENT_STREAM",
    "REST",
    "SERVER_STREAM",
    "UNARY",
    "Call",
    "Door",
    "E2BSite",
    "Procedure",
    "Stream",
    "basic_user",
    "raw_headers",
]
