"""Fake ACP agents for the agents group's tests (run as child processes)."""
