# -*- test-case-name: tests.kep.test_errors -*-
"""
sandboxd's refusals in the framing of agent-sandbox's runtime protocol.

The protocol's error is ``{"code", "message"}`` with a canonical status
name (``PERMISSION_DENIED``) as ``code`` and the reference daemon's HTTP
status; its gRPC service uses the same names as gRPC statuses.  A refusal
keeps sandboxd's own SPEC §6 code and the rule that decided it, in the
``X-Sandboxd-Code`` and ``X-Sandboxd-Rule`` headers (gRPC: metadata), never
as extra fields, since the protocol says its error formats must match.
Both KEP listeners map through the one table here.
"""

from __future__ import annotations

import attrs

from sandboxd.errors import ApiError, Code


@attrs.frozen
class KepStatus:
    """How one sandboxd refusal reads on the KEP door."""

    #: The REST answer's HTTP status.
    http: int
    #: The REST body's ``code``.
    code: str
    #: The canonical gRPC status name.
    grpc: str


_INTERNAL = KepStatus(500, "INTERNAL", "INTERNAL")
_DENIED = KepStatus(403, "PERMISSION_DENIED", "PERMISSION_DENIED")

#: By sandboxd's HTTP status: what each class of refusal is in the protocol.
_BY_STATUS: dict[int, KepStatus] = {
    400: KepStatus(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    401: KepStatus(401, "UNAUTHENTICATED", "UNAUTHENTICATED"),
    403: _DENIED,
    404: KepStatus(404, "NOT_FOUND", "NOT_FOUND"),
    # A method a path does not take (the reference's router: 405, Allow).
    405: KepStatus(405, "UNIMPLEMENTED", "UNIMPLEMENTED"),
    408: KepStatus(504, "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"),
    409: KepStatus(409, "CONFLICT", "FAILED_PRECONDITION"),
    412: KepStatus(412, "FAILED_PRECONDITION", "FAILED_PRECONDITION"),
    # The reference caps no body; a body over sandboxd's max_bytes is the
    # caller's argument that is too big, answered with the status that says so.
    413: KepStatus(413, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"),
    415: KepStatus(415, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    416: KepStatus(416, "OUT_OF_RANGE", "OUT_OF_RANGE"),
    429: KepStatus(429, "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"),
    501: KepStatus(501, "UNIMPLEMENTED", "UNIMPLEMENTED"),
    503: KepStatus(503, "UNAVAILABLE", "UNAVAILABLE"),
    504: KepStatus(504, "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"),
    507: KepStatus(507, "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"),
}

#: Codes whose meaning here is not their status's: a switched-off endpoint
#: is sandboxd's 404 (so that a probe cannot tell off from absent) but a
#: refusal by policy all the same; a file that exists is gRPC's own status.
_BY_CODE: dict[Code, KepStatus] = {
    Code.ENDPOINT_DISABLED: _DENIED,
    Code.FILE_EXISTS: KepStatus(409, "CONFLICT", "ALREADY_EXISTS"),
}


def kep_status(error: ApiError) -> KepStatus:
    """The protocol's status for a sandboxd error (500 ``INTERNAL`` otherwise)."""
    if error.code is not None and error.code in _BY_CODE:
        return _BY_CODE[error.code]
    return _BY_STATUS.get(error.status, _INTERNAL)


def grpc_status_name(error: ApiError) -> str:
    """The canonical gRPC status name of a sandboxd error (``PERMISSION_DENIED``)."""
    return kep_status(error).grpc


def error_body(error: ApiError) -> dict[str, str]:
    """The protocol's error body: ``{"code", "message"}`` and nothing else."""
    return {"code": kep_status(error).code, "message": error.message}


def error_headers(error: ApiError) -> dict[str, str]:
    """sandboxd's own code and the rule that decided, for a client that wants them."""
    headers: dict[str, str] = {}
    if error.code is not None:
        headers["X-Sandboxd-Code"] = str(error.code)
    if error.rule:
        headers["X-Sandboxd-Rule"] = error.rule
    return headers


__all__ = ["KepStatus", "error_body", "error_headers", "grpc_status_name", "kep_status"]
