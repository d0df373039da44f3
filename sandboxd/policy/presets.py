# -*- test-case-name: tests.policy.test_engine -*-
"""
The five presets of SPEC §5.4, as data in the policy's own rule language.

A preset is one layer of rules (rule string ``preset:NAME``), so a policy
document can still override any part of it.
"""

from __future__ import annotations

from typing import Any

_NON_CORE = (
    "commands",
    "file_ops",
    "process",
    "terminal",
    "system",
    "dev_tools",
    "browser",
    "agents",
    "mcp",
    "e2b",
    "code",
)

_FILE_WRITES = (
    "upload",
    "files_mkdir",
    "files_delete",
    "files_move",
    "files_upload_stream",
    "files_extract",
    "files_write_raw",
    "files_uploads_create",
    "files_uploads_append",
)


def _off(*ids: str) -> dict[str, dict[str, Any]]:
    return {i: {"enabled": False} for i in ids}


#: preset name -> {"groups": {...}, "defaults": rule, "endpoints": {...}}
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "transfer-only": {
        "groups": {g: False for g in _NON_CORE if g != "file_ops"},
        "endpoints": _off(
            "files_delete",
            "files_move",
            "files_search",
            "files_archive",
            "files_extract",
            "files_watch",
        ),
    },
    "read-only": {
        "groups": {
            "commands": False,
            "terminal": False,
            "browser": False,
            "agents": False,
            "code": False,
        },
        "defaults": {"paths": {"read_only": ("/",)}},
        "endpoints": _off(
            *_FILE_WRITES,
            "shell",
            "shell_stream",
            "process_start",
            "process_signal",
            "process_stdin",
            "env_set",
            "code_run",
        ),
    },
    "hardened": {
        "defaults": {
            "paths": {
                "symlinks": "deny",
                "hard_links": "deny_writes",
                "deny": ("**/.git/**", "**/.ssh/**", "**/.env"),
            },
            "limits": {"rate_per_minute": 600},
            "audit": "all",
        },
        "endpoints": {
            "group:browser": {"params": {"block_private_networks": True}},
            "group:code": {"params": {"allow_stdin": False}},
            "env_set": {"enabled": False},
        },
    },
    "locked": {"groups": {g: False for g in _NON_CORE}},
}
