# -*- test-case-name: tests.policy.test_presets -*-
"""
The five presets, as data in the policy's own rule language.

Each means what the seed's preset of the same name means (a policy written
for the seed's server has the same effect here): ``transfer-only`` leaves
uploads and downloads, ``read-only`` and ``hardened`` turn the process,
terminal, developer-tool and browser groups off, ``locked`` leaves the
template's commands.  Endpoints only sandboxd has follow their group or
their kind (a write endpoint is off wherever the seed's writes are off).

A preset is one layer of rules (rule string ``preset:NAME``), so a policy
document can still override any part of it.
"""

from __future__ import annotations

from typing import Any

#: Endpoints that move a file's bytes in or out, and nothing else.
TRANSFER = (
    "files_upload_stream",
    "files_download_stream",
    "upload",
    "download",
    "files_read_raw",
    "files_write_raw",
    "files_uploads_create",
    "files_uploads_list",
    "files_uploads_get",
    "files_uploads_append",
    "files_uploads_delete",
)

#: Endpoints that change the file system.
FILE_WRITES = (
    "files_mkdir",
    "files_delete",
    "files_move",
    "files_upload_stream",
    "upload",
    "files_extract",
    "files_write_raw",
    "files_uploads_create",
    "files_uploads_append",
    "files_uploads_delete",
)

#: The template's own commands: what ``locked`` leaves.
COMMANDS = ("list_commands", "run_command")

#: What ``hardened`` refuses to every file endpoint.
HARDENED_DENY = (
    "/proc",
    "/sys",
    "/dev",
    "**/.ssh",
    "**/.env",
    "**/.env.*",
    "**/*.pem",
    "**/id_rsa*",
    "**/id_ed25519*",
)

#: The groups that can run programs or drive a browser.
_RUNNING_GROUPS = {
    "process": False,
    "terminal": False,
    "dev_tools": False,
    "browser": False,
    # A language server runs the project's tooling (build scripts, macros).
    "lsp": False,
}


def _only(*ids: str) -> dict[str, dict[str, Any]]:
    """Every endpoint off (core stays on), then ``ids`` on."""
    rules: dict[str, dict[str, Any]] = {"*": {"enabled": False}}
    rules.update({i: {"enabled": True} for i in ids})
    return rules


#: git calls that change a repository or talk to a remote (off in read-only).
_GIT_WRITES = (
    "git_clone",
    "git_fetch",
    "git_pull",
    "git_push",
    "git_job_cancel",
    "git_init",
    "git_add",
    "git_commit",
    "git_branch_create",
    "git_branch_delete",
    "git_checkout",
    "git_reset",
    "git_restore",
    "git_stash",
    "git_remote_add",
    "git_config_set",
)


def _off(*ids: str) -> dict[str, dict[str, Any]]:
    return {i: {"enabled": False} for i in ids}


_HARDENED_FILES = {"paths": {"deny": HARDENED_DENY, "symlinks": "follow"}}

#: preset name -> {"groups": {...}, "defaults": rule, "endpoints": {...}}
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "transfer-only": {"endpoints": _only(*TRANSFER)},
    "read-only": {
        "groups": {**_RUNNING_GROUPS, "code": False},
        "endpoints": _off(*FILE_WRITES, "env_set", *_GIT_WRITES),
    },
    "hardened": {
        "groups": dict(_RUNNING_GROUPS),
        "defaults": {"audit": "deny", "paths": {"hard_links": "deny_writes"}},
        "endpoints": {
            "group:code": {"params": {"allow_stdin": False}},
            "env_set": {"enabled": False},
            "files_*": _HARDENED_FILES,
            "upload": _HARDENED_FILES,
            "download": _HARDENED_FILES,
            # Beyond the seed: if a policy turns the browser back on, it
            # still cannot reach private networks.
            "group:browser": {"params": {"block_private_networks": True}},
            # Previews are opened with a link or a token, never by anyone.
            "group:preview": {"params": {"allow_public": False}},
            "group:git": {"params": {"allow_hard_reset": False}},
        },
    },
    "locked": {"endpoints": _only(*COMMANDS)},
}
