# -*- test-case-name: tests.kep.test_access -*-
"""
Who a KEP call is: the gate's answer, with the KEP door's one exception.

agent-sandbox's SDK sends no credential at all.  A policy may name, in
the ``kep`` endpoint's ``params.unauthenticated_as``, one of its tokens
that such a call stands for: the call then has that token's identity (its
scopes, path rules, limits, audit name) on both KEP listeners and nowhere
else.  A call that presents a credential is authenticated as on every
door; without the param a call without one is 401 as everywhere (unless
the daemon has no token at all).  Both listeners admit through
:func:`admit`, so the exception is decided in one place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from sandboxd.access import gate
from sandboxd.errors import ApiError

if TYPE_CHECKING:
    from sandboxd.kep.grpc import HeadCheck

log = Logger(namespace="sandboxd.kep")

#: The door's own endpoint id (its rule carries the param).
ENDPOINT = "kep"


def unauthenticated_as(context: Any) -> str | None:
    """The token id a KEP call without credentials stands for, or None."""
    name: str | None = context.policy.rules[ENDPOINT].params.unauthenticated_as
    return name


def admit(
    context: Any,
    endpoint: Any,
    headers: Mapping[bytes, Sequence[bytes]],
    **options: Any,
) -> gate.Passed:
    """
    :func:`sandboxd.access.gate.admit` for a KEP call, a call without a
    credential standing for ``params.unauthenticated_as`` when it is set.

    :raises gate.Refused: the gate's refusal.
    """
    return gate.admit(
        context,
        endpoint,
        headers,
        unauthenticated_as=unauthenticated_as(context),
        **options,
    )


def check_head(
    context: Any,
    endpoint_ids: Sequence[str],
    headers: Mapping[bytes, Sequence[bytes]],
) -> ApiError | None:
    """
    :func:`sandboxd.access.gate.check_head` for each of ``endpoint_ids``
    (a call without a credential standing for ``params.unauthenticated_as``):
    the refusal a call's head alone earns, before its body is read; None
    when the head passes.
    """
    try:
        for endpoint_id in endpoint_ids:
            gate.check_head(
                context,
                context.table.get(endpoint_id),
                headers,
                unauthenticated_as=unauthenticated_as(context),
            )
    except ApiError as e:
        return e
    return None


def grpc_head_check(context: Any) -> HeadCheck:
    """
    The gRPC listener's :attr:`~sandboxd.kep.grpc.GrpcFactory.check_head`:
    the door's credential and scopes on a call's headers, so that a caller
    the door refuses is answered before it sends its message; the refusal
    is audited here (no handler runs), with the gate's status and code.
    """
    from sandboxd.kep.errors import error_headers, grpc_status_name
    from sandboxd.kep.grpc import GrpcError, Status

    def check(method: Any, headers: dict[bytes, list[bytes]], peer: str) -> Any:
        error = check_head(context, [ENDPOINT], headers)
        if error is None:
            return None
        gate.audit(
            context,
            door=gate.Door.KEP,
            endpoint=context.table.get(ENDPOINT),
            identity=None,
            rule=context.policy.rules.get(ENDPOINT),
            method="POST",
            path=method.path,
            query="",
            status=error.status,
            code=str(error.code) if error.code else None,
            decided_by=error.rule,
            started=time.monotonic(),
            client=peer,
            headers=headers,
        )
        trailers = {name.lower(): value for name, value in error_headers(error).items()}
        return GrpcError(Status[grpc_status_name(error)], error.message, trailers)

    return check


def warn_if_unauthenticated(context: Any) -> None:
    """
    Say at start and at each reload that calls without credentials are let
    in: whoever reaches the KEP ports acts as that token.
    """
    name = unauthenticated_as(context)
    if name is None or context.policy.tokens.local_mode:
        return
    log.warn(
        "sandboxd: the kep endpoint's params.unauthenticated_as is {name!r}: a call "
        "to the KEP ports without a credential acts as the token {name!r} (its "
        "scopes and path rules); whoever can reach those ports can act as it, so "
        "keep that token narrow and the ports reachable only by whom you mean",
        name=name,
    )


__all__ = [
    "ENDPOINT",
    "admit",
    "check_head",
    "grpc_head_check",
    "unauthenticated_as",
    "warn_if_unauthenticated",
]
