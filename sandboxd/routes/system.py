# -*- test-case-name: tests.routes.test_system -*-
"""
The ``system`` group (SPEC §7.6, §11.3): machine facts, the environment
later children inherit, listening ports, installed packages, live metrics.

The facts themselves come from :mod:`sandboxd.sysinfo`; this module turns
them into responses and enforces the environment rules: redaction on
``GET /env``, protection on ``POST /env``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import time
from collections.abc import Mapping
from typing import Any

from twisted.internet.task import deferLater

from sandboxd import processes
from sandboxd.daemon.context import as_clock
from sandboxd.errors import (
    Code,
    bad_request,
    forbidden,
    internal,
    limit_exceeded,
    limit_rule,
)
from sandboxd.policy import defaults
from sandboxd.policy.rules import Params
from sandboxd.processes import command, environment
from sandboxd.processes.cgroups import CHILD_CGROUPS
from sandboxd.web.messages import ServerRequest, ServerResponse
from sandboxd.web.params import integer, number

#: Substrings that mark a variable as a secret (any case): never returned.
REDACTED_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")

#: Variables ``POST /env`` never changes: the ones every child depends on
#: to find programs and itself, and the server's legacy token.
PROTECTED_VARIABLES = frozenset({"PATH", "HOME", "USER", "SHELL", "ABX_SERVER_TOKEN"})

#: The server's own configuration; never shown, never set.
SERVER_PREFIX = "ABX_SERVER_"

#: Every daemon setting's namespace (``ABX_MAX_UPLOAD_SIZE``, ...), any
#: case: never set through ``POST /env``, as on the seed, since a policy
#: reload reads the daemon's environment again.
CONFIG_PREFIX = "ABX_"

PACKAGE_MANAGERS = ("pip", "npm")


# --- /system/info and /system/metrics ----------------------------------------


def _mib(n: int) -> int:
    from sandboxd import sysinfo  # on first use, not at start

    return n // sysinfo.MIB


def _gib(n: int) -> float:
    from sandboxd import sysinfo  # on first use, not at start

    return round(n / sysinfo.GIB, 2)


def system_info(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /system/info``: OS, CPUs, memory, disk of the base dir, Python.

    Memory and CPU are the container's (cgroup limits) when it has them;
    ``memory_source`` and ``cpu_source`` say which was reported, and
    ``cpu_limit`` carries a fractional CPU quota.  Sizes are MiB and GiB.
    ``cgroups`` says whether the daemon and its children have cgroups of
    their own, and if not why.
    """
    from sandboxd import sysinfo  # on first use, not at start

    cgroup = sysinfo.Cgroup.find()
    memory = sysinfo.memory(cgroup)
    cpu = sysinfo.cpu(cgroup)
    disk = sysinfo.disk(request.context.base_dir)
    return {
        "os": platform.system(),
        "arch": platform.machine(),
        "cpu_count": cpu.count,
        "memory_total_mb": _mib(memory.total),
        "memory_available_mb": _mib(memory.available),
        "disk_total_gb": _gib(disk.total),
        "disk_free_gb": _gib(disk.free),
        "python_version": platform.python_version(),
        "hostname": request.context.hostname,
        "memory_source": memory.source,
        "cpu_source": cpu.source,
        "cpu_limit": cpu.limit,
        "cgroups": CHILD_CGROUPS.status.as_json(),
    }


def system_metrics(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /system/metrics``: load, memory and disk use now.

    The load averages are the kernel's (a container shares its host's);
    memory is the container's when it has a limit (``memory_source``);
    ``uptime_seconds`` counts from the daemon's start, as in the seed.
    """
    from sandboxd import sysinfo  # on first use, not at start

    load1, load5, load15 = os.getloadavg()
    memory = sysinfo.memory()
    disk = sysinfo.disk(request.context.base_dir)
    return {
        "cpu_load_1m": round(load1, 2),
        "cpu_load_5m": round(load5, 2),
        "cpu_load_15m": round(load15, 2),
        "memory_used_mb": _mib(memory.used),
        "memory_total_mb": _mib(memory.total),
        "memory_percent": memory.percent,
        "disk_used_gb": _gib(disk.used),
        "disk_total_gb": _gib(disk.total),
        "disk_percent": disk.percent,
        "uptime_seconds": round(time.time() - request.context.started_at, 3),
        "memory_source": memory.source,
    }


# --- /env -------------------------------------------------------------------


def _secret_names(request: ServerRequest) -> frozenset[str]:
    """The server's own secret names (legacy token, every ``token_env``)."""
    return frozenset(request.context.policy.secret_env_names())


def is_redacted(name: str, secrets: frozenset[str] = frozenset()) -> bool:
    """Whether ``GET /env`` hides ``name``."""
    upper = name.upper()
    return (
        any(marker in upper for marker in REDACTED_MARKERS)
        or name in secrets
        or name.startswith(SERVER_PREFIX)
    )


def _var_refusal(params: Params, name: str) -> str | None:
    """
    Which of the rule's ``deny_vars`` / ``allow_vars`` keeps ``name`` out
    (names or globs such as ``APP_*``; the deny list wins), or None.

    One reading for both directions, as on the seed: a variable a policy
    will not let a caller set is not one it lets the caller read either.
    """
    if any(fnmatch.fnmatchcase(name, p) for p in params.deny_vars):
        return "params.deny_vars"
    if params.allow_vars is not None and not any(
        fnmatch.fnmatchcase(name, p) for p in params.allow_vars
    ):
        return "params.allow_vars"
    return None


def env_get(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /env?filter=A,B``: the environment later children inherit.

    Secrets are never returned: names holding TOKEN, SECRET, KEY, PASSWORD
    or CREDENTIAL (any case), the server's own ``ABX_SERVER_*`` and
    ``token_env`` names, and the rule's ``env_deny`` names.  The rule's
    ``allow_vars`` / ``deny_vars`` narrow it further, as on the seed, whose
    policies use them to keep a ``DATABASE_URL`` and its password unread.
    """
    params = request.rule.params
    hidden = _secret_names(request) | frozenset(params.env_deny)
    wanted: set[str] | None = None
    raw = request.arg("filter")
    if raw is not None:
        wanted = {name.strip() for name in raw.split(",") if name.strip()}
    variables = {
        name: value
        for name, value in sorted(os.environ.items())
        if (wanted is None or name in wanted)
        and not is_redacted(name, hidden)
        and _var_refusal(params, name) is None
    }
    return {"variables": variables}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise bad_request("a variable name must be a non-empty string")
    if "=" in name or "\x00" in name:
        raise bad_request(
            f"invalid variable name {name!r}: '=' and NUL are not allowed"
        )
    _encodable(name, f"invalid variable name {name!r}")
    return name


def _check_value(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise bad_request(f"the value of {name!r} must be a string")
    text = str(value)
    if "\x00" in text:
        raise bad_request(f"the value of {name!r} must not contain NUL")
    _encodable(text, f"the value of {name!r} cannot be encoded")
    return text


def _encodable(text: str, message: str) -> None:
    # os.environ encodes with surrogateescape: a lone surrogate from JSON
    # ("\ud800") would fail there, after other names were already set.
    try:
        os.fsencode(text)
    except UnicodeError:
        raise bad_request(message) from None


def _protection(request: ServerRequest, name: str) -> str | None:
    """The rule that protects ``name`` from ``POST /env``, or None."""
    if name in PROTECTED_VARIABLES or name.upper().startswith(CONFIG_PREFIX):
        return "default:protected_variables"
    if name in _secret_names(request):
        return "policy:auth.tokens"
    refusal = _var_refusal(request.rule.params, name)
    if refusal is not None:
        return request.rule.source(refusal) or f"policy:{refusal}"
    return None


def env_set(request: ServerRequest) -> dict[str, Any]:
    """
    ``POST /env {"vars": {...}}``: set variables that later children
    inherit (the daemon's own helpers start from the boot environment);
    a ``null`` value unsets one (JSON's usual "remove"), so a variable set
    by mistake (an ``LD_PRELOAD`` every later command trips over) can be
    taken back without a restart.  ``unset`` lists those, when any.

    All or nothing: every name and value is checked before any is set.

    :raises ApiError: 400 ``invalid_param`` for a body that is not an
        object of names, a bad name or value; 403 ``protected_variable``
        naming the rule for a protected or disallowed name.
    """
    updates = request.body.get("vars")
    if not isinstance(updates, dict):
        raise bad_request("'vars' must be an object of names to string values")
    checked: dict[str, str] = {}
    unset: set[str] = set()
    for name, value in updates.items():
        if value is None:
            unset.add(_check_name(name))
        else:
            checked[_check_name(name)] = _check_value(name, value)
    for name in sorted({*checked, *unset}):
        rule = _protection(request, name)
        if rule is not None:
            raise forbidden(
                f"the variable {name!r} is protected",
                Code.PROTECTED_VARIABLE,
                rule=rule,
                variable=name,
            )
    os.environ.update(checked)
    for name in unset:
        os.environ.pop(name, None)
    answer: dict[str, Any] = {"updated": sorted({*checked, *unset})}
    if unset:
        answer["unset"] = sorted(unset)
    return answer


# --- /ports -----------------------------------------------------------------


async def ports(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /ports``: listening TCP sockets, IPv4 and IPv6, with the owning
    pid where its fds are readable (else null).  The /proc walk runs in
    the thread pool.

    ``?port=N`` answers that port's sockets and whether something listens
    (``ready``); with ``&wait=S`` the answer waits until it does or ``S``
    seconds pass: an agent that started a server asks once instead of
    polling with ``curl``.
    """
    from sandboxd import sysinfo  # on first use, not at start

    port = integer(request.arg("port"), "port", None, low=1, high=65535)
    wait = number(
        request.arg("wait"),
        "wait",
        0.0,
        low=0.0,
        high=defaults.PORT_WAIT_SECONDS,
        clamp=True,
    )
    if wait and port is None:
        raise bad_request("'wait' needs 'port': the port to wait for")
    if port is not None and wait:
        await _wait_for_port(request, port, wait)
    found = await request.context.in_thread(sysinfo.listening)
    if port is None:
        return {"listening": [entry.as_json() for entry in found]}
    mine = [entry.as_json() for entry in found if entry.port == port]
    return {"listening": mine, "ready": bool(mine)}


async def _wait_for_port(request: ServerRequest, port: int, wait: float) -> None:
    """
    Until something listens on ``port``, or ``wait`` seconds pass; looked
    for every :data:`~sandboxd.policy.defaults.PORT_WAIT_POLL_SECONDS`
    (the kernel says nothing when a socket starts to listen).  A caller
    that leaves cancels the wait.
    """
    from sandboxd import sysinfo

    clock = as_clock(request.context.reactor)
    deadline = clock.seconds() + wait
    while True:
        if port in await request.context.in_thread(sysinfo.listening_ports):
            return
        left = deadline - clock.seconds()
        if left <= 0:
            return
        await deferLater(clock, min(left, defaults.PORT_WAIT_POLL_SECONDS))


# --- /packages --------------------------------------------------------------


def _helper_environment(request: ServerRequest) -> dict[str, str]:
    """
    The environment of a package listing: the daemon's boot environment
    (so ``POST /env`` cannot steer it), without secrets, with the tools'
    self-update checks and prompts off.
    """
    env = environment.child_environment(
        request.context, request.rule, base=environment.BOOT_ENVIRON
    )
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        NO_UPDATE_NOTIFIER="1",
        npm_config_update_notifier="false",
        npm_config_fund="false",
    )
    return env


def package_argv(manager: str, env: Mapping[str, str]) -> list[str] | None:
    """
    The listing command of ``manager``, or None when the tool is missing.

    pip runs under the first ``python3`` on the sandbox's PATH, the
    interpreter a user's ``pip install`` changes, not the daemon's own.
    """
    if manager == "pip":
        python = command.find_executable("python3", env)
        return [python, "-m", "pip", "list", "--format=json"] if python else None
    npm = command.find_executable("npm", env)
    return [npm, "ls", "-g", "--json", "--depth=0"] if npm else None


def parse_packages(manager: str, stdout: bytes) -> list[dict[str, str]] | None:
    """``[{"name", "version"}]`` sorted by name, or None for unreadable output."""
    try:
        data = json.loads(stdout.decode("utf-8", errors="replace") or "null")
    except ValueError:
        return None
    out: list[dict[str, str]] = []
    if manager == "pip":
        if not isinstance(data, list):
            return None
        for item in data:
            if isinstance(item, dict) and "name" in item:
                out.append(
                    {"name": str(item["name"]), "version": str(item.get("version", ""))}
                )
    else:
        if not isinstance(data, dict):
            return None
        deps = data.get("dependencies") or {}
        if not isinstance(deps, dict):
            return None
        for name, info in deps.items():
            version = info.get("version", "") if isinstance(info, dict) else ""
            out.append({"name": str(name), "version": str(version or "")})
    out.sort(key=lambda p: p["name"].lower())
    return out


async def packages(request: ServerRequest) -> dict[str, Any]:
    """
    ``GET /packages?manager=pip|npm``: installed packages, listed by a
    child bounded by ``limits.timeout_seconds`` and ``max_output_bytes``.

    A missing tool (no ``python3``/``npm`` on PATH, or a python without
    pip) is an empty list.  ``interpreter`` names the program that
    answered (null when none did).

    :raises ApiError: 400 for another manager; 500 TimeoutError past the
        time limit; 500 for output that is cut off or unreadable.
    """
    manager = request.arg("manager", "pip")
    if manager not in PACKAGE_MANAGERS:
        known = ", ".join(PACKAGE_MANAGERS)
        raise bad_request(
            f"Unsupported package manager {manager!r}; use one of: {known}"
        )
    env = _helper_environment(request)
    argv = package_argv(manager, env)
    empty: dict[str, Any] = {"manager": manager, "packages": [], "interpreter": None}
    if argv is None:
        return empty
    limits = request.rule.limits
    timeout = limits.timeout_seconds
    cap = (
        limits.max_output_bytes
        or defaults.ENDPOINT_LIMITS["packages"]["max_output_bytes"]
    )
    try:
        result = await processes.run_collect(
            request.context.reactor,
            argv,
            children=request.context.children,
            env=env,
            # Never a user-writable cwd: ``python -m`` puts it on sys.path.
            cwd="/",
            timeout=timeout,
            max_output_bytes=cap,
            run_as=_helper_user(request),
        )
    except FileNotFoundError:
        return empty
    if result.timed_out:
        raise limit_exceeded(
            500,
            f"{manager} did not answer within {timeout} seconds",
            Code.TIMEOUT,
            rule=limit_rule(request.rule, "timeout_seconds"),
            type="TimeoutError",
            limit="timeout_seconds",
        )
    if result.truncated:
        raise limit_exceeded(
            500,
            f"the {manager} listing exceeded {cap} bytes",
            Code.INTERNAL,
            rule=limit_rule(request.rule, "max_output_bytes"),
            limit="max_output_bytes",
        )
    found = parse_packages(manager, result.stdout)
    if found is None:
        if manager == "pip" and b"No module named pip" in result.stderr:
            return {**empty, "interpreter": argv[0]}
        tail = result.stderr.decode("utf-8", errors="replace").strip()[-300:]
        raise internal(f"{manager} failed (exit {result.exit_code}): {tail}")
    return {"manager": manager, "packages": found, "interpreter": argv[0]}


def _helper_user(request: ServerRequest) -> Any:
    """
    A root daemon lists packages as ``params.default_user`` (if set), so a
    tool a user dropped on PATH never runs as root.
    """
    if os.geteuid() != 0 or request.rule.params.default_user is None:
        return None
    return command.resolve_user(None, request.rule)


def metrics(request: ServerRequest) -> ServerResponse:
    """
    ``GET /metrics``: the daemon's counters in the Prometheus text format
    (SPEC §20); prometheus_client is loaded on the first scrape.
    """
    from sandboxd.access.held import streams_held
    from sandboxd.access.metrics import render

    context = request.context
    text, content_type = render(context, streams_held(context))
    return ServerResponse(200, raw=text, headers={"content-type": content_type})


HANDLERS = {
    "metrics": metrics,
    "system_info": system_info,
    "env_get": env_get,
    "env_set": env_set,
    "ports": ports,
    "packages": packages,
    "system_metrics": system_metrics,
}
