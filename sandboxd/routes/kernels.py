# -*- test-case-name: tests.kernels.test_contexts -*-
"""
Handlers of the ``code`` group (SPEC §22): stateful kernels.

Thin: parse, find the context (404 for another identity's), hand over to
:mod:`sandboxd.kernels`. The service lives in ``context.code``.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.access.guard import PathGuard
from sandboxd.errors import (
    Code,
    bad_request,
    forbidden,
    not_found,
    payload_too_large,
    policy_rule,
)
from sandboxd.kernels.contexts import (
    BASH_NAME,
    ENV_LANGUAGES,
    CodeContext,
    Execution,
    ExecutionLimits,
)
from sandboxd.kernels.kernelspecs import (
    BUILTIN_KERNEL,
    DEFAULT_KERNEL,
    KernelSpec,
    find_kernelspecs,
)
from sandboxd.kernels.service import CodeService
from sandboxd.policy import defaults
from sandboxd.policy.confinement import confinement_of
from sandboxd.policy.defaults import MAX_TURN_WAIT_SECONDS
from sandboxd.policy.rules import EffectiveRule
from sandboxd.processes.command import resolve_user
from sandboxd.processes.environment import child_environment, validate_env
from sandboxd.web.messages import ServerRequest, ServerResponse, SSEResponse
from sandboxd.web.params import flag, integer, number, one_of, seconds, string
from sandboxd.web.sse import Follower, SSEChannel, resume_point


def service(request: ServerRequest) -> CodeService:
    """The group's service."""
    code = request.context.code
    assert code is not None
    return code.get()


def context_of(request: ServerRequest) -> CodeContext:
    """The ``{cid}`` context if the caller owns it, else 404."""
    return service(request).get(request.path_params["cid"], request.identity)


def execution_of(request: ServerRequest) -> tuple[CodeContext, Execution]:
    """The ``{xid}`` execution of the ``{cid}`` context, else 404."""
    ctx = context_of(request)
    x = ctx.executions.get(request.path_params["xid"])
    if x is None:
        raise not_found(f"no execution {request.path_params['xid']!r} in {ctx.id}")
    return ctx, x


def limits_of(rule: EffectiveRule) -> dict[str, Any]:
    """The code limits of ``rule``, each falling back to the built-in default."""
    out = dict(defaults.CODE_LIMITS)
    for key in out:
        value = getattr(rule.limits, key, None)
        if value is not None:
            out[key] = value
    return out


def kernels(context: Any) -> dict[str, KernelSpec]:
    """The kernelspecs the daemon can start."""
    return find_kernelspecs(child_environment(context, None))


def allowed_kernel(request: ServerRequest, name: str) -> KernelSpec:
    """
    The kernelspec ``name`` if the policy allows it and it exists.

    :raises ApiError: 400 ``invalid_param`` with the allowed names.
    """
    allowed = request.rule.params.kernels
    specs = kernels(request.context)
    usable = [k for k in allowed if k in specs]
    if name not in allowed or name not in specs:
        why = "is not allowed" if name not in allowed else "is not installed"
        raise bad_request(
            f"the kernel {name!r} {why} (allowed: {', '.join(usable) or 'none'})",
            allowed=usable,
            rule=policy_rule(request.rule, "params.kernels"),
        )
    return specs[name]


def default_kernel(request: ServerRequest) -> str:
    """``python3`` (ipykernel) where it can run, else the built-in kernel."""
    specs = kernels(request.context)
    allowed = request.rule.params.kernels
    if DEFAULT_KERNEL in specs and DEFAULT_KERNEL in allowed:
        return DEFAULT_KERNEL
    if BUILTIN_KERNEL in allowed:
        return BUILTIN_KERNEL
    return DEFAULT_KERNEL


# -- kernels and contexts ----------------------------------------------------


def code_kernels(request: ServerRequest) -> dict[str, Any]:
    """Every kernelspec found, and whether the policy allows it."""
    allowed = request.rule.params.kernels
    return {
        "kernels": [
            spec.describe(name in allowed)
            for name, spec in sorted(kernels(request.context).items())
        ],
        "default": default_kernel(request),
    }


def code_contexts_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's contexts (every context for ``*``)."""
    return {
        "contexts": [c.describe() for c in service(request).visible(request.identity)]
    }


async def code_context_create(request: ServerRequest) -> ServerResponse:
    """
    ``POST /code/contexts {kernel?, language?, cwd?, env?, user?, name?}``:
    201 once the kernel answers, 504 ``timeout`` if it does not within
    ``start_timeout_seconds`` (its tree killed).
    """
    body = request.body
    ctx = await create_context(request, body)
    return ServerResponse(status=201, body=ctx.describe())


async def create_context(request: ServerRequest, body: dict[str, Any]) -> CodeContext:
    """Make and start a context from a create body (also the E2B door's)."""
    rule = request.rule
    name = body.get("kernel")
    language = body.get("language")
    if name is None and language is not None:
        lang = string(language, "language").lower()
        specs = kernels(request.context)
        matching = [
            k for k in rule.params.kernels if k in specs and specs[k].language == lang
        ]
        if not matching:
            raise bad_request(
                f"no allowed kernel runs {lang!r}",
                allowed=[k for k in rule.params.kernels if k in specs],
                rule=policy_rule(rule, "params.kernels"),
            )
        name = matching[0]
    spec = allowed_kernel(
        request,
        string(name, "kernel") if name is not None else default_kernel(request),
    )
    label = body.get("name")
    if label is not None:
        label = string(label, "name")[:200]
    cwd = PathGuard(rule).cwd(body.get("cwd"))
    run_as = resolve_user(body.get("user"), rule)
    extra = dict(spec.env)
    extra.update(validate_env(body.get("env")))
    env = child_environment(request.context, rule, extra)
    if run_as is not None:
        run_as.apply(env)
    limits = limits_of(rule)
    svc = service(request)
    svc.check_room(request.identity, limits)
    ctx = CodeContext(
        svc,
        spec,
        request.identity.root,
        cwd,
        env,
        run_as,
        limits,
        rule.params.auto_restart,
        label,
        confinement_of(rule, env.get("HOME")),
    )
    svc.add(ctx)
    request.audit["kernel"] = spec.name
    if ctx.confine is not None:
        request.audit["confined"] = True
    try:
        await ctx.start()
    except BaseException:
        await svc.remove(ctx)
        raise
    return ctx


def code_context_get(request: ServerRequest) -> dict[str, Any]:
    """One context, with what runs and what waits."""
    return context_of(request).describe(detail=True)


async def code_context_delete(request: ServerRequest) -> dict[str, Any]:
    """Close it: executions end ``lost``, the kernel's tree is killed."""
    ctx = context_of(request)
    await service(request).remove(ctx)
    return {"id": ctx.id, "state": "closed"}


async def code_context_restart(request: ServerRequest) -> dict[str, Any]:
    """A fresh kernel (state lost, said by ``context.restarted``)."""
    ctx = context_of(request)
    await ctx.restart("user")
    return ctx.describe(detail=True)


def code_context_interrupt(request: ServerRequest) -> dict[str, Any]:
    """Interrupt the running execution (if any)."""
    ctx = context_of(request)
    x = ctx.interrupt()
    return {
        "id": ctx.id,
        "execution_id": x.id if x is not None else None,
        "state": ctx.state,
    }


# -- executions ----------------------------------------------------------------


def new_execution(
    request: ServerRequest,
    ctx: CodeContext,
    body: dict[str, Any],
    escape_output: bool = False,
) -> Execution:
    """
    An execution from a ``code_execute`` body, submitted to ``ctx``.

    :param escape_output: it will be answered as a result document over
        HTTP (its output is escaped for JSON as it arrives).

    :raises ApiError: 413 code over ``max_request_bytes``; 403 stdin not
        allowed; 409 ``context_busy``/``context_dead``; 429.
    """
    rule = request.rule
    limits = limits_of(rule)
    code = string(body.get("code"), "code")
    size = len(code.encode("utf-8", "surrogatepass"))
    cap = rule.limits.max_request_bytes or defaults.MIB
    if size > cap:
        raise payload_too_large(cap, "'code'")
    timeout = seconds(
        body.get("timeout"),
        "timeout",
        limits["timeout_seconds"],
        ceiling=limits["max_duration_seconds"],
    )
    allow_stdin = flag(body.get("allow_stdin"), "allow_stdin", False)
    if allow_stdin and not rule.params.allow_stdin:
        raise forbidden(
            "input() is not allowed here",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(rule, "params.allow_stdin"),
        )
    env = validate_env(body.get("env")) or None
    if env:
        denied = set(rule.params.env_deny) & set(env)
        if denied:
            raise forbidden(
                f"the variable {sorted(denied)[0]!r} may not be set",
                Code.PARAM_NOT_ALLOWED,
                rule=policy_rule(rule, "params.env_deny"),
            )
        if ctx.language not in ENV_LANGUAGES:
            raise bad_request(
                "a per-execution 'env' needs a python or bash kernel; set it at create"
            )
        if ctx.language == "bash":
            for name in env:
                if not BASH_NAME.fullmatch(name):
                    raise bad_request(
                        f"bash cannot export {name[:40]!r}: a name is letters, "
                        "digits and '_', not starting with a digit"
                    )
    x = Execution(
        id="x_" + secrets.token_hex(8),
        context_id=ctx.id,
        code=code,
        limits=ExecutionLimits(
            timeout=timeout,
            max_output_bytes=int(limits["max_output_bytes"]),
            max_display_bytes=int(limits["max_display_bytes"]),
            max_event_bytes=int(limits["max_event_bytes"]),
            interrupt_grace=float(limits["interrupt_grace_seconds"]),
        ),
        allow_stdin=allow_stdin,
        silent=flag(body.get("silent"), "silent", False),
        store_history=flag(body.get("store_history"), "store_history", True),
        env=env,
        escape_output=escape_output,
    )
    request.audit["code_sha256"] = hashlib.sha256(
        code.encode("utf-8", "surrogatepass")
    ).hexdigest()
    request.audit["code_head"] = _scrubbed_head(code, env)
    request.audit["context_id"] = ctx.id
    if ctx.confine is not None:
        request.audit["confined"] = True
    ctx.submit(x, flag(body.get("queue"), "queue", True))
    request.audit["execution_id"] = x.id
    return x


def _scrubbed_head(code: str, env: dict[str, str] | None) -> str:
    head = code.encode("utf-8", "surrogatepass")[:256].decode("utf-8", "ignore")
    for value in (env or {}).values():
        if value:
            head = head.replace(value, "***")
    return head


async def code_execute(request: ServerRequest) -> Any:
    """
    ``POST …/execute {code, timeout?, wait?, stream?, queue?, on_disconnect?,
    env?, allow_stdin?}``: the result when done within ``wait``, else 202
    and the execution id; ``stream: true`` answers its events as SSE.
    """
    body = request.body
    ctx = context_of(request)
    stream = flag(body.get("stream"), "stream", False)
    on_disconnect = one_of(
        body.get("on_disconnect", "continue"),
        "on_disconnect",
        ("continue", "interrupt"),
    )
    wait = number(body.get("wait"), "wait", None, 0, MAX_TURN_WAIT_SECONDS, clamp=True)
    x = new_execution(
        request, ctx, body, escape_output=not stream and request.raw is not None
    )
    if stream:
        return execution_stream(ctx, x, 0, on_disconnect == "interrupt")
    limit = x.limits.timeout + x.limits.interrupt_grace + 5 if wait is None else wait
    if on_disconnect == "interrupt":
        return await _wait_or_interrupt(
            request, ctx, x, min(limit, MAX_TURN_WAIT_SECONDS)
        )
    await _within(request, x, min(limit, MAX_TURN_WAIT_SECONDS))
    return answer(request, x)


async def _wait_or_interrupt(
    request: ServerRequest, ctx: CodeContext, x: Execution, limit: float
) -> Any:
    from twisted.internet.defer import CancelledError

    try:
        await _within(request, x, limit)
    except CancelledError:
        ctx.abandon(x)
        raise
    return answer(request, x)


def _within(request: ServerRequest, x: Execution, limit: float) -> Deferred[Any]:
    """Fires when ``x`` ends or after ``limit`` seconds, whichever is first."""
    from sandboxd.agents.session import within

    if x.done or limit <= 0:
        d: Deferred[Any] = Deferred()
        d.callback(None)
        return d
    return within(request.context.reactor, x.wait(), limit)


def answer(request: ServerRequest, x: Execution) -> Any:
    """
    200 with the result document, or 202 while it is still queued or
    running. Over HTTP a big output's document goes as the bytes
    :meth:`~sandboxd.kernels.contexts.Execution.result_json` makes (a
    fraction of the cost of encoding the decoded text); the MCP and E2B
    doors, which read the value, get it as one.
    """
    if x.done:
        if request.raw is None or not x.big_output:
            return x.result()
        return ServerResponse(
            raw=x.result_json(), headers={"Content-Type": "application/json"}
        )
    return ServerResponse(
        status=202,
        body={
            "execution_id": x.id,
            "context_id": x.context_id,
            "state": x.state,
            "events_url": x.events_url,
        },
    )


def execution_stream(
    ctx: CodeContext, x: Execution, after: int, interrupt_on_disconnect: bool
) -> SSEResponse:
    """An execution's events as SSE from ``after`` (ends with ``execution.ended``)."""

    def start(channel: SSEChannel) -> Deferred[None]:
        if interrupt_on_disconnect:

            def gone() -> None:
                ctx.abandon(x)

            channel.on_disconnect(gone)
        return Follower(x.log, channel, after).done

    return SSEResponse(start=start)


def code_executions_list(request: ServerRequest) -> dict[str, Any]:
    """A context's executions, oldest first (``?state=`` filters)."""
    ctx = context_of(request)
    state = request.query.get("state")
    return {
        "executions": [
            x.summary()
            for x in ctx.executions.values()
            if state in (None, "", "all") or x.state == state
        ]
    }


async def code_execution_get(request: ServerRequest) -> Any:
    """The result document; ``?wait=S`` long-polls while it runs."""
    _, x = execution_of(request)
    wait = number(
        request.query.get("wait"), "wait", 0, 0, MAX_TURN_WAIT_SECONDS, clamp=True
    )
    await _within(request, x, wait or 0)
    return answer(request, x)


def code_execution_events(request: ServerRequest) -> Any:
    """
    SPEC §9 stream of one execution: resumable by ``Last-Event-ID`` or
    ``after``; ``follow=false`` answers one JSON page instead.
    """
    # Checked even when following, where it is not used: a wrong value is
    # refused whatever else the call asks.
    limit = integer(request.query.get("limit"), "limit", 1000, low=0) or 1000
    follow = flag(request.query.get("follow"), "follow", True)
    ctx, x = execution_of(request)
    after = resume_point(request.query, request.headers)
    if follow:
        return execution_stream(ctx, x, after, False)
    gap, events = x.log.since(after)
    events = events[:limit]
    return {
        "events": [e.as_json() for e in events],
        "next": events[-1].seq if events else after,
        "dropped": {"from": gap[0], "to": gap[1]} if gap else None,
        "closed": x.log.closed,
    }


def code_execution_input(request: ServerRequest) -> dict[str, Any]:
    """``{value}``: the answer to the pending ``input()``."""
    ctx, x = execution_of(request)
    value = string(request.body.get("value"), "value", "")
    ctx.input(x, value)
    return {"execution_id": x.id}


def code_output_get(request: ServerRequest) -> Deferred[ServerResponse]:
    """
    A spilled display item, raw, with its MIME type; never run in the
    daemon's origin (``nosniff``, ``CSP: sandbox``).  Read on a worker
    thread: an item may be megabytes, on a disk as slow as the sandbox's.
    """
    ctx = context_of(request)
    oid = request.path_params["oid"]
    path, mime, _, digest = service(request).output(ctx, oid)

    def read() -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            # Dropped meanwhile: its context was closed or restarted.
            raise not_found(f"no output {oid!r} in {ctx.id}") from None

    def answer(data: bytes) -> ServerResponse:
        return ServerResponse(
            status=200,
            raw=data,
            headers={
                "Content-Type": mime if "/" in mime else "application/octet-stream",
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox",
                # The digest taken when it was spilled: hashing megabytes
                # again for each download would hold a thread up for nothing.
                "ETag": '"' + digest[:32] + '"',
            },
        )

    return request.context.in_thread(read).addCallback(answer)


HANDLERS = {
    "code_kernels": code_kernels,
    "code_contexts_list": code_contexts_list,
    "code_context_create": code_context_create,
    "code_context_get": code_context_get,
    "code_context_delete": code_context_delete,
    "code_context_restart": code_context_restart,
    "code_context_interrupt": code_context_interrupt,
    "code_execute": code_execute,
    "code_executions_list": code_executions_list,
    "code_execution_get": code_execution_get,
    "code_execution_events": code_execution_events,
    "code_execution_input": code_execution_input,
    "code_output_get": code_output_get,
}
