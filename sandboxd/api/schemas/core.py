"""What the endpoints of health, capabilities, discovery and the API's own description take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema

SCHEMAS: dict[str, Schema] = {
    "health": Schema(
        response=(F("status", doc='always "ok"'),),
        notes="Never needs a token; the probe behind `sandboxd healthcheck`.",
    ),
    "capabilities": Schema(
        response=(
            F("groups", "object", "{group: bool}: at least one endpoint enabled (v1)"),
            F("api_version", "integer", "2"),
            F("server_version"),
            F("identity", "object", "{id, scopes} of the caller"),
            F(
                "policy",
                "object",
                "{preset (default when none), revision (the document's, else a "
                "hash that changes with the policy), configured, base_dir}",
            ),
            F("group_summary", "object", "{group: {enabled, total}}"),
            F(
                "endpoints",
                "object",
                "{id: {method, path, group, summary, streaming, "
                "enabled, allowed, reason, rule, scopes, limits, paths, params}}; "
                "limits, paths and params only where allowed; "
                "paths: {allow, deny, deny_count, read_only (true when every "
                "allowed place is read-only), read_only_paths, symlinks, hard_links}",
            ),
            F(
                "warnings",
                "array",
                "the policy's warnings, and one when the caller holds '*' "
                "while tokens are configured",
                items="string",
            ),
        ),
    ),
    "capabilities_check": Schema(
        body=(
            F(
                "endpoint",
                doc="the endpoint id to decide (an unknown id: unknown_endpoint, "
                "the nearest id in reason)",
                required=True,
                min_length=1,
                example="shell",
            ),
            F("path", doc="one path to decide", example="notes.txt"),
            F("paths", "array", "more paths to decide", items="string"),
            F(
                "op",
                doc="the operation on the paths (default: the endpoint's)",
                enum=("read", "write", "delete"),
            ),
            F(
                "scopes",
                "array",
                "decide as if the caller held these scopes",
                items="string",
            ),
            F(
                "params",
                "object",
                "request params to decide: command, shell, language, signal",
            ),
            F(
                "command",
                doc="for run_command: the command name, decided as the call "
                "decides it (commands:run:NAME, the command's own scopes, "
                "not_found for a name no command has)",
            ),
        ),
        response=(
            F("endpoint"),
            F("allowed", "boolean"),
            F(
                "code",
                doc="why not, when not allowed: an error code, or "
                "unknown_endpoint for an id no endpoint has",
            ),
            F("rule", doc="the rule behind the refusal"),
            F("reason", doc="why not, as a sentence"),
            F("scope", doc="the missing scope"),
            F("param", doc="the refused param"),
            F("paths", "array", "[{path, allowed, code?, rule?}]", items="object"),
        ),
        errors=(E(400, "invalid_param", "no endpoint id, bad op, scopes or params"),),
        notes="Policy only: never touches the file system, so the answer for a "
        "path is the same whether or not it exists. Asked of run_command "
        "without a command, it is allowed to a caller holding any "
        "commands:run:NAME, as discovery shows it.",
    ),
    "openapi": Schema(
        response=(
            F("openapi", doc='"3.1.0"'),
            F("info", "object"),
            F("paths", "object", "every endpoint, enabled or not (x-sandboxd-enabled)"),
            F("components", "object"),
        ),
    ),
}
