# -*- test-case-name: tests.agents.test_agents -*-
"""
Coding agents driven over the Agent Client Protocol (SPEC §15).

sandboxd is the ACP *client*: each session is one agent child speaking
newline-delimited JSON-RPC 2.0 on its stdio.  The modules are named for
what they hold: :mod:`.jsonrpc` (framing and the request table),
:mod:`.process` (the child), :mod:`.catalog` (which agents exist),
:mod:`.session` (one session: its :mod:`.state` (fields, event log, turn
record, idle timer) and the collaborators it owns, each given that state:
:mod:`.handshake`, :mod:`.configuration`, :mod:`.turns`, :mod:`.updates`
(``session/update`` folded), :mod:`.filechanges`, :mod:`.heldrequests`,
:mod:`.clientside` (``fs/*`` served through the path guard) and
:mod:`.terminalrequests` (the agent's ``terminal/*`` requests)),
:mod:`.permissions` (the held-request record and the policy that answers
it), :mod:`.terminals` (the agent's own commands, each a child) and
:mod:`.manager` (the service owning every session, which imports the rest
only when the first agent starts).

Imports point one way, from :mod:`.manager` down to :mod:`.state` and the
leaves under it; no module names a type of a module above it.
"""
