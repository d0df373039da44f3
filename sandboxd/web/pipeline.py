# -*- test-case-name: tests.web.test_pipeline -*-
"""
Steps 1–5 of the request pipeline (SPEC §3), decided from the request line
and headers alone, before any body byte is read.

:func:`admit` is pure apart from the rate and concurrency counters it
updates: it takes the method, the raw target and the headers, and returns an
:class:`Admission` or raises the :class:`~sandboxd.errors.ApiError` the
client will see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from sandboxd.access import gate
from sandboxd.access.auth import Identity
from sandboxd.daemon.context import Context
from sandboxd.endpoints import HTTP_METHODS, Endpoint
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    invalid_path,
    no_route,
    unsupported,
)
from sandboxd.policy.rules import EffectiveRule
from sandboxd.web.cors import is_preflight
from sandboxd.web.query_token import query_token
from sandboxd.web.target import parse_path, parse_query


@attrs.define(eq=False)
class Admission:
    """What the header-time steps decided about one request."""

    endpoint: Endpoint
    path: str
    path_params: dict[str, str]
    query: dict[str, str]
    raw_query: str
    identity: Identity
    rule: EffectiveRule
    slot: bool = False


@attrs.define(eq=False)
class Refusal:
    """What is known about a request the pipeline refused (for audit)."""

    error: ApiError
    path: str
    raw_query: str
    endpoint: Endpoint | None = None
    identity: Identity | None = None
    rule: EffectiveRule | None = None


class PipelineRefusal(Exception):
    """Carries a :class:`Refusal` out of :func:`admit`."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.error.message)
        self.refusal = refusal


def _refuse(
    error: ApiError, path: str, raw_query: str, **known: object
) -> PipelineRefusal:
    return PipelineRefusal(Refusal(error, path, raw_query, **known))  # type: ignore[arg-type]


def admit(
    context: Context,
    method: str,
    raw_target: bytes,
    headers: Mapping[bytes, Sequence[bytes]],
    secure: bool = False,
) -> Admission:
    """
    Run steps 1–5 for one request: the HTTP door's own steps (path, route,
    query and framing) around the gate of SPEC §16.

    :param headers: lower-cased header names to their raw values.
    :raises PipelineRefusal: carrying the error and what was known.
    """
    raw_path, _, raw_query_b = raw_target.partition(b"?")
    raw_query = raw_query_b.decode("latin-1")
    display = raw_path.decode("latin-1")
    # 1. One normal form of the path.
    try:
        path, segments = parse_path(raw_path)
    except ApiError as e:
        raise _refuse(e, display, raw_query) from None
    # 2. Route.  HEAD is served wherever GET is (RFC 9110 §9.3.2; beyond
    # the seed), as GET without the body: Twisted drops what is written.
    route_method = "GET" if method == "HEAD" else method
    if route_method not in HTTP_METHODS:
        if is_preflight(method, headers):
            # An allowed origin's preflight never gets here (see cors); any
            # other is refused as its request would be, not as a method.
            try:
                gate.check_origin_and_host(context, headers, secure)
            except ApiError as e:
                raise _refuse(e, path, raw_query) from None
        raise _refuse(unsupported(f"method {method} is not supported"), path, raw_query)
    match = context.router.match(route_method, segments)
    if match is None:
        raise _refuse(no_route(path), path, raw_query)
    endpoint, path_params = match
    query: dict[str, str] = {}

    def framing() -> None:
        # 5. The HTTP door's framing: the query, Transfer-Encoding, Host.
        query.update(parse_query(raw_query_b))
        check_framing(headers)

    # 3–5. The gate: credentials, policy, Origin and Host, concurrency.
    try:
        passed = gate.admit(
            context,
            endpoint,
            headers,
            secure=secure,
            path_params=path_params,
            query_tokens=[t for t in [query_token(endpoint, method, raw_query_b)] if t],
            framing=framing,
        )
    except gate.Refused as e:
        raise _refuse(
            e.error,
            path,
            raw_query,
            endpoint=endpoint,
            identity=e.identity,
            rule=e.rule,
        ) from None
    for value in path_params.values():
        if "\x00" in value:
            gate.release(context, passed)
            raise _refuse(
                invalid_path("NUL is not allowed in a path"),
                path,
                raw_query,
                endpoint=endpoint,
                identity=passed.identity,
                rule=passed.rule,
            )
    return Admission(
        endpoint,
        path,
        path_params,
        query,
        raw_query,
        passed.identity,
        passed.rule,
        passed.slot,
    )


def check_framing(headers: Mapping[bytes, Sequence[bytes]]) -> None:
    """
    Step 5's framing checks: no Transfer-Encoding, exactly one Host (the
    HTTP port's rule, for every door it carries: the API and MCP).
    """
    if headers.get(b"transfer-encoding"):
        raise bad_request(
            "Transfer-Encoding is not accepted; send a Content-Length",
            Code.TRANSFER_ENCODING_NOT_ALLOWED,
        )
    hosts = headers.get(b"host", [])
    if len(hosts) != 1 or not hosts[0].strip():
        raise bad_request("exactly one Host header is required")
