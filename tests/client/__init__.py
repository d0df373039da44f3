"""Tests of sandboxd.client and the client-side CLI, against a real daemon."""
