"""
The vault the ``/v1`` tests share: one static bearer token for one MCP
server, and an inline agent with a tool on that server.
"""

from __future__ import annotations

from typing import Any

#: A credential's secret, and the MCP server it is for.
TOKEN = "tok-0123456789abcdefSECRET"
SERVER = "https://mcp.example.com/mcp"


def mcp_agent(**extra: Any) -> dict[str, Any]:
    """An inline agent with one MCP tool on :data:`SERVER`."""
    tool = {
        "type": "mcp",
        "server_label": "docs",
        "transport": {"type": "http", "server_url": SERVER},
    }
    tool.update(extra)
    return {"model": "fake", "tools": [tool]}


def bearer_vault(agents: Any) -> tuple[Any, Any]:
    """
    A new vault holding one credential named ``docs``: :data:`TOKEN` as a
    static bearer for :data:`SERVER`.  Called from an SDK thread with the
    SDK's ``client.beta.agents``.

    :return: the vault and the credential, as the SDK answered them.
    """
    vault = agents.vaults.create(name="v")
    credential = agents.vaults.credentials.create(
        vault.id,
        name="docs",
        auth={"type": "static_bearer", "mcp_server_url": SERVER, "token": TOKEN},
    )
    return vault, credential
