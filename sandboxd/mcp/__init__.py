"""
The MCP door (SPEC §17): every sandboxd endpoint as an MCP tool, served
over Streamable HTTP at ``/mcp`` under the same gate, policy and audit as
the HTTP API (SPEC §16).

- :mod:`sandboxd.mcp.tools`: tools generated from the endpoint table.
- :mod:`sandboxd.mcp.calls`: one ``tools/call`` through the gate into the
  endpoint's handler.
- :mod:`sandboxd.mcp.protocol`: the MCP methods.
- :mod:`sandboxd.mcp.sessions`: sessions and resumable streams.
- :mod:`sandboxd.mcp.door`: the HTTP transport.
"""

from sandboxd.mcp.door import McpDoor

__all__ = ["McpDoor"]
