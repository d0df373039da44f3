# -*- test-case-name: tests.lsp.test_lsp -*-
"""
Handlers of the ``lsp`` group: a file's diagnostics, definitions,
references, hover, symbols and completions, from a language server the
daemon starts for the file's project on the first question.

Positions are an agent's: lines and columns from 1, in characters (as
``files_grep`` gives them); what comes back names files by path.  Every
file named goes through the path guard: the one asked about is read
through it, and a location the server points to outside what the policy
lets the caller read is left out (counted in ``outside``), so a question
cannot show what a read could not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import attrs
from twisted.internet.defer import Deferred

from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    ApiError,
    bad_request,
    limit_setting,
    payload_too_large,
    policy_rule,
    unavailable,
    unsupported,
)
from sandboxd.lsp import answers, watched
from sandboxd.lsp import edits as workspace
from sandboxd.lsp.catalog import (
    SERVERS,
    SERVERS_BY_ID,
    ServerSpec,
    allowed_ids,
    language_of,
    servers_for,
)
from sandboxd.lsp.checks import EditorRules
from sandboxd.lsp.editor_socket import connect_editor
from sandboxd.lsp.relay import EditorRelay
from sandboxd.lsp.service import LspService
from sandboxd.lsp.session import LspSession
from sandboxd.lsp.sources import Source, placed, read_source, texts_now
from sandboxd.lsp.text import Text
from sandboxd.policy import defaults
from sandboxd.policy.confinement import confinement_of
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import RunAs, resolve_user
from sandboxd.processes.environment import child_environment
from sandboxd.web.messages import ServerRequest, ServerResponse, UpgradeResponse
from sandboxd.web.params import flag, integer, required, seconds, string
from sandboxd.web.websocket_server import asks_upgrade, valid_handshake


def service(request: ServerRequest) -> LspService:
    """The group's service."""
    lsp = request.context.lsp
    assert lsp is not None
    return lsp.get()


def limits_of(rule: EffectiveRule) -> dict[str, Any]:
    """The lsp limits of ``rule``, each falling back to the built-in default."""
    out = dict(defaults.LSP_LIMITS)
    for key in (*out, "max_per_identity"):
        value = getattr(rule.limits, key, None)
        if value is not None:
            out[key] = value
    return out


# -- the catalogue and sessions ------------------------------------------------


def lsp_servers(request: ServerRequest) -> dict[str, Any]:
    """Every server sandboxd knows, whether it is installed, whether allowed."""
    env = child_environment(request.context, request.rule)
    allowed = allowed_ids(request.rule.params.lsp_servers)
    return {"servers": [s.describe(env, s.id in allowed) for s in SERVERS]}


def lsp_sessions_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's sessions (every session for ``*``)."""
    return {
        "sessions": [s.describe() for s in service(request).visible(request.identity)]
    }


async def lsp_session_create(request: ServerRequest) -> ServerResponse:
    """
    ``POST /lsp/sessions {server? | language?, root?, user?}``: 201 once the
    server answered ``initialize``; 200 with the session already running
    for that server, root and user.
    """
    body = request.body
    specs = named_servers(request, body)
    root = PathGuard(request.rule).cwd(body.get("root"))
    run_as = resolve_user(body.get("user"), request.rule)
    existing = running(request, specs, root, run_as)
    session = await session_for(request, specs, root, run_as)
    return ServerResponse(status=200 if existing else 201, body=session.describe())


def lsp_session_get(request: ServerRequest) -> dict[str, Any]:
    """One session, with the server's last log messages."""
    session = service(request).get(request.path_params["lid"], request.identity)
    return {
        **session.describe(),
        "messages": list(session.messages),
        "stderr": session.stderr.tail_text(4000),
    }


async def lsp_session_delete(request: ServerRequest) -> dict[str, Any]:
    """Stop the server (``shutdown``, ``exit``, then its tree is ended)."""
    svc = service(request)
    session = svc.get(request.path_params["lid"], request.identity)
    await svc.remove(session)
    return {"id": session.id, "state": "closed"}


def lsp_connect(request: ServerRequest) -> UpgradeResponse:
    """
    ``GET /lsp/connect?server=|language=&root=&user=`` with ``Upgrade:
    websocket``: a language server of the editor's own, its JSON-RPC
    relayed one message per text frame, what the editor sends checked
    against the path rules first (:mod:`sandboxd.lsp.checks`).  Everything
    that can be refused is refused here, before the upgrade.
    """
    headers = request.headers
    if not asks_upgrade(headers):
        raise bad_request(
            "GET /lsp/connect is a WebSocket for editors: send the upgrade "
            "(Upgrade: websocket)"
        )
    if not valid_handshake(headers):
        raise bad_request(
            "invalid WebSocket handshake: Connection: Upgrade, a Sec-WebSocket-Key "
            "(16 bytes, base64) and Sec-WebSocket-Version: 13 are required"
        )
    query = request.query
    spec, argv = installed(request, named_servers(request, query))
    rule = request.rule
    guard = PathGuard(rule)
    root = guard.cwd(query.get("root"))
    run_as = resolve_user(query.get("user"), rule)
    limits = limits_of(rule)
    svc = service(request)
    svc.check_room(request.identity, limits)
    env = server_environment(request, run_as)
    rules = EditorRules(
        guard,
        root,
        rule.params.lsp_commands,
        policy_rule(rule, "params.lsp_commands"),
        rule.params.lsp_settings,
        policy_rule(rule, "params.lsp_settings"),
    )
    relay = EditorRelay(
        request.context.reactor,
        request.context.children,
        spec,
        request.identity.root,
        root,
        run_as,
        limits,
        rules,
        confinement_of(rule, env.get("HOME")),
    )
    request.audit["server"] = spec.id
    return UpgradeResponse(
        take_over=lambda raw: connect_editor(svc, relay, argv, env, raw)
    )


def named_servers(request: ServerRequest, fields: Any) -> list[ServerSpec]:
    """
    The servers a body or query names by ``server`` or ``language``
    (:func:`candidates`).

    :raises ApiError: 400 when it names neither.
    """
    server = string(fields.get("server"), "server", None)
    language = string(fields.get("language"), "language", None)
    if server is None and language is None:
        raise bad_request("name a 'server' or a 'language'")
    return candidates(request, language, server)


def candidates(
    request: ServerRequest, language: str | None, server: str | None
) -> list[ServerSpec]:
    """
    The server named, or the servers the policy allows for ``language`` in
    order of preference; nothing is looked for on disk.

    :raises ApiError: 400 unknown or disallowed server, or no server for
        the language.
    """
    rule = request.rule
    allowed = allowed_ids(rule.params.lsp_servers)
    where = policy_rule(rule, "params.lsp_servers")
    if server is not None:
        spec = SERVERS_BY_ID.get(server)
        if spec is None or server not in allowed:
            why = "is not a server sandboxd knows" if spec is None else "is not allowed"
            raise bad_request(
                f"the language server {server!r} {why} (allowed: {', '.join(allowed) or 'none'})",
                allowed=list(allowed),
                rule=where,
            )
        if language is not None and language not in spec.languages:
            # It would start, say nothing about the file, and the empty
            # answer would read as "no problems".
            raise bad_request(
                f"the language server {server!r} does not handle {language} "
                f"(it handles {', '.join(spec.languages)}): name another server, "
                "or the file's language",
                kind="wrong_language",
            )
        return [spec]
    assert language is not None
    specs = servers_for(language, rule.params.lsp_servers)
    if not specs:
        raise bad_request(
            f"no allowed language server for {language!r}",
            allowed=list(allowed),
            rule=where,
        )
    return specs


def installed(
    request: ServerRequest, specs: list[ServerSpec]
) -> tuple[ServerSpec, list[str]]:
    """
    The first of ``specs`` that is installed, with the argv that starts it.

    :raises ApiError: 503 ``unavailable`` when none is, saying how to
        install them.
    """
    env = child_environment(request.context, request.rule)
    for spec in specs:
        argv = spec.command(env)
        if argv is not None:
            return spec, argv
    hints = "; ".join(f"{s.id}: {s.install}" for s in specs)
    raise unavailable(f"no language server for this is installed ({hints})")


def server_environment(request: ServerRequest, run_as: RunAs | None) -> dict[str, str]:
    """A server's environment: the children's, without secrets, as ``run_as``."""
    env = child_environment(request.context, request.rule)
    if run_as is not None:
        run_as.apply(env)
    return env


def running(
    request: ServerRequest, specs: list[ServerSpec], root: str, run_as: RunAs | None
) -> LspSession | None:
    """
    The caller's running session of one of ``specs`` for ``root`` and
    ``run_as``, confined as the call's rule says.
    """
    svc = service(request)
    confine = None
    if request.rule.params.confine:
        home = server_environment(request, run_as).get("HOME")
        confine = confinement_of(request.rule, home)
    for spec in specs:
        session = svc.find(request.identity.root, spec, root, run_as, confine)
        if session is not None:
            return session
    return None


async def session_for(
    request: ServerRequest,
    specs: list[ServerSpec],
    root: str,
    run_as: RunAs | None,
) -> LspSession:
    """
    The running session of one of ``specs``, or a new one of the first
    installed (only then is the disk looked at); ready when it returns.
    """
    session = running(request, specs, root, run_as)
    if session is None:
        spec, argv = installed(request, specs)
        env = server_environment(request, run_as)
        session = service(request).open(
            request.identity,
            spec,
            argv,
            env,
            root,
            run_as,
            limits_of(request.rule),
            confinement_of(request.rule, env.get("HOME")),
        )
    request.audit["server"] = session.spec.id
    await session.ready()
    return session


#: The sessions the question being answered uses (:func:`holds_sessions`).
_held: ContextVar[list[LspSession] | None] = ContextVar("lsp_held", default=None)


def holds_sessions(handler: Callable[[ServerRequest], Any]) -> Any:
    """
    ``handler``, with the session its question uses held until it has
    answered: a session is stopped to make room only while no question
    uses it (:meth:`~sandboxd.lsp.service.LspService.check_room`).
    """

    @functools.wraps(handler)
    async def run(request: ServerRequest) -> Any:
        held: list[LspSession] = []
        _held.set(held)
        try:
            return await handler(request)
        finally:
            for session in held:
                session.release()

    return run


def _hold(session: LspSession) -> None:
    held = _held.get()
    if held is not None:
        session.hold()
        held.append(session)


# -- the file asked about --------------------------------------------------------


def _too_large(cap: int, size: int, endpoint_id: str) -> ApiError:
    return payload_too_large(
        cap,
        f"the file ({size} bytes)",
        setting=limit_setting(endpoint_id, "max_bytes"),
        size=size,
    )


@attrs.define
class Question:
    """A file, its text, and the session that was made to see it."""

    session: LspSession
    source: Source
    text: Text
    fresh: bool
    guard: PathGuard

    @property
    def document(self) -> dict[str, str]:
        """The ``textDocument`` of a request about this file."""
        return {"uri": answers.uri_of(self.source.path)}

    def position(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request's ``line`` and ``column`` as an LSP text document position."""
        line = integer(body.get("line"), "line", low=1)
        column = integer(body.get("column", 1), "column", low=1)
        try:
            position = self.text.position(line, column)
        except ValueError as e:
            raise bad_request(str(e), kind="past_end") from None
        return {"textDocument": self.document, "position": position}

    def answer(self, **fields: Any) -> dict[str, Any]:
        """An answer naming the session and server."""
        return {"session_id": self.session.id, "server": self.session.spec.id, **fields}

    def place(
        self, request: ServerRequest, found: list[tuple[dict[str, Any], str, Any]]
    ) -> Deferred[tuple[list[dict[str, Any]], int]]:
        """
        ``found`` placed in their files' lines, in a thread
        (:func:`~sandboxd.lsp.sources.placed`): ``(placed, outside)``.
        """
        return request.context.in_thread(
            placed,
            self.guard,
            found,
            {self.source.path: self.text},
            limits_of(request.rule)["max_bytes"],
            self.session.encoding,
        )

    def needs(self, capability: str, what: str) -> None:
        """:raises ApiError: 501 when the server does not answer ``what``."""
        if not self.session.supports(capability):
            raise unsupported(
                f"the language server {self.session.spec.id} does not answer {what}"
            )


async def question(request: ServerRequest) -> Question:
    """
    The file named by ``path``, read, with the session for its project
    (``session_id``, else by ``server`` or the file's language, ``root``
    or the nearest project root, and ``user``), which now has its text.
    """
    body = request.body
    path = required(body.get("path"), "path")
    guard = PathGuard.for_request(request)
    limits = limits_of(request.rule)
    cap = limits["max_bytes"]
    source: Source = await request.context.in_thread(
        read_source,
        guard,
        path,
        cap,
        lambda size: _too_large(cap, size, request.endpoint.id),
    )
    language = string(body.get("language"), "language", None) or language_of(
        source.path
    )
    session_id = string(body.get("session_id"), "session_id", None)
    if session_id is not None:
        session = service(request).get(session_id, request.identity)
        request.audit["server"] = session.spec.id
        await session.ready()
        language = language or session.spec.languages[0]
    else:
        server = string(body.get("server"), "server", None)
        if language is None and server is None:
            raise bad_request(
                f"no language is known for {path!r}: name a 'language' or a 'server'"
            )
        specs = candidates(request, language, server)
        root = source.root
        if body.get("root") is not None:
            root = guard.cwd(body.get("root"))
        run_as = resolve_user(body.get("user"), request.rule)
        session = await session_for(request, specs, root, run_as)
        language = language or session.spec.languages[0]
    _hold(session)
    if session.wants_files:
        session.files_seen(
            await request.context.in_thread(
                watched.scan, session.root, defaults.LSP_WATCHED_FILES
            )
        )
    fresh = session.sync(source.path, language, source.text, source.digest)
    text = source.lines.in_encoding(session.encoding)
    return Question(session, source, text, fresh, guard)


def result_limit(request: ServerRequest, body: dict[str, Any], default: int) -> int:
    """``max_results`` of the body, at most the policy's."""
    ceiling = limits_of(request.rule)["max_results"]
    return integer(
        body.get("max_results", min(default, ceiling)),
        "max_results",
        low=1,
        high=ceiling,
    )


# -- the questions ------------------------------------------------------------------


async def lsp_diagnostics(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /lsp/diagnostics {path}``: what the server reports for the file as
    it is on disk now, once it has stopped changing its mind.
    """
    body = request.body
    limits = limits_of(request.rule)
    timeout = seconds(
        body.get("timeout"),
        "timeout",
        limits["timeout_seconds"],
        ceiling=limits["timeout_seconds"],
    )
    q = await question(request)
    published, settled = await q.session.diagnostics_of(q.source.path, q.fresh, timeout)
    if published.oversized is not None:
        limit = limits_of(request.rule)["max_message_bytes"]
        raise payload_too_large(
            limit,
            message=f"the language server reported {published.oversized} bytes of "
            f"diagnostics for {q.source.path}, over the {limit} bytes a message may "
            "have: fix the first problems a smaller file shows, or ask another server",
            setting=limit_setting(request.endpoint.id, "max_message_bytes"),
            path=q.source.path,
        )
    found = answers.diagnostics(
        published.items, q.text, q.session.spec.diagnostics_count_in
    )
    # Counted before the cut: an agent stops at counts.error == 0.
    return q.answer(
        path=q.source.path,
        diagnostics=found,
        counts=dict(published.counts),
        settled=settled,
        truncated=published.dropped > 0,
    )


async def _locations(
    request: ServerRequest, method: str, provider: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """A definition or references question: the locations, placed and guarded."""
    body = request.body
    q = await question(request)
    q.needs(provider, method.rsplit("/", 1)[1])
    limit = result_limit(request, body, 100)
    result = await q.session.ask(method, {**q.position(body), **extra})
    found: list[tuple[dict[str, Any], str, Any]] = [
        ({}, path, span) for path, span in answers.locations(result)
    ]
    located, outside = await q.place(request, found[:limit])
    return q.answer(locations=located, outside=outside, truncated=len(found) > limit)


def lsp_definition(request: ServerRequest) -> Any:
    """``POST /lsp/definition {path, line, column}``: where the name there is defined."""
    return _locations(request, "textDocument/definition", "definitionProvider", {})


def lsp_references(request: ServerRequest) -> Any:
    """``POST /lsp/references {path, line, column}``: where the name there is used."""
    include = flag(
        request.body.get("include_declaration", True),
        "include_declaration",
        words=False,
    )
    return _locations(
        request,
        "textDocument/references",
        "referencesProvider",
        {"context": {"includeDeclaration": include}},
    )


async def lsp_hover(request: ServerRequest) -> dict[str, Any]:
    """``POST /lsp/hover {path, line, column}``: the type and documentation there."""
    q = await question(request)
    q.needs("hoverProvider", "hover")
    result = await q.session.ask("textDocument/hover", q.position(request.body))
    if not isinstance(result, dict):
        return q.answer(found=False, contents="", range=None)
    span = result.get("range")
    return q.answer(
        found=True,
        contents=answers.hover_text(result.get("contents")),
        range=q.text.span(span) if isinstance(span, dict) else None,
    )


async def lsp_completions(request: ServerRequest) -> dict[str, Any]:
    """``POST /lsp/completions {path, line, column}``: what could be typed there."""
    body = request.body
    q = await question(request)
    q.needs("completionProvider", "completions")
    limit = result_limit(request, body, 50)
    params = {**q.position(body), "context": {"triggerKind": 1}}
    line = q.text.lines[params["position"]["line"]]
    column = integer(body.get("column", 1), "column", low=1)
    found = answers.TYPED.search(line[: column - 1])
    typed = found.group() if found is not None else ""
    result = await q.session.ask("textDocument/completion", params)
    items, incomplete, truncated = answers.completions(result, limit, typed)
    return q.answer(items=items, is_incomplete=incomplete, truncated=truncated)


async def lsp_symbols(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /lsp/symbols {path}``: the file's symbols; ``{query, path}``: the
    project's symbols whose names match ``query``.
    """
    body = request.body
    query = string(body.get("query"), "query", None)
    q = await question(request)
    limit = result_limit(request, body, 100)
    if query is None:
        q.needs("documentSymbolProvider", "document symbols")
        result = await q.session.ask(
            "textDocument/documentSymbol", {"textDocument": q.document}
        )
        symbols = answers.document_symbols(result, q.text, q.source.path)
        for s in symbols:
            s["text"] = q.text.line_text(s["line"])
        return q.answer(
            symbols=symbols[:limit], outside=0, truncated=len(symbols) > limit
        )
    q.needs("workspaceSymbolProvider", "workspace symbols")
    result = await q.session.ask_warm("workspace/symbol", {"query": query})
    found = answers.workspace_symbols(result)
    symbols, outside = await q.place(request, found[:limit])
    return q.answer(symbols=symbols, outside=outside, truncated=len(found) > limit)


async def lsp_rename(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /lsp/rename {path, line, column, new_name, dry_run?}``: the name
    there renamed in every file the server says uses it, all or none.
    """
    body = request.body
    new_name = required(body.get("new_name"), "new_name")
    dry_run = flag(body.get("dry_run", False), "dry_run", words=False)
    q = await question(request)
    q.needs("renameProvider", "renames")
    cap = limits_of(request.rule)["max_bytes"]
    # The server's edits are of the texts it has: every file it has open
    # is sent as it is on disk now (a rename before this one, or anyone,
    # may have changed it), or the edits would not fit the files.
    others = [p for p in q.session.documents if p != q.source.path]
    if others:
        q.session.refresh(
            await request.context.in_thread(texts_now, q.guard, others, cap)
        )
    # A server still reading the project answers null (pyright's first
    # rename does), which would read as "not a name": asked again while young.
    result = await q.session.ask_warm(
        "textDocument/rename", {**q.position(body), "newName": new_name}
    )
    edits, operations = answers.text_edits(result)
    if operations:
        raise unsupported(
            f"the language server's rename also asks to {', '.join(sorted(set(operations)))} "
            "files, which sandboxd does not do"
        )
    if not edits:
        raise _nothing_to_rename(q.text, body)
    sent = {path: doc.digest for path, doc in q.session.documents.items()}

    def job() -> tuple[list[workspace.Planned], list[dict[str, Any]]]:
        planned = workspace.plan(
            q.guard,
            edits,
            q.session.encoding,
            sent,
            cap,
            lambda size: _too_large(cap, size, request.endpoint.id),
        )
        if not dry_run:
            workspace.write(q.guard, planned)
        return planned, [workspace.describe(p) for p in planned]

    planned, files = await request.context.in_thread(job)
    if not dry_run:
        # What the server has open is now what was written.
        q.session.refresh({p.path: p.new for p in planned})
    return q.answer(files=files, applied=not dry_run)


def _nothing_to_rename(text: Text, body: dict[str, Any]) -> ApiError:
    """400: no edits; past the line's end, says how long the line is."""
    line = integer(body.get("line"), "line", low=1)
    column = integer(body.get("column", 1), "column", low=1)
    length = len(text.lines[line - 1])
    if column > length + 1:
        return bad_request(
            f"column {column} is past the end of line {line}, which has {length} "
            f"characters (columns 1 to {length + 1}): the language server found "
            "nothing to rename there",
            kind="past_end",
        )
    return bad_request(
        f"the language server found nothing to rename at line {line}, column {column}",
        kind="not_found",
    )


HANDLERS = {
    "lsp_servers": lsp_servers,
    "lsp_sessions_list": lsp_sessions_list,
    "lsp_session_create": lsp_session_create,
    "lsp_session_get": lsp_session_get,
    "lsp_session_delete": lsp_session_delete,
    "lsp_connect": lsp_connect,
    "lsp_diagnostics": holds_sessions(lsp_diagnostics),
    "lsp_definition": holds_sessions(lsp_definition),
    "lsp_references": holds_sessions(lsp_references),
    "lsp_hover": holds_sessions(lsp_hover),
    "lsp_symbols": holds_sessions(lsp_symbols),
    "lsp_completions": holds_sessions(lsp_completions),
    "lsp_rename": holds_sessions(lsp_rename),
}
