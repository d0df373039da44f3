# -*- test-case-name: tests.test_terminal -*-
"""
Handlers of the ``terminal`` group (SPEC §7.5) and its service: the
session table plus the WebSocket listener on the PTY port (SPEC §8).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger

from sandboxd.errors import ApiError, bad_request, forbidden, not_found
from sandboxd.gate import host_name, is_loopback
from sandboxd.guard import PathGuard
from sandboxd.policy.defaults import KILL_GRACE_SECONDS
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import find_executable, resolve_user
from sandboxd.processes.environment import child_environment, validate_env
from sandboxd.terminals.session import (
    MAX_DIMENSION,
    PtySession,
    SpawnRequest,
    TerminalTable,
    TooManySessions,
)
from sandboxd.terminals.websocket import PtyServerFactory
from sandboxd.web.messages import ServerRequest

log = Logger(namespace="sandboxd.terminal")

TERM = "xterm-256color"


class TerminalService(Service):
    """
    The terminal sessions and the PTY WebSocket port.

    Stopping it stops listening, closes every WebSocket (1001) and ends
    every session's whole process tree, within a bound.
    """

    name = "terminals"

    def __init__(self, context: Any, timers: bool = True) -> None:
        self.context = context
        self.table = TerminalTable(context.reactor)
        rule = context.policy.rules["pty_connect"]
        self.factory = PtyServerFactory(
            context,
            self.table,
            reactor=context.reactor,
            timers=timers,
            max_message_bytes=rule.limits.max_message_bytes,
        )
        self.port: Any = None
        self._listening: Deferred[Any] | None = None

    def startService(self) -> None:
        """Listen on the PTY port when ``pty_connect`` is enabled."""
        super().startService()  # type: ignore[no-untyped-call]
        context = self.context
        if not context.policy.rules["pty_connect"].enabled or not context.pty_listen:
            return
        endpoint = serverFromString(context.reactor, context.pty_listen)
        self._listening = endpoint.listen(self.factory)
        self._listening.addCallbacks(self._listened, self._failed)

    def _listened(self, port: Any) -> None:
        self.port = port
        address = port.getHost()
        if hasattr(address, "port"):
            self.context.pty_port = address.port
        host = getattr(address, "host", "unix")
        if (
            self.context.policy.tokens.local_mode
            and host != "unix"
            and not is_loopback(host)
        ):
            log.warn(
                "sandboxd: NO TOKEN is configured and the terminal port listens on "
                "{host}: anyone who can reach it gets a shell. Set "
                "ABX_SERVER_TOKEN(_FILE) or policy auth.tokens.",
                host=host,
            )

    def _failed(self, failure: Any) -> None:
        log.failure(
            "sandboxd: cannot listen on the PTY port {port}",
            failure,
            port=self.context.pty_listen,
        )

    def stopService(self) -> Deferred[Any]:
        """Stop listening, close every client, end every session."""
        super().stopService()  # type: ignore[no-untyped-call]
        stopping = []
        if self.port is not None:
            stopping.append(maybeDeferred(self.port.stopListening))
            self.port = None
        self.factory.close_all()
        stopping.extend(self.table.close_all())
        d: Deferred[Any] = DeferredList(stopping, consumeErrors=True)
        d.addTimeout(KILL_GRACE_SECONDS + 2, self.context.reactor)
        d.addErrback(
            lambda f: log.warn(
                "sandboxd: terminals did not all end: {f}", f=f.getErrorMessage()
            )
        )
        return d


def setup(context: Any) -> TerminalService:
    """Create the terminal service (``context.services["terminals"]``)."""
    service = TerminalService(context)
    context.services["terminals"] = service
    return service


def _service(request: ServerRequest) -> TerminalService:
    service: TerminalService = request.context.services["terminals"]
    return service


def _dimension(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer")
    if not 1 <= value <= MAX_DIMENSION:
        raise bad_request(f"'{name}' must be between 1 and {MAX_DIMENSION}")
    return value


def _shell(requested: Any, env: dict[str, str], rule: EffectiveRule) -> tuple[str, str]:
    """The shell's name and absolute path: the requested one, else ``$SHELL``,
    bash or sh, whichever the policy allows and the child's PATH has."""
    allowed = rule.params.shells
    if requested is not None:
        if not isinstance(requested, str) or not requested or "\x00" in requested:
            raise bad_request("'shell' must be a shell name or path")
        name = os.path.basename(requested)
        if name not in allowed:
            raise forbidden(
                f"the shell {requested!r} is not allowed (allowed: {', '.join(allowed)})",
                "param_not_allowed",
                rule=rule.source("params.shells") or "default:params.shells",
            )
        path = find_executable(requested, env)
        if path is None:
            raise bad_request(f"shell not found: {requested}")
        return name, path
    candidates = [env.get("SHELL", ""), "bash", "sh", *allowed]
    for candidate in candidates:
        if candidate and os.path.basename(candidate) in allowed:
            path = find_executable(candidate, env)
            if path is not None:
                return os.path.basename(candidate), path
    raise ApiError(500, "no allowed shell was found on PATH", "OSError", "internal")


def _ws_url(request: ServerRequest, session_id: str) -> str:
    context = request.context
    scheme = "wss" if (context.pty_listen or "").startswith(("ssl:", "tls:")) else "ws"
    name = host_name(request.headers.get("host", "")) or "127.0.0.1"
    if ":" in name:
        name = f"[{name}]"
    port = f":{context.pty_port}" if context.pty_port else ""
    return f"{scheme}://{name}{port}/pty?session_id={session_id}"


def _visible(request: ServerRequest, session: PtySession) -> bool:
    identity = request.identity
    return identity.id == session.owner or identity.has_scope("*")


def _session(request: ServerRequest) -> PtySession:
    session_id = request.path_params["id"]
    session = _service(request).table.get(session_id)
    if session is None or not _visible(request, session):
        raise not_found(f"Session not found: {session_id}")
    return session


def pty_create(request: ServerRequest) -> dict[str, Any]:
    """``POST /pty/sessions``: start a shell on a pre-sized PTY."""
    body, rule, context = request.body, request.rule, request.context
    cols = _dimension(body, "cols", 80)
    rows = _dimension(body, "rows", 24)
    extra = validate_env(body.get("env"))
    run_as = resolve_user(body.get("user"), rule)
    cwd = PathGuard(rule).cwd(body.get("cwd"))
    env = child_environment(context, rule, {"TERM": TERM, **extra})
    if run_as is not None:
        run_as.apply(env)
    name, path = _shell(body.get("shell"), env, rule)
    limits = rule.limits
    spec = SpawnRequest(path, [name], env, cwd, cols, rows, run_as)
    try:
        session = _service(request).table.create(
            request.identity.id,
            spec,
            limits.max_sessions or 10,
            limits.idle_timeout_seconds,
        )
    except TooManySessions as e:
        raise ApiError(
            429,
            f"Maximum number of PTY sessions ({e.args[0]}) reached",
            "RuntimeError",
            "too_many_sessions",
            limit=e.args[0],
            rule=rule.source("limits.max_sessions") or "default:limits.max_sessions",
        ) from None
    except OSError as e:
        raise ApiError(
            500, f"Failed to create PTY: {e.strerror or e}", "OSError", "internal"
        ) from None
    return {
        "session_id": session.id,
        "ws_url": _ws_url(request, session.id),
        "pid": session.pid,
    }


def pty_list(request: ServerRequest) -> dict[str, Any]:
    """``GET /pty/sessions``: dead sessions are reaped first."""
    table = _service(request).table
    table.reap()
    return {
        "sessions": [
            s.describe() for s in table.sessions.values() if _visible(request, s)
        ]
    }


def pty_get(request: ServerRequest) -> dict[str, Any]:
    """``GET /pty/sessions/{id}``."""
    return _session(request).describe()


def pty_resize(request: ServerRequest) -> dict[str, Any]:
    """``POST /pty/sessions/{id}/resize {"cols", "rows"}``."""
    session = _session(request)
    if "cols" not in request.body or "rows" not in request.body:
        raise bad_request("'cols' and 'rows' are required")
    cols = _dimension(request.body, "cols", session.cols)
    rows = _dimension(request.body, "rows", session.rows)
    try:
        session.resize(cols, rows)
    except OSError as e:
        raise ApiError(
            500, f"Failed to resize: {e.strerror or e}", "OSError", "internal"
        ) from None
    return session.describe()


def pty_delete(request: ServerRequest) -> Deferred[dict[str, Any]]:
    """``DELETE /pty/sessions/{id}``: ends the whole session, then answers."""
    session = _session(request)
    closing = _service(request).table.close(session.id)
    assert closing is not None
    return closing.addCallback(lambda _: {"status": "closed", "session_id": session.id})


HANDLERS: dict[str, Any] = {
    "pty_create": pty_create,
    "pty_list": pty_list,
    "pty_get": pty_get,
    "pty_resize": pty_resize,
    "pty_delete": pty_delete,
}
