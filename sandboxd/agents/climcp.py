# -*- test-case-name: tests.agents.test_climcp -*-
"""
A session's MCP servers (ACP's ``mcpServers``) as each headless CLI takes
them, for :mod:`sandboxd.agents.clibridge`.

A server's headers and environment are often credentials (a vault's token
in an ``Authorization`` header), and a command line is readable by every
user of the machine (``/proc/PID/cmdline``), where a process's environment
and open files are its owner's alone. So nothing secret goes in an
argument:

- codex takes its servers as ``-c`` overrides; a header's value reaches it
  through a variable of its environment named in ``env_http_headers``,
  and a stdio server's variables through ``env_vars`` (which codex hands
  on from its own environment);
- qwen and claude read a JSON file named by ``--mcp-config``; the bridge
  hands it over as an open file with no name on disk, gone with the turn.

Only the standard library is imported (the bridge runs as its own process).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: An MCP server's name: a ``-c`` key for codex, where nothing may end or
#: quote it.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: An HTTP header's name (RFC 9110's token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
#: An environment variable's name.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


class Refused(ValueError):
    """The servers cannot be handed to this CLI; the message says why."""


@dataclass(frozen=True)
class Server:
    """One MCP server, checked."""

    name: str
    #: ``stdio``, ``http`` (streamable HTTP) or ``sse``.
    transport: str
    url: str = ""
    command: str = ""
    args: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Handover:
    """What a turn's CLI is given so that it has the session's servers."""

    #: Arguments added to its command line (nothing secret).
    args: list[str] = field(default_factory=list)
    #: Variables added to its environment.
    env: dict[str, str] = field(default_factory=dict)
    #: The JSON it reads through ``--mcp-config``, if any.
    config: bytes | None = None


def _pairs(
    value: Any, what: str, server: str, name: re.Pattern[str]
) -> list[tuple[str, str]]:
    """ACP's ``[{"name", "value"}]`` list, each name and value checked."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refused(f"MCP server {server!r}: {what} must be a list of name and value")
    pairs: list[tuple[str, str]] = []
    for item in value:
        if not isinstance(item, dict):
            raise Refused(
                f"MCP server {server!r}: {what} must be a list of name and value"
            )
        key, text = item.get("name"), item.get("value")
        if not isinstance(key, str) or not name.fullmatch(key):
            raise Refused(f"MCP server {server!r}: {what} name {key!r} is not valid")
        if not isinstance(text, str) or any(c in text for c in "\r\n\0"):
            raise Refused(
                f"MCP server {server!r}: the value of {what} {key!r} is not valid"
            )
        if any(key == seen for seen, _ in pairs):
            raise Refused(f"MCP server {server!r}: {what} {key!r} is given twice")
        pairs.append((key, text))
    return pairs


def server(raw: Any) -> Server:
    """One of ACP's ``mcpServers`` entries, checked."""
    if not isinstance(raw, dict):
        raise Refused("mcpServers must be a list of objects")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise Refused(
            f"MCP server name {name!r}: 1 to 64 letters, digits, - and _ for a CLI"
        )
    transport = raw.get("type") or "stdio"
    if transport in ("http", "sse"):
        url = raw.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise Refused(f"MCP server {name!r}: url must be an http or https URL")
        headers = _pairs(raw.get("headers"), "header", name, _HEADER_NAME)
        return Server(name, transport, url=url, headers=tuple(headers))
    if transport != "stdio":
        raise Refused(f"MCP server {name!r}: no transport {transport!r}")
    command = raw.get("command")
    if not isinstance(command, str) or not command:
        raise Refused(f"MCP server {name!r} has no url or command")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise Refused(f"MCP server {name!r}: args must be a list of strings")
    env = _pairs(raw.get("env"), "variable", name, _ENV_NAME)
    return Server(name, "stdio", command=command, args=tuple(args), env=tuple(env))


def servers(raw: list[Any]) -> list[Server]:
    """ACP's ``mcpServers``, each checked, no name twice."""
    checked = [server(item) for item in raw]
    names = [s.name for s in checked]
    for name in names:
        if names.count(name) > 1:
            raise Refused(f"two MCP servers are named {name!r}")
    return checked


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(map(toml_string, values)) + "]"


def secret_variable(index: int, header: int) -> str:
    """
    The variable of codex's environment holding a header's value: a name
    of ours, with ``SECRET`` in it, which codex's default filter keeps out
    of the commands it runs.
    """
    return f"SANDBOXD_MCP_SECRET_{index}_{header}"


def for_codex(checked: list[Server]) -> Handover:
    """``-c mcp_servers.NAME.…`` overrides, and the environment they name."""
    args: list[str] = []
    env: dict[str, str] = {}
    for index, s in enumerate(checked):
        base = f"mcp_servers.{s.name}"
        if s.transport == "sse":
            raise Refused(
                f"MCP server {s.name!r}: codex takes stdio and streamable HTTP "
                "servers, not SSE"
            )
        if s.transport == "http":
            args += ["-c", f"{base}.url={toml_string(s.url)}"]
            if s.headers:
                named = {
                    header: secret_variable(index, number)
                    for number, (header, _) in enumerate(s.headers)
                }
                table = ", ".join(
                    f"{toml_string(header)} = {toml_string(variable)}"
                    for header, variable in named.items()
                )
                args += ["-c", f"{base}.env_http_headers={{{table}}}"]
                for header, value in s.headers:
                    env[named[header]] = value
            continue
        args += ["-c", f"{base}.command={toml_string(s.command)}"]
        if s.args:
            args += ["-c", f"{base}.args={_toml_list(list(s.args))}"]
        if s.env:
            args += ["-c", f"{base}.env_vars={_toml_list([k for k, _ in s.env])}"]
            for key, value in s.env:
                if env.get(key, value) != value:
                    raise Refused(
                        f"MCP servers give {key!r} two values, and codex hands its "
                        "servers one environment"
                    )
                env[key] = value
    return Handover(args=args, env=env)


def _config(entries: dict[str, Any]) -> bytes:
    return json.dumps({"mcpServers": entries}, ensure_ascii=False).encode()


def for_claude(checked: list[Server]) -> Handover:
    """claude's ``--mcp-config`` JSON."""
    entries: dict[str, Any] = {}
    for s in checked:
        if s.transport == "stdio":
            entries[s.name] = {
                "type": "stdio",
                "command": s.command,
                "args": list(s.args),
                "env": dict(s.env),
            }
        else:
            entries[s.name] = {
                "type": s.transport,
                "url": s.url,
                "headers": dict(s.headers),
            }
    return Handover(config=_config(entries) if entries else None)


def for_qwen(checked: list[Server]) -> Handover:
    """qwen's ``--mcp-config`` JSON (``httpUrl`` for streamable HTTP, ``url`` for SSE)."""
    entries: dict[str, Any] = {}
    for s in checked:
        if s.transport == "stdio":
            entries[s.name] = {
                "command": s.command,
                "args": list(s.args),
                "env": dict(s.env),
            }
        else:
            key = "httpUrl" if s.transport == "http" else "url"
            entries[s.name] = {key: s.url, "headers": dict(s.headers)}
    return Handover(config=_config(entries) if entries else None)


HANDOVERS = {"codex": for_codex, "qwen": for_qwen, "claude": for_claude}


def handover(cli: str, raw: list[Any]) -> Handover:
    """How ``cli`` gets the servers ACP named (``Refused`` if it cannot)."""
    return HANDOVERS[cli](servers(raw))
