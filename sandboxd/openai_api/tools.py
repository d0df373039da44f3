# -*- test-case-name: tests.openai_api.test_vaults -*-
"""
An agent's MCP tools (``agent.tools`` of a definition or of a session's
inline agent) and how they reach the ACP agent.

Only ``mcp`` tools over HTTP are taken: the agent's own tools run, and a
stdio MCP server would be one more command the agent starts.  At session
creation each tool becomes an entry of ACP's ``mcpServers`` in
``session/new`` — governed by the policy's ``params.mcp_servers`` like any
session's — with its headers and, when a credential of the session's
vaults matches the server's origin (or the tool names one), an
``Authorization: Bearer`` header carrying the credential's secret.  So a
secret is handed to that session's agent alone, through the protocol,
never through an environment variable another process could read; the
session's outputs mask it (:mod:`.redact`).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from sandboxd.errors import ambiguous_credentials, bad_request, not_found
from sandboxd.openai_api import vaults
from sandboxd.openai_api.inputs import known_keys
from sandboxd.openai_api.stores import stores
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest

#: What a header value shows in answers.
MASK = "***"
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")


def _server_url(value: Any, param: str) -> str:
    if not isinstance(value, str) or len(value) > 2048:
        raise bad_request(f"{param} must be a URL", param=param)
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad_request(f"{param} must be an http or https URL", param=param)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise bad_request(
            f"{param} must not carry a user, a query or a fragment", param=param
        )
    return value


def _headers(value: Any, param: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 32:
        raise bad_request(
            f"{param} must be an object of at most 32 headers", param=param
        )
    out = {}
    for name, text in value.items():
        if not _HEADER.match(name) or not isinstance(text, str) or len(text) > 8192:
            raise bad_request(
                f"{param}.{name}: a header name and a one-line value", param=param
            )
        if any(c in text for c in "\r\n\x00"):
            raise bad_request(
                f"{param}.{name}: a header value is one line", param=param
            )
        out[name] = text
    return out


def _tool(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") != "mcp":
        raise bad_request(
            f"{param}: only mcp tools can be added (the agent's own tools run)",
            param=param,
        )
    known_keys(
        value,
        (
            "type",
            "server_label",
            "transport",
            "credential_id",
            "allowed_tools",
            "connection_origin",
            "required",
            "request_metadata",
        ),
    )
    label = value.get("server_label")
    if not isinstance(label, str) or not _LABEL.match(label):
        raise bad_request(
            f"{param}.server_label: 1-40 letters, digits, '_' or '-'",
            param=f"{param}.server_label",
        )
    for key, empty in (
        ("allowed_tools", (None, [])),
        ("request_metadata", (None, {})),
        ("required", (None, False)),
        ("connection_origin", (None, "environment")),
    ):
        if value.get(key) not in empty:
            raise bad_request(
                f"{param}.{key}: the agent cannot be held to it here",
                param=f"{param}.{key}",
            )
    transport = value.get("transport")
    if not isinstance(transport, dict) or transport.get("type") != "http":
        raise bad_request(
            f"{param}.transport: an http MCP server (a stdio one is a command "
            "the agent would run)",
            param=f"{param}.transport",
        )
    known_keys(transport, ("type", "server_url", "headers", "authorization"))
    authorization = transport.get("authorization")
    if authorization is not None and (
        not isinstance(authorization, str)
        or any(c in authorization for c in "\r\n\x00")
    ):
        raise bad_request(
            f"{param}.transport.authorization must be one line",
            param=f"{param}.transport.authorization",
        )
    credential_id = value.get("credential_id")
    if credential_id is not None and not isinstance(credential_id, str):
        raise bad_request(
            f"{param}.credential_id must be a string", param=f"{param}.credential_id"
        )
    return {
        "server_label": label,
        "server_url": _server_url(
            transport.get("server_url"), f"{param}.transport.server_url"
        ),
        "headers": _headers(transport.get("headers"), f"{param}.transport.headers"),
        "authorization": authorization,
        "credential_id": credential_id,
    }


def parse_tools(value: Any, param: str = "tools") -> list[dict[str, Any]]:
    """
    An agent's ``tools``, checked (their header values kept, to be sent
    to the agent and never shown).
    """
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > defaults.OPENAI_MAX_TOOLS:
        raise bad_request(
            f"{param}: a list of at most {defaults.OPENAI_MAX_TOOLS} tools", param=param
        )
    tools = [_tool(t, f"{param}[{i}]") for i, t in enumerate(value)]
    labels = [t["server_label"] for t in tools]
    if len(set(labels)) != len(labels):
        raise bad_request(f"{param}: server labels must be unique", param=param)
    return tools


def describe_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as answers show them: every header value masked."""
    out = []
    for tool in tools:
        headers = {name: MASK for name in tool["headers"]}
        if tool["authorization"] is not None:
            headers["Authorization"] = MASK
        out.append(
            {
                "type": "mcp",
                "server_label": tool["server_label"],
                "transport": {
                    "type": "http",
                    "server_url": tool["server_url"],
                    "headers": headers,
                },
                "allowed_tools": None,
                "connection_origin": "environment",
                "credential_id": tool["credential_id"],
                "request_metadata": {},
                "required": False,
            }
        )
    return out


def _credential_for(
    request: ServerRequest, tool: dict[str, Any], held: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The credential of the session's vaults a tool is bound to, if any."""
    where = vaults.origin(tool["server_url"])
    if tool["credential_id"] is not None:
        found = next((c for c in held if c["id"] == tool["credential_id"]), None)
        if found is None:
            raise not_found(
                f"No credential {tool['credential_id']!r} in the session's vaults",
                param="credential_id",
            )
        if vaults.origin(found["auth"]["mcp_server_url"]) != where:
            raise bad_request(
                f"credential {found['id']!r} is for another server than "
                f"{tool['server_label']!r}",
                param="credential_id",
            )
        return found
    matching = [c for c in held if vaults.origin(c["auth"]["mcp_server_url"]) == where]
    if len(matching) > 1:
        raise ambiguous_credentials(
            f"{len(matching)} credentials of the session's vaults match the MCP "
            f"server of {tool['server_label']!r}; name one with credential_id"
        )
    return matching[0] if matching else None


def bind(
    request: ServerRequest, tools: list[dict[str, Any]], vault_ids: list[str]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """
    ACP's ``mcpServers`` for ``tools`` with the credentials of
    ``vault_ids`` injected; the ids of the credentials used; and every
    secret value handed over (for the session's redaction).

    :raises ApiError: 404 for a named credential outside the vaults, 400
        for one of another server or an expired one, 400
        ``ambiguous_credentials`` when two match.
    """
    held = vaults.credentials_of(request, vault_ids)
    servers: list[dict[str, Any]] = []
    used: list[str] = []
    secrets: list[str] = []
    for tool in tools:
        headers = dict(tool["headers"])
        if tool["authorization"] is not None:
            headers["Authorization"] = tool["authorization"]
        credential = _credential_for(request, tool, held)
        if credential is not None:
            if vaults.expired(credential):
                raise bad_request(
                    f"credential {credential['id']!r} has expired; rotate it",
                    param="credential_id",
                )
            headers["Authorization"] = f"Bearer {credential['secret']}"
            used.append(credential["id"])
            secrets.append(credential["secret"])
        secrets.extend(v for v in headers.values())
        servers.append(
            {
                "type": "http",
                "name": tool["server_label"],
                "url": tool["server_url"],
                "headers": [{"name": k, "value": v} for k, v in headers.items()],
            }
        )
    return servers, used, secrets


def check_bound(request: ServerRequest, credential_ids: list[str]) -> None:
    """
    A session's credentials still stand before a new turn: deleted ones
    (404) or expired ones (400) stop it.
    """
    held = stores(request).credentials
    for credential_id in credential_ids:
        credential = held.get(credential_id)
        if credential is None:
            raise not_found(
                f"the session's credential {credential_id!r} was deleted",
                param="credential_id",
            )
        if vaults.expired(credential):
            raise bad_request(
                f"the session's credential {credential_id!r} has expired",
                param="credential_id",
            )
