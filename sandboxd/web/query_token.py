# -*- test-case-name: tests.web.test_query_token -*-
"""
``access_token`` in the query, for the few routes a browser's EventSource
follows (SPEC §20) or opens a WebSocket to (``lsp_connect``): neither can
set headers, so without it a page cannot follow a stream, or talk to a
language server, on a daemon that has a token.

Only GET streaming routes accept it, and ``process_output`` only while
following: a token in a URL ends up in browser history and proxy logs, so
no route that reads or changes anything else takes one. The audit masks
its value (:func:`sandboxd.access.audit.redact_query`).
"""

from __future__ import annotations

from sandboxd.endpoints import Endpoint
from sandboxd.errors import ApiError
from sandboxd.web.params import TRUE_WORDS
from sandboxd.web.target import parse_query

#: Endpoint ids whose GET accepts ``access_token`` in the query.
QUERY_TOKEN_ENDPOINTS = frozenset(
    {
        "files_watch",
        "process_output",
        "agents_events",
        "git_job_events",
        "code_execution_events",
        # A browser's WebSocket cannot set headers either (as the terminal
        # socket's ``access_token``): an editor in a page passes a link here.
        "lsp_connect",
    }
)
#: Of those, the ones that accept it only with ``follow=true``.
FOLLOW_ONLY = frozenset({"process_output"})

PARAM = "access_token"


def query_token(endpoint: Endpoint, method: str, raw_query: bytes) -> bytes | None:
    """
    The ``access_token`` this request may authenticate with, or None.

    A query that does not parse gives None here; step 5 refuses it with
    its own error.
    """
    if method not in ("GET", "HEAD") or endpoint.id not in QUERY_TOKEN_ENDPOINTS:
        return None
    if PARAM.encode() not in raw_query:
        return None
    try:
        query = parse_query(raw_query)
    except ApiError:
        return None
    if endpoint.id in FOLLOW_ONLY and (
        query.get("follow", "").strip().lower() not in TRUE_WORDS
    ):
        return None
    token = query.get(PARAM, "").strip()
    return token.encode("utf-8") if token else None
