"""sandboxd's refusals as the protocol's codes, on both KEP listeners."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.errors import (
    ApiError,
    Code,
    endpoint_disabled,
    file_exists,
    file_not_found,
    forbidden,
    payload_too_large,
    unauthorized,
)
from sandboxd.kep.errors import error_body, error_headers, grpc_status_name, kep_status


class MappingTests(SynchronousTestCase):
    """One table: HTTP status, REST code and gRPC status name agree."""

    def test_table(self) -> None:
        """Each class of refusal reads as the protocol's code."""
        cases = [
            (unauthorized(), 401, "UNAUTHENTICATED", "UNAUTHENTICATED"),
            (
                forbidden("no", Code.PATH_DENIED, rule="r"),
                403,
                "PERMISSION_DENIED",
                "PERMISSION_DENIED",
            ),
            (
                endpoint_disabled("files_delete", "preset:read-only", "is off"),
                403,
                "PERMISSION_DENIED",
                "PERMISSION_DENIED",
            ),
            (file_not_found("x"), 404, "NOT_FOUND", "NOT_FOUND"),
            (file_exists("x"), 409, "CONFLICT", "ALREADY_EXISTS"),
            (payload_too_large(10), 413, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"),
            (
                ApiError(429, "slow", code=Code.RATE_LIMITED),
                429,
                "RESOURCE_EXHAUSTED",
                "RESOURCE_EXHAUSTED",
            ),
            (ApiError(500, "boom"), 500, "INTERNAL", "INTERNAL"),
            (ApiError(502, "upstream"), 500, "INTERNAL", "INTERNAL"),
        ]
        for error, status, code, grpc in cases:
            self.assertEqual(
                (
                    kep_status(error).http,
                    kep_status(error).code,
                    grpc_status_name(error),
                ),
                (status, code, grpc),
                error,
            )

    def test_body_and_headers(self) -> None:
        """The body is exactly {code, message}; sandboxd's code and rule are headers."""
        error = forbidden("no", Code.PATH_DENIED, rule="policy:endpoints.files_*")
        self.assertEqual(
            error_body(error), {"code": "PERMISSION_DENIED", "message": "no"}
        )
        self.assertEqual(
            error_headers(error),
            {
                "X-Sandboxd-Code": "path_denied",
                "X-Sandboxd-Rule": "policy:endpoints.files_*",
            },
        )
        self.assertEqual(error_headers(ApiError(500, "x")), {})
