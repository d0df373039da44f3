"""
Language servers for agents (the ``lsp`` group): one server child per
project and user, spoken to over its stdio, asked what an editor asks.
"""
