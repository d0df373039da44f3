"""What the endpoints of facts about the machine: system, environment, ports, packages, metrics take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema

SCHEMAS: dict[str, Schema] = {
    "system_info": Schema(
        response=(
            F("os"),
            F("arch"),
            F("cpu_count", "integer"),
            F("memory_total_mb", "integer"),
            F("memory_available_mb", "integer"),
            F("disk_total_gb", "number"),
            F("disk_free_gb", "number"),
            F("python_version"),
            F("hostname"),
            F("memory_source", doc="cgroup or host: where memory figures came from"),
            F("cpu_source", doc="cgroup or host"),
            F("cpu_limit", "number", "a fractional CPU quota, or null", nullable=True),
            F(
                "cgroups",
                "object",
                "{state: active|unavailable|disabled, reason?, daemon?, children?, "
                "controllers?, errors?}: the daemon's and its children's cgroups",
            ),
        ),
        notes="Disk is the base dir's file system; memory and CPU are the container's "
        "limits when it has them.",
    ),
    "env_get": Schema(
        query=(F("filter", doc="comma-separated names", example="PATH,LANG"),),
        response=(F("variables", "object", "{name: value}"),),
        notes="Names holding TOKEN, SECRET, KEY, PASSWORD or CREDENTIAL (any case), "
        "ABX_SERVER_*, token_env names and params.env_deny are never returned; "
        "params.allow_vars and deny_vars (globs, deny wins) narrow the answer.",
    ),
    "env_set": Schema(
        body=(
            F(
                "vars",
                "object",
                "{name: value}; null unsets the name",
                required=True,
                example={"LANG": "C.UTF-8"},
            ),
        ),
        response=(
            F("updated", "array", "sorted names (set or unset)", items="string"),
            F(
                "unset",
                "array",
                "sorted names unset (only when some were)",
                items="string",
            ),
        ),
        errors=(
            E(
                400,
                "invalid_param",
                "not an object, an empty name, = or NUL in a name, NUL in a value",
            ),
            E(
                403,
                "protected_variable",
                "PATH, HOME, USER, SHELL, ABX_* (any case), token_env "
                "names, deny_vars or outside allow_vars (variable names it)",
            ),
        ),
        notes="All or nothing. Later children inherit the variables; a null value "
        "removes one (a name not set is no error).",
    ),
    "ports": Schema(
        query=(
            F("port", "integer", "only this port's sockets", minimum=1, maximum=65535),
            F(
                "wait",
                "number",
                "with port: wait until something listens on it, at most this "
                "many seconds (cut to 120)",
                default=0,
                minimum=0,
            ),
        ),
        response=(
            F(
                "listening",
                "array",
                "[{port, protocol: tcp|tcp6, address, pid}]",
                items="object",
            ),
            F(
                "ready",
                "boolean",
                "with port: something listens on it (false when wait ran out)",
            ),
        ),
        errors=(
            E(400, "invalid_param", "a port outside 1-65535, a wait without port"),
        ),
        notes=(
            "The kernel's listening TCP sockets (sock_diag, else /proc/net/tcp{,6}); "
            "pid is null where the owner's fds are unreadable."
        ),
    ),
    "packages": Schema(
        query=(F("manager", enum=("pip", "npm"), default="pip", example="pip"),),
        response=(
            F("manager"),
            F("packages", "array", "[{name, version}] sorted by name", items="object"),
            F("interpreter", doc="the program that answered, or null", nullable=True),
        ),
        errors=(
            E(400, "invalid_param", "another manager"),
            E(500, "timeout", "the tool did not answer in time", "TimeoutError"),
            E(500, "internal", "the tool failed"),
        ),
        notes="A missing tool is an empty list.",
    ),
    "metrics": Schema(
        produces="prometheus",
        notes="Prometheus text format: `sandboxd_requests_total{endpoint,door,status,code}`, "
        "`sandboxd_request_duration_seconds` (histogram by endpoint and door), "
        "`sandboxd_streams_active`, `sandboxd_pty_sessions_active`, "
        "`sandboxd_background_processes_active`, `sandboxd_agent_sessions_active`, "
        "`sandboxd_connections_active{door}`, `sandboxd_connections_refused_total{door}`, "
        "`sandboxd_children_timed_out_total{reason}`, `sandboxd_policy_info{revision,preset}`, "
        "`sandboxd_policy_reloads_total{result}`, `sandboxd_audit_dropped_total`. "
        "No label carries a path, a command or a token. "
        "Not the sandbox's load and memory: that is `GET /system/metrics`.",
    ),
    "system_metrics": Schema(
        response=(
            F("cpu_load_1m", "number"),
            F("cpu_load_5m", "number"),
            F("cpu_load_15m", "number"),
            F("memory_used_mb", "integer"),
            F("memory_total_mb", "integer"),
            F("memory_percent", "number"),
            F("disk_used_gb", "number"),
            F("disk_total_gb", "number"),
            F("disk_percent", "number"),
            F("uptime_seconds", "number", "since the daemon started"),
            F("memory_source"),
        ),
    ),
}
