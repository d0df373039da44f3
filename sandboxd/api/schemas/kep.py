"""What the endpoint of the KEP door takes and gives."""

from __future__ import annotations

from sandboxd.api.fields import E, Schema

SCHEMAS: dict[str, Schema] = {
    "kep": Schema(
        errors=(
            E(401, "unauthorized", "UNAUTHENTICATED: token missing or wrong"),
            E(403, "missing_scope", "PERMISSION_DENIED: the mapped endpoint's scope"),
            E(
                404,
                "endpoint_disabled",
                "the kep endpoint is off: nothing listens (403 PERMISSION_DENIED on a "
                "connection already open)",
            ),
        ),
        notes="On the KEP ports (--kep-rest-port, --kep-grpc-port), not the HTTP "
        "port: the runtime protocol of kubernetes-sigs/agent-sandbox (its REST "
        "filesystem API under /v1/ and its gRPC ProcessService), each call governed "
        "as the sandboxd endpoint it maps to. Its reference daemon is also called "
        "sandboxd: a different project. Table: docs/kep.md.",
    ),
}
