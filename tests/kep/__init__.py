"""Tests of the KEP door (kubernetes-sigs/agent-sandbox's runtime protocol)."""
