"""
The ``/v1`` door (SPEC §26): the seed's agents API, OpenAI-shaped, over the
ACP engine of :mod:`sandboxd.agents`.

A session here is an agent session there, a turn a prompt turn, its items
and events the engine's folded ACP updates, projected as they happen
(:mod:`.face`).  The routes are ordinary endpoints of the ``agents`` group
(``door="openai"`` in the table): the same gate, policy and audit line as
every other call, answered in OpenAI's error envelope (:mod:`.envelope`).
"""
