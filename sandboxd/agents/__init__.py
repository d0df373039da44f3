# -*- test-case-name: tests.test_agents -*-
"""
Coding agents driven over the Agent Client Protocol (SPEC §15).

sandboxd is the ACP *client*: each session is one agent child speaking
newline-delimited JSON-RPC 2.0 on its stdio.  The modules are named for
what they hold: :mod:`.jsonrpc` (framing and the request table),
:mod:`.process` (the child), :mod:`.catalog` (which agents exist),
:mod:`.session` (one session, put together from :mod:`.state` (its fields
and event log), :mod:`.handshake`, :mod:`.configuration`, :mod:`.turns`,
:mod:`.updates` (``session/update`` folded), :mod:`.filechanges` and
:mod:`.heldrequests`), :mod:`.permissions` (the held-request record and
the policy that answers it), :mod:`.terminals` (the agent's own
``terminal/*`` commands), :mod:`.clientside` (``fs/*`` served through the
path guard) and :mod:`.manager` (the service owning every session).
"""
