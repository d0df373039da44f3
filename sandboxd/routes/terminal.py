# -*- test-case-name: tests.routes.test_terminal -*-
"""
Handlers of the ``terminal`` group (SPEC §7.5); the sessions and the PTY
port they are attached through belong to
:class:`~sandboxd.terminals.service.TerminalService`.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.access.audit import make_record, should_record
from sandboxd.access.gate import host_name
from sandboxd.access.guard import PathGuard
from sandboxd.daemon.proxies import forwarded, pty_url
from sandboxd.errors import (
    RESOURCE_ERRNOS,
    ApiError,
    Code,
    bad_request,
    internal,
    limit_exceeded,
    limit_rule,
    not_found,
    out_of_resources,
)
from sandboxd.policy.confinement import confinement_of
from sandboxd.policy.defaults import ENDPOINT_LIMITS, identity_cap
from sandboxd.processes.command import resolve_user, terminal_shell_refusal
from sandboxd.processes.environment import child_environment, note_argv, validate_env
from sandboxd.terminals.service import TERM, TerminalService, choose_shell
from sandboxd.terminals.session import PtySession, SpawnRequest
from sandboxd.terminals.table import ShareTaken, TooManySessions
from sandboxd.web.messages import ServerRequest
from sandboxd.web.params import dimension

_DEFAULTS = ENDPOINT_LIMITS["pty_create_session"]


def _service(request: ServerRequest) -> TerminalService:
    service = request.context.terminals
    assert service is not None
    return service


#: A Host header a URL can be built from (RFC 9110 §7.2: a name or an
#: address, and a port): ``/``, ``?``, ``#``, ``@`` and the like would make
#: the ``ws_url`` handed out point somewhere else, or nowhere.
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]*)(:[0-9]{0,5})?")


def _url_host(request: ServerRequest) -> str:
    """
    The Host header's name, for a ``ws_url``.

    :raises ApiError: 400 ``invalid_param`` for a Host no URL can carry
        (asked before anything is started, so the refusal leaves nothing).
    """
    value = request.headers.get("host", "").strip()
    if not _HOST.fullmatch(value):
        raise bad_request("the Host header is not a host name or address")
    return host_name(value)


def _ws_url(request: ServerRequest, session_id: str) -> str:
    """The terminal's URL as the client reaches it (SPEC §20)."""
    context = request.context
    document = context.policy.document
    scheme = "wss" if (context.pty_listen or "").startswith(("ssl:", "tls:")) else "ws"
    return pty_url(
        context.pty_public_url or document.pty_public_url,
        scheme,
        _url_host(request) or "127.0.0.1",
        context.pty_port,
        session_id,
        forwarded(request.headers, request.client, document.trusted_proxies),
    )


def visible(request: ServerRequest, session: PtySession) -> bool:
    """Whether the caller may see ``session``: its owner, or ``*``."""
    return session.usable_by(request.identity)


def _session(request: ServerRequest) -> PtySession:
    session_id = request.path_params["id"]
    session = _service(request).table.get(session_id)
    if session is None or not visible(request, session):
        raise not_found(f"Session not found: {session_id}")
    return session


def pty_create_session(request: ServerRequest) -> dict[str, Any]:
    """``POST /pty/sessions``: start a shell on a pre-sized PTY."""
    body, rule, context = request.body, request.rule, request.context
    _url_host(request)  # refused before the shell starts, not after
    cols = dimension(body.get("cols", 80), "cols")
    rows = dimension(body.get("rows", 24), "rows")
    extra = validate_env(body.get("env"))
    run_as = resolve_user(body.get("user"), rule)
    cwd = PathGuard(rule).cwd(body.get("cwd"))
    env = child_environment(context, rule, {"TERM": TERM, **extra})
    if run_as is not None:
        run_as.apply(env)
    try:
        name, path = choose_shell(body.get("shell"), env, rule)
    except ApiError as e:
        raise terminal_shell_refusal(e, rule) from None
    note_argv(request, [path], extra)
    spec = SpawnRequest(
        path,
        [name],
        env,
        cwd,
        cols,
        rows,
        run_as,
        confinement_of(rule, env.get("HOME")),
    )
    session = open_session(request, spec)
    return {
        "session_id": session.id,
        "ws_url": _ws_url(request, session.id),
        "pid": session.pid,
    }


def open_session(
    request: ServerRequest, spec: SpawnRequest, via: str = "http"
) -> PtySession:
    """
    Start ``spec`` on a terminal of the caller's, within the endpoint's
    ``max_sessions`` (and the caller's share of it, ``max_per_identity``),
    idle and duration bounds, audited when it ends (the
    terminal routes' own, and a door's that runs a command on a PTY).

    :raises ApiError: 429 ``too_many_sessions``, 503 when out of
        descriptors or processes, 500 when the PTY cannot be opened.
    """
    limits = request.rule.limits
    total = limits.max_sessions or _DEFAULTS["max_sessions"]
    mine = identity_cap(
        total, len(request.context.policy.tokens.ids()), limits.max_per_identity
    )
    try:
        session = _service(request).table.create(
            # A link's terminal is its minter's: its share, and the minter's
            # to attach to and close.
            request.identity.root,
            spec,
            total,
            limits.idle_timeout_seconds,
            mine=mine,
        )
    except ShareTaken as e:
        raise limit_exceeded(
            429,
            f"you have {e.args[0]} PTY sessions open, your share of {total} "
            "(max_per_identity); close one first",
            Code.TOO_MANY_SESSIONS,
            rule=limit_rule(request.rule, "max_per_identity"),
            type="RuntimeError",
            limit=e.args[0],
            **_retry(_service(request).table.next_lapse(request.identity.root)),
        ) from None
    except TooManySessions as e:
        raise limit_exceeded(
            429,
            f"Maximum number of PTY sessions ({e.args[0]}) reached",
            Code.TOO_MANY_SESSIONS,
            rule=limit_rule(request.rule, "max_sessions"),
            type="RuntimeError",
            limit=e.args[0],
            **_retry(_service(request).table.next_lapse()),
        ) from None
    except OSError as e:
        if e.errno in RESOURCE_ERRNOS:
            raise out_of_resources(e, "cannot start a terminal now") from None
        raise internal(f"Failed to create PTY: {e.strerror or e}", "OSError") from None
    request.audit["session_id"] = session.id
    _bound_duration(request, session)
    opened = time.monotonic()
    session.when_ended().addCallback(
        lambda _: _audit_closed(request, session, opened, via)
    )
    return session


def _retry(lapse: float | None) -> dict[str, Any]:
    """
    ``Retry-After`` (header and field) of a refusal at the bound, when an
    unattended terminal's idle timeout will free a place: a second more
    than its lapse, for its shell's tree to end.  Nothing when none will.
    """
    if lapse is None:
        return {}
    seconds = math.ceil(lapse) + 1
    return {"headers": {"Retry-After": str(seconds)}, "retry_after": seconds}


def _bound_duration(request: ServerRequest, session: PtySession) -> None:
    """
    ``limits.max_duration_seconds``: the session is closed (its shell's
    tree ended) once it has run that long, attached or not.
    """
    ceiling = request.rule.limits.max_duration_seconds
    if ceiling is None:
        return
    table = _service(request).table
    timer = request.context.reactor.callLater(ceiling, table.close, session.id)

    def ended(_: object) -> None:
        if timer.active():
            timer.cancel()

    session.when_ended().addCallback(ended)


def _audit_closed(
    request: ServerRequest, session: PtySession, opened: float, via: str
) -> None:
    """
    The second audit record of a terminal (SPEC §20): when it ended, how
    long it ran and how many bytes went each way.
    """
    if not should_record(request.rule.audit, 200):
        return
    record = make_record(
        identity=request.identity.id,
        endpoint="pty_create_session",
        method="CLOSE",
        path=f"/pty/sessions/{session.id}",
        query="",
        status=200,
        code=None,
        rule=None,
        started=opened,
        bytes_in=session.bytes_in,
        bytes_out=session.scrollback.end,
        client=request.client,
    )
    record.update(
        via=via,
        event="pty_closed",
        session_id=session.id,
        exit_code=session.exit_code,
        argv=request.audit.get("argv"),
    )
    request.context.audit.write(record)


def pty_list_sessions(request: ServerRequest) -> dict[str, Any]:
    """``GET /pty/sessions``: dead sessions are reaped first."""
    table = _service(request).table
    table.reap()
    return {
        "sessions": [
            _describe(request, s)
            for s in table.sessions.values()
            if visible(request, s)
        ]
    }


def _describe(request: ServerRequest, session: PtySession) -> dict[str, Any]:
    """
    A session's JSON (SPEC §7.5) with the ``ws_url`` to attach to it, so a
    client reattaching to a session it did not create learns where the PTY
    port is as the creator did (a proxy or port mapping included).
    """
    return {**session.describe(), "ws_url": _ws_url(request, session.id)}


def pty_detail(request: ServerRequest) -> dict[str, Any]:
    """``GET /pty/sessions/{id}``."""
    return _describe(request, _session(request))


def pty_resize(request: ServerRequest) -> dict[str, Any]:
    """``POST /pty/sessions/{id}/resize {"cols", "rows"}``."""
    session = _session(request)
    if "cols" not in request.body or "rows" not in request.body:
        raise bad_request("'cols' and 'rows' are required")
    cols = dimension(request.body.get("cols", session.cols), "cols")
    rows = dimension(request.body.get("rows", session.rows), "rows")
    try:
        session.resize(cols, rows)
    except OSError as e:
        raise internal(f"Failed to resize: {e.strerror or e}", "OSError") from None
    return _describe(request, session)


def pty_delete_session(request: ServerRequest) -> Deferred[dict[str, Any]]:
    """``DELETE /pty/sessions/{id}``: ends the whole session, then answers."""
    session = _session(request)
    closing = _service(request).table.close(session.id)
    assert closing is not None
    return closing.addCallback(lambda _: {"status": "closed", "session_id": session.id})


HANDLERS: dict[str, Any] = {
    "pty_create_session": pty_create_session,
    "pty_list_sessions": pty_list_sessions,
    "pty_detail": pty_detail,
    "pty_resize": pty_resize,
    "pty_delete_session": pty_delete_session,
}
