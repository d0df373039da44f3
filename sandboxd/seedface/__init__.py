"""
sandboxd's face of the seed's template API: what ``import
agent_sandbox.server`` means to a template's ``commands.py`` loaded by the
daemon (:mod:`~sandboxd.seedface.api` holds the names,
:mod:`~sandboxd.seedface.finder` puts them in place while templates load).
"""
