"""What the endpoints of the E2B door take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, Schema

SCHEMAS: dict[str, Schema] = {
    "e2b": Schema(
        produces="connect",
        errors=(
            E(401, "unauthorized", "Connect unauthenticated: token missing or wrong"),
            E(
                403,
                "missing_scope",
                "Connect permission_denied: the mapped endpoint's scope",
            ),
            E(404, "endpoint_disabled", "the e2b endpoint is off: nothing listens"),
        ),
        notes="On the E2B port (--e2b-port, envd's 49983), not the HTTP port: envd's "
        "Connect RPC services process.Process and filesystem.Filesystem and its REST "
        "routes, each call governed as the sandboxd endpoint it maps to. Table: "
        "docs/e2b.md.",
    ),
}
