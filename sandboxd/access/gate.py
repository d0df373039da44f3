# -*- test-case-name: tests.test_gate -*-
"""
The one gate every front door passes (SPEC §16).

A door (the HTTP API, the PTY WebSocket, MCP, the E2B port, the KEP ports) knows which
endpoint a call is governed as and what headers came with it; :func:`admit`
decides the rest the same way for all of them: who is calling (SPEC §4),
whether the endpoint is enabled and the caller holds its scopes, the rate
limit, the Origin and local-mode Host rules (SPEC §3 step 5 with the
same-origin rule of §5.2), and the concurrency slot.  A refusal is a
:class:`Refused` carrying the :class:`~sandboxd.errors.ApiError` with its
SPEC §6 code and rule, plus whatever was known when it was decided, so the
door can answer in its own framing and :func:`audit` can record it.

:func:`audit` is the one builder of audit lines (SPEC §11.5): every call,
through every door, is one line naming the endpoint id it was governed as
and the door it came through (``via``).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from sandboxd.access.audit import (
    make_record,
    mask_secrets,
    redact_url_secrets,
    should_record,
)
from sandboxd.access.auth import (
    Identity,
    authenticate_either,
    authenticate_token,
    presented_token,
    presented_tokens,
)
from sandboxd.access.links import CONSOLE, is_link, within
from sandboxd.access.metrics import Metrics
from sandboxd.access.tracing import Finished, Tracer
from sandboxd.errors import (
    ApiError,
    Code,
    ambiguous_credentials,
    credential_changed,
    endpoint_disabled,
    forbidden,
    identity_removed,
    missing_scope,
)
from sandboxd.policy.defaults import LOOPBACK_NAMES_KEPT

if TYPE_CHECKING:
    from sandboxd.access.audit import AuditLog
    from sandboxd.access.links import LinkTable
    from sandboxd.endpoints import Endpoint
    from sandboxd.policy import Policy
    from sandboxd.policy.limits import ConcurrencyGate, RateLimiter
    from sandboxd.policy.rules import EffectiveRule

Headers = Mapping[bytes, Sequence[bytes]]


class Context(Protocol):
    """
    What the gate reads of the daemon's :class:`~sandboxd.daemon.context.Context`
    (named here rather than imported, so the context may name the group
    services, and they the gate, without a circle).
    """

    policy: Policy
    rates: RateLimiter
    concurrency: ConcurrencyGate
    audit: AuditLog
    hostname: str
    metrics: Metrics
    links: LinkTable
    tracer: Tracer


class Door(enum.StrEnum):
    """The front doors, as the audit's ``via`` names them."""

    HTTP = "http"
    WS = "ws"
    MCP = "mcp"
    E2B = "e2b"
    KEP = "kep"
    PREVIEW = "preview"
    OPENAI = "openai"


@attrs.define(eq=False)
class Passed:
    """
    What the gate let through: the caller, the rule in force, and whether a
    concurrency slot is held (give it back with :func:`release`).
    """

    endpoint: Endpoint
    identity: Identity
    rule: EffectiveRule
    slot: bool = False


class Refused(Exception):
    """
    The gate's refusal, with what was known when it was decided.

    :ivar error: the error the caller sees, with its SPEC §6 code and rule.
    """

    def __init__(
        self,
        error: ApiError,
        endpoint: Endpoint | None = None,
        identity: Identity | None = None,
        rule: EffectiveRule | None = None,
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.endpoint = endpoint
        self.identity = identity
        self.rule = rule


# -- Host and Origin ----------------------------------------------------------

_LOOPBACK_NAMES = (
    "localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
)


def host_name(value: str) -> str:
    """The name part of a Host header (no port, no IPv6 brackets), lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


@functools.lru_cache(maxsize=LOOPBACK_NAMES_KEPT)
def is_loopback(name: str) -> bool:
    """
    Whether a host name or address is this machine's loopback.

    (Asked on every request without a token; parsing an address costs more
    than the rest of the Host check, and clients send the same few names.)
    """
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _authority(host: str, scheme: str) -> tuple[str, str]:
    """``(name, port)`` of a ``host[:port]`` with the scheme's default port."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        name, rest = host[: end + 1], host[end + 1 :]
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, port = host.split(":", 1)
    else:
        name, port = host, ""
    return name, port or _DEFAULT_PORTS.get(scheme, "")


def same_origin(origin: str, host: str, secure: bool) -> bool:
    """
    Whether ``origin`` is the daemon's own origin for a request to ``host``:
    same scheme, host and port (SPEC §5.2).  Common WebSocket clients send
    exactly that by default, and no foreign page can forge it.
    """
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not host or "/" in rest:
        return False
    if scheme != ("https" if secure else "http"):
        return False
    return _authority(rest, scheme) == _authority(host, scheme)


def _header(headers: Headers, name: bytes) -> str | None:
    values = headers.get(name)
    return values[-1].decode("latin-1").strip() if values else None


def check_origin_and_host(context: Context, headers: Headers, secure: bool) -> None:
    """
    SPEC §3 step 5's Origin and Host rules.

    :raises ApiError: 403 ``origin_not_allowed`` for a browser Origin that is
        neither the daemon's own nor in ``allowed_origins``; 403
        ``host_not_allowed`` for a Host that is not local in local mode.
    """
    policy = context.policy
    host = _header(headers, b"host") or ""
    origin = _header(headers, b"origin")
    if (
        origin is not None
        and origin not in policy.document.allowed_origins
        and not same_origin(origin, host, secure)
    ):
        raise forbidden(
            f"requests from the browser origin {origin!r} are not allowed",
            Code.ORIGIN_NOT_ALLOWED,
            rule="policy:allowed_origins",
        )
    if policy.tokens.local_mode:
        name = host_name(host)
        if not (
            is_loopback(name)
            or name == context.hostname.lower()
            or name in (h.lower() for h in policy.document.allowed_hosts)
        ):
            raise forbidden(
                f"the Host {name!r} is not allowed without a token",
                Code.HOST_NOT_ALLOWED,
                rule="policy:allowed_hosts",
            )


# -- who is calling -----------------------------------------------------------


def identify(
    context: Context,
    headers: Headers,
    query_tokens: Iterable[bytes] = (),
    audience: str = CONSOLE,
    consume: bool = True,
    unauthenticated_as: str | None = None,
) -> Identity:
    """
    The caller's identity from its headers, or from a query token on the
    doors and routes that allow one (browsers cannot set headers there).

    A capability link stands for ``link:ID`` on behalf of its minter, even
    in local mode, when it is presented where its audience is (the API and
    its doors are ``console``; the preview door ``preview:PORT``).

    :param consume: a link presented counts as a use, so a used-up one is
        refused; the use itself is spent by :func:`admit` once it has let
        the call in (:func:`spend`).
    :param unauthenticated_as: a call that presents no credential at all
        is this token id's identity (its scopes, path rules, limits, audit
        name), on a door whose clients cannot send one (the KEP door's
        ``params.unauthenticated_as``); one that presents a credential is
        authenticated as always, and an ``Authorization`` header that holds
        no token this daemon reads (``Basic ...``, an empty one) is such a
        credential, refused: its caller believes it is authenticated.
    :raises ApiError: 401 ``unauthorized``, ``link_invalid``,
        ``link_expired``; 400 ``ambiguous_credentials`` when two different
        tokens are presented in one header, or a query token and a header
        one differ, or an ``X-Access-Token`` and a Bearer token both log in
        as different identities (:func:`authenticate_either`).
    """
    queried = {t for t in query_tokens if t}
    if len(queried) > 1:
        raise ambiguous_credentials()
    if queried:
        token = queried.pop()
        shown = presented_token(headers)
        if shown is not None and shown != token:
            raise ambiguous_credentials()
        headers = {**headers, b"x-access-token": [token]}
    tokens = presented_tokens(headers)
    store = context.policy.tokens
    if (
        not tokens
        and unauthenticated_as is not None
        and not store.local_mode
        and not headers.get(b"authorization")
    ):
        stand_in = store.identity_named(unauthenticated_as)
        if stand_in is not None:
            return stand_in
    if len(tokens) > 1:
        if any(is_link(t) for t in tokens):
            raise ambiguous_credentials()
        return authenticate_either(context.policy.tokens, tokens)
    shown = tokens[0] if tokens else None
    if is_link(shown):
        assert shown is not None
        return context.links.verify(shown, audience, consume, store, spend=False)
    return authenticate_token(context.policy.tokens, shown)


def needs_credential(endpoint: Endpoint, rule: EffectiveRule) -> bool:
    """
    Whether a call must identify itself: every route but those registered
    with ``auth_required=False``, and a custom one of those too once its
    rule names scopes (SPEC §10: a custom route is gated by the policy like
    any other, so a policy that gives it scopes is not silently ignored).
    The built-in ones (the liveness probe, the console's page) stay open.
    """
    return endpoint.auth_required or (endpoint.custom and bool(rule.scopes))


def lacking_scope(
    identity: Identity, rule: EffectiveRule, path_params: Mapping[str, str]
) -> str | None:
    """
    The first scope of the rule the caller lacks, or None.

    ``commands:run:NAME`` stands in for ``commands:run`` on that one command.
    """
    for scope in rule.scopes:
        if identity.has_scope(scope):
            continue
        if (
            scope == "commands:run"
            and rule.endpoint_id == "run_command"
            and identity.has_scope(f"commands:run:{path_params.get('name', '')}")
        ):
            continue
        return scope
    return None


def _disabled(endpoint: Endpoint, rule: EffectiveRule) -> ApiError:
    return endpoint_disabled(endpoint.id, rule.enabled_by, disabled_why(endpoint, rule))


def disabled_why(endpoint: Endpoint, rule: EffectiveRule) -> str:
    """
    Why a switched-off endpoint is off, for its 404: the rule that decided
    and, for an opt-in group, how to turn it on (as the seed says it).
    """
    if rule.reason == "not_implemented":
        return "is not implemented yet"
    origin = rule.enabled_by
    prefix = "default:opt-in:"
    if origin.startswith(prefix):
        group = origin[len(prefix) :]
        return (
            f"is disabled: the group {group!r} is opt-in; turn it on with"
            f" ABX_SERVER_ENABLED_GROUPS={group} or the policy's"
            f' "groups": {{"{group}": true}}, or the endpoint with'
            f" endpoints.{endpoint.id}.enabled: true"
        )
    return f"is disabled by the rule {origin}"


# -- the gate -----------------------------------------------------------------

#: Who calls an endpoint that asks for no credential: nobody in particular,
#: with no scope (frozen, so one value serves every such call).
NOBODY = Identity("anonymous", frozenset())


def admit(
    context: Context,
    endpoint: Endpoint,
    headers: Headers,
    *,
    secure: bool = False,
    path_params: Mapping[str, str] | None = None,
    query_tokens: Iterable[bytes] = (),
    framing: Callable[[], None] | None = None,
    take_slot: bool = True,
    audience: str = CONSOLE,
    consume: bool = True,
    spend: bool = True,
    public: bool = False,
    host_rules: bool = True,
    unauthenticated_as: str | None = None,
) -> Passed:
    """
    Decide one call through any door.

    :param headers: lower-cased header names to their raw values.
    :param secure: the door was reached over TLS (for the same-origin rule).
    :param query_tokens: tokens the door read from its query string, where
        it allows one.
    :param framing: the door's own checks of its framing (the HTTP door's
        query and ``Transfer-Encoding`` rules), run after the rate limit and
        before Origin and Host, as SPEC §3 orders them.
    :param take_slot: hold a concurrency slot until :func:`release`.
    :param audience: where a capability link is being presented.
    :param consume: a link presented counts as one of its uses (a used-up
        one is refused), spent only once every check here has let the
        call in: a refused call costs none.  False for a cookie that holds
        a link already exchanged.
    :param spend: spend that use here.  A door that admits one request
        twice (as itself, then as the endpoint it maps to) says False on
        its first admission, or spends it itself with :func:`spend_use`
        once it knows the request is served: one request, one use.
    :param public: the door lets anyone through (a public preview): no
        credential is asked for and no scope checked; the rest applies.
    :param host_rules: apply SPEC §3's Origin and local-mode Host rules (a
        door with a Host rule of its own, the preview door's, says no).
    :param unauthenticated_as: see :func:`identify`.
    :raises Refused: carrying the error and what was known.
    """
    params = path_params or {}
    rule = context.policy.rules[endpoint.id]
    needs_auth = needs_credential(endpoint, rule) and not public
    try:
        identity = (
            identify(
                context, headers, query_tokens, audience, consume, unauthenticated_as
            )
            if needs_auth
            else NOBODY
        )
    except ApiError as e:
        raise Refused(e, endpoint, None, rule) from None
    try:
        if not rule.enabled:
            raise _disabled(endpoint, rule)
        if needs_auth:
            lacking = lacking_scope(identity, rule, params)
            if lacking is not None:
                raise missing_scope(
                    endpoint.id,
                    lacking,
                    rule.source("scopes") or "endpoint:" + endpoint.id,
                )
        limits = rule.limits
        if limits.rate_per_minute is not None:
            try:
                context.rates.take(identity.root, endpoint.id, limits.rate_per_minute)
            except ApiError as e:
                e.extra.setdefault("rule", rule.source("limits.rate_per_minute"))
                raise
        if framing is not None:
            framing()
        if host_rules:
            check_origin_and_host(context, headers, secure)
        slot = False
        if take_slot:
            try:
                slot = context.concurrency.acquire(endpoint.id, limits.max_concurrency)
            except ApiError as e:
                e.extra.setdefault("rule", rule.source("limits.max_concurrency"))
                raise
    except ApiError as e:
        raise Refused(e, endpoint, identity, rule) from None
    passed = Passed(endpoint, identity, rule, slot)
    if consume and spend and needs_auth:
        spend_use(context, passed)
    return passed


def spend_use(context: Context, passed: Passed) -> None:
    """
    Spend one use of the link a call was admitted with (nothing for a
    token), as the last step of its admission: checked again at that
    moment, so two calls admitted at once cannot both spend a last use.

    :raises Refused: the link was used up, revoked or expired meanwhile,
        or its use cannot be kept (507); the call's slot is given back.
    """
    if passed.identity.on_behalf_of is None:
        return  # a token, not a link: nothing to count
    try:
        context.links.spend(passed.identity)
    except ApiError as e:
        release(context, passed)
        raise Refused(e, passed.endpoint, passed.identity, passed.rule) from None


def check_head(
    context: Context,
    endpoint: Endpoint,
    headers: Headers,
    *,
    query_tokens: Iterable[bytes] = (),
    unauthenticated_as: str | None = None,
) -> None:
    """
    What :func:`admit` decides from a call's headers alone, taking nothing
    (no rate, no slot, no use of a link): the credential, the endpoint
    switched on, its scopes.  A door that admits a call only once its body
    is in asks this at the head, so that a caller who would be refused
    cannot make the daemon read, hold or spool a body first, as the HTTP
    door refuses such a caller before its body.

    :param query_tokens: the tokens the door will admit the call with
        besides its headers' (see :func:`admit`).
    :raises ApiError: the refusal :func:`admit` would make.
    """
    rule = context.policy.rules[endpoint.id]
    identity = NOBODY
    needs_auth = needs_credential(endpoint, rule)
    if needs_auth:
        identity = identify(
            context,
            headers,
            query_tokens,
            consume=False,
            unauthenticated_as=unauthenticated_as,
        )
    if not rule.enabled:
        raise _disabled(endpoint, rule)
    if needs_auth:
        lacking = lacking_scope(identity, rule, {})
        if lacking is not None:
            raise missing_scope(
                endpoint.id, lacking, rule.source("scopes") or "endpoint:" + endpoint.id
            )


def release(context: Context, passed: Passed) -> None:
    """Give back the concurrency slot a call held (idempotent)."""
    if passed.slot:
        passed.slot = False
        context.concurrency.release(passed.endpoint.id)


def runs_some_commands(endpoint_id: str, lacking: str, identity: Identity) -> bool:
    """
    Whether an identity without ``commands:run`` may still run some
    commands (it holds ``commands:run:NAME``): ``run_command`` is then
    allowed to it, in discovery, in MCP's ``tools/list`` and in a check
    that names no command alike (the seed SDK's ``check()`` cannot name
    one), since a call naming its command passes the gate.
    """
    return (
        endpoint_id == "run_command"
        and lacking == "commands:run"
        and any(s.startswith("commands:run:") for s in identity.scopes)
    )


def may_run_command(
    identity: Identity, rule: EffectiveRule, name: str, scopes: Iterable[str]
) -> bool:
    """
    Whether ``identity`` may run the template command ``name`` (its own
    ``scopes``) under ``run_command``'s ``rule``: the checks a call makes,
    the gate's (``commands:run``, or ``commands:run:NAME`` for this one)
    and the command's own, so that what ``GET /commands`` lists and what
    MCP offers is what a call would run.
    """
    if not rule.enabled:
        return False
    if lacking_scope(identity, rule, {"name": name}) is not None:
        return False
    return identity.missing(scopes) is None


def may_use(context: Context, identity: Identity, endpoint: Endpoint) -> bool:
    """
    Whether ``identity`` may call ``endpoint`` now: enabled, and every scope
    held (what MCP's ``tools/list`` and discovery's ``allowed`` show);
    ``run_command`` when it may run at least one command.
    """
    rule = context.policy.rules[endpoint.id]
    if not rule.enabled:
        return False
    if not needs_credential(endpoint, rule):
        return True
    lacking = lacking_scope(identity, rule, {})
    return lacking is None or runs_some_commands(endpoint.id, lacking, identity)


def still_allowed(
    context: Context, identity: Identity, endpoint: Endpoint
) -> tuple[Identity | None, ApiError | None]:
    """
    Whether a connection admitted earlier as ``identity`` to ``endpoint``
    (a terminal's socket, an event stream) may stay open under the policy
    in force now, asked after a reload and when a link ends (revoked or
    expired): a connection lasts as long as its client keeps it, so
    without this a leaked identity taken out of the policy, or a revoked
    link, kept the shell it had open.

    :returns: the identity as the policy defines it now (a link narrowed
        to its minter's scopes now) and None; or None and the error that
        ends the connection: the endpoint switched off, the link revoked
        or expired, the identity (or a link's minter) gone, or a scope no
        longer held.
    """
    rule = context.policy.rules[endpoint.id]
    if not rule.enabled:
        return None, _disabled(endpoint, rule)
    ended = context.links.ended(identity)
    if ended is not None:
        return None, ended
    tokens = context.policy.tokens
    current: Identity | None
    if identity.on_behalf_of is not None and identity.id.startswith("link:"):
        minter = tokens.current(identity.on_behalf_of)
        current = (
            None
            if minter is None
            else Identity(
                identity.id,
                within(identity.scopes, minter),
                on_behalf_of=identity.on_behalf_of,
                expires=identity.expires,
            )
        )
        who = identity.on_behalf_of
    else:
        current = tokens.current(identity.id)
        who = identity.id
    if current is None:
        return None, identity_removed(who)
    if identity.credential is not None:
        # The connection was opened with a token (a link, with its
        # minter's): rotating a leaked token must end what it opened, as
        # taking the identity out does.
        if not tokens.holds(who, identity.credential):
            return None, credential_changed(who)
        current = attrs.evolve(current, credential=identity.credential)
    if needs_credential(endpoint, rule):
        scope = lacking_scope(current, rule, {})
        if scope is not None:
            return None, forbidden(
                f"the identity {current.id!r} no longer holds scope {scope!r}",
                Code.MISSING_SCOPE,
                scope=scope,
            )
    return current, None


# -- the audit line -----------------------------------------------------------


def audit(
    context: Context,
    *,
    door: Door,
    endpoint: Endpoint | None,
    identity: Identity | None,
    rule: EffectiveRule | None,
    method: str,
    path: str,
    query: str,
    status: int,
    code: str | None,
    decided_by: str | None,
    started: float,
    refused: bool | None = None,
    bytes_in: int = 0,
    bytes_out: int = 0,
    client: str = "",
    extra: Mapping[str, object] | None = None,
    headers: Headers | None = None,
    count: bool = True,
) -> None:
    """
    Write the audit line of one call (SPEC §11.5, §16), if the endpoint's
    ``audit`` mode wants it (``deny`` when nothing matched); count it; and
    hand it to the tracer (:mod:`sandboxd.access.tracing`).

    :param decided_by: the rule that refused the call, if one did.
    :param refused: whether the call was refused or failed when its status
        does not say (a proxied app's own error status is neither); None:
        by status.
    :param extra: door-specific fields (a tool name, a procedure).
    :param headers: the call's headers (lower-cased names), for the
        caller's trace context and request id.
    :param count: False for a request whose calls are counted as their
        own endpoints' (an MCP POST carrying a ``tools/call``), so that
        ``sandboxd_requests_total`` counts each call once.
    """
    if count:
        context.metrics.request(
            endpoint.id if endpoint is not None else None,
            str(door),
            status,
            str(code) if code is not None else None,
            time.monotonic() - started if started else 0.0,
        )
    mode = rule.audit if rule is not None else "deny"
    recorded = should_record(mode, status, refused)
    tracer = context.tracer
    ids = None
    # Every token the daemon knows, wherever a command printed it: a token
    # given by file or by hash is as secret as one in the environment.
    secrets = context.policy.tokens.secrets()
    if tracer.exporting:
        ids = tracer.finished(
            Finished(
                door=str(door),
                endpoint=endpoint.id if endpoint is not None else None,
                identity=identity.id if identity is not None else None,
                on_behalf_of=identity.on_behalf_of if identity is not None else None,
                method=method,
                path=mask_secrets(redact_url_secrets(path), secrets),
                status=status,
                code=str(code) if code is not None else None,
                rule=decided_by,
                started=started,
                client=client,
                extra=redact_record(dict(extra), secrets) if extra else None,
            ),
            headers,
        )
    elif recorded and headers:
        ids = tracer.ids(headers)
    if not recorded:
        return
    record = make_record(
        identity=identity.id if identity is not None else "-",
        endpoint=endpoint.id if endpoint is not None else None,
        method=method,
        path=path,
        query=query,
        status=status,
        code=str(code) if code is not None else None,
        rule=decided_by,
        started=started or time.monotonic(),
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        client=client,
        refused=refused,
    )
    record["via"] = str(door)
    if identity is not None and identity.on_behalf_of is not None:
        record["on_behalf_of"] = identity.on_behalf_of
    if extra:
        record.update(extra)
    if ids:
        record.update(ids)
    context.audit.write(redact_record(record, secrets))


def redact_record(
    record: dict[str, Any], secrets: Sequence[str] = ()
) -> dict[str, Any]:
    """
    The record with URL credentials, token-like query values and each of
    ``secrets`` (:meth:`TokenStore.secrets`) masked in every string it
    holds (a path, an argv, a remote), whichever door wrote it and
    whatever a handler put in it.
    """

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return mask_secrets(redact_url_secrets(value), secrets)
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return {k: clean(v) for k, v in record.items()}


__all__ = [
    "Door",
    "Passed",
    "Refused",
    "admit",
    "audit",
    "check_head",
    "check_origin_and_host",
    "host_name",
    "identify",
    "is_loopback",
    "lacking_scope",
    "may_run_command",
    "may_use",
    "redact_record",
    "release",
    "runs_some_commands",
    "same_origin",
    "spend_use",
    "still_allowed",
]
