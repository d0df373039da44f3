"""Tests of the agent-sandbox runtime protocol's door (sandboxd.kep)."""
