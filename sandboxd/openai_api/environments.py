# -*- test-case-name: tests.openai_api.test_environments -*-
"""
Environments (``client.beta.agents.environments``): a named working
directory (checked by the path rule when made), environment variables
(checked as any child's), files staged into it (:mod:`.staging`), maybe
from a template (:mod:`.templates`), and vaults whose credentials the
agent's MCP tools get; a session names one with ``environment.id``.

Only ``self_hosted`` environments exist here: the agent runs in this
sandbox.  A create that cannot stage every file stages none and stores
nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from sandboxd.access.guard import PathGuard
from sandboxd.errors import bad_request, not_found
from sandboxd.openai_api import staging, templates, vaults
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.registry import (
    door,
    owner_of,
    page,
    page_limit,
    restored_first,
)
from sandboxd.openai_api.stores import stores
from sandboxd.policy import defaults
from sandboxd.processes.environment import validate_env
from sandboxd.web.messages import ServerRequest


def _checked(request: ServerRequest, body: dict[str, Any]) -> dict[str, Any]:
    for key in body:
        if key not in ("environment", "vault_ids"):
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)
    env = body.get("environment")
    if not isinstance(env, dict):
        raise bad_request("'environment' is required", param="environment")
    templates.refuse_hosted(env, "environment.")
    kind = env.get("type", "self_hosted")
    configured = {k for k, v in env.items() if v and k != "type"}
    if kind not in ("self_hosted", "openai_hosted") or (
        kind == "openai_hosted" and configured
    ):
        raise bad_request(
            "environment.type must be self_hosted", param="environment.type"
        )
    where = env.get("workspace_directory")
    if where is not None and not isinstance(where, str):
        raise bad_request(
            "environment.workspace_directory must be a path",
            param="environment.workspace_directory",
        )
    return {
        "workspace_directory": PathGuard(request.rule).cwd(where),
        "env": validate_env(env.get("env")),
        "vault_ids": vaults.vault_ids(request, body.get("vault_ids"), "vault_ids"),
    }


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """The ``agent.environment`` object (its variables' values are never shown)."""
    return {
        "id": record["id"],
        "object": "agent.environment",
        "type": "self_hosted",
        "status": "ready",
        "files": [
            {
                "id": staging.file_id(rel),
                "type": "inline",
                "path": staging.shown_path(rel),
                "size_bytes": size,
            }
            for rel, size in record.get("files", {}).items()
        ],
        "plugins": [],
        "skills": [],
        "capability_directories": [],
        "workspace_directory": record["workspace_directory"],
        "vault_ids": list(record.get("vault_ids", [])),
        "created_at": record["created_at"],
    }


def find(request: ServerRequest, environment_id: str, param: str) -> dict[str, Any]:
    """The caller's environment, or 404."""
    record: dict[str, Any] | None = door(request).environments.get(environment_id)
    if record is None or record["owner"] != owner_of(request):
        raise not_found(f"No environment found with id {environment_id!r}", param=param)
    return record


def _readers(
    request: ServerRequest, specs: list[dict[str, Any]]
) -> list[staging.Staged]:
    """What :func:`staging.stage` reads each file's bytes with."""
    store = stores(request).files
    limit = request.rule.limits.max_bytes or defaults.OPENAI_FILE_BYTES
    out: list[staging.Staged] = []
    for spec in specs:
        if spec["type"] == "inline":
            out.append((spec["path"], _given(spec["data"])))
            continue
        record = store.find(owner_of(request), spec["file_id"])
        if record is None:
            raise not_found(
                f"No file found with id {spec['file_id']!r}", param="file_id"
            )
        path = store.path(record)

        def read(path: str = path, file_id: str = spec["file_id"]) -> bytes:
            try:
                with open(path, "rb") as f:
                    return f.read(limit + 1)
            except FileNotFoundError:  # deleted since it was checked
                raise not_found(
                    f"No file found with id {file_id!r}", param="file_id"
                ) from None

        out.append((spec["path"], read))
    return out


def _given(data: bytes) -> Callable[[], bytes]:
    """A reader of bytes already in hand."""
    return lambda: data


async def _stage(
    request: ServerRequest, root: str, specs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Stage ``specs`` into ``root`` on a worker thread, all or none."""
    if not specs:
        return []
    limit = request.rule.limits.max_bytes or defaults.OPENAI_FILE_BYTES
    await stores(request).files.ready(request.context.in_thread)
    readers = _readers(request, specs)
    guard = PathGuard.for_request(request)
    staged: list[dict[str, Any]] = await request.context.in_thread(
        staging.stage, guard, root, readers, limit
    )
    return staged


async def agents_environments_create(request: ServerRequest) -> dict[str, Any]:
    """Store an environment, its template's and its own files staged first."""
    body = request.body
    fields = _checked(request, body)
    env = body["environment"]
    reg = door(request)
    mine = [r for r in reg.environments.values() if r["owner"] == owner_of(request)]
    if len(mine) >= defaults.AGENT_KEPT_ITEMS:
        raise bad_request(
            f"at most {defaults.AGENT_KEPT_ITEMS} environments per identity"
        )
    specs: list[dict[str, Any]] = []
    if env.get("environment_template_id") is not None:
        template = templates.find(
            request,
            str(env["environment_template_id"]),
            "environment.environment_template_id",
        )
        fields["env"] = {**template["env"], **fields["env"]}
        specs = list(template["files"])
    own = await templates.file_specs(request, env.get("files"), "environment.files")
    ours = {s["path"] for s in own}
    specs = [s for s in specs if s["path"] not in ours] + own
    most = request.rule.limits.max_files or defaults.OPENAI_MAX_STAGED_FILES
    if len(specs) > most:
        raise bad_request(
            f"at most {most} files per environment", param="environment.files"
        )
    staged = await _stage(request, fields["workspace_directory"], specs)
    record = {
        "id": new_id("env_"),
        "owner": owner_of(request),
        "created_at": int(time.time()),
        **fields,
        "files": {f["path"]: f["size_bytes"] for f in staged},
    }
    reg.environments[record["id"]] = record
    return describe(record)


def agents_environments_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's environments (all ``self_hosted``)."""
    kind = request.query.get("type")
    mine = [
        describe(r)
        for r in door(request).environments.values()
        if r["owner"] == owner_of(request) and kind in (None, "self_hosted")
    ]
    return page(request, mine)


def agents_environments_get(request: ServerRequest) -> dict[str, Any]:
    """One environment."""
    return describe(
        find(request, request.path_params["environment_id"], "environment_id")
    )


async def agents_environment_files_create(request: ServerRequest) -> dict[str, Any]:
    """Stage one more file into an environment's workspace (never replacing one)."""
    record = find(request, request.path_params["environment_id"], "environment_id")
    specs = await templates.file_specs(request, [request.body], "file")
    staged = await _stage(request, record["workspace_directory"], specs)
    rel, size = staged[0]["path"], staged[0]["size_bytes"]
    record.setdefault("files", {})[rel] = size
    return {
        "object": "agent.environment.file",
        "environment_id": record["id"],
        "path": staging.shown_path(rel),
        "size_bytes": size,
    }


async def agents_environment_files_list(request: ServerRequest) -> dict[str, Any]:
    """
    The regular files of an environment's workspace, by path: ``path`` a
    prefix, ``page`` the token of the previous answer's ``next``.
    """
    record = find(request, request.path_params["environment_id"], "environment_id")
    q = request.query
    limit = page_limit(request)
    order = q.get("order", "asc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be asc or desc", param="order")
    token = q.get("page") or "o0"
    if not token.startswith("o") or not token[1:].isdigit():
        raise bad_request("'page' is not a token this list gave", param="page")
    offset = int(token[1:])
    lim = request.rule.limits
    found: list[str] = await request.context.in_thread(
        staging.listing,
        record["workspace_directory"],
        q.get("path"),
        lim.max_entries or 10000,
        lim.max_depth or 20,
    )
    if order == "desc":
        found.reverse()
    root = record["workspace_directory"]
    sizes: list[int] = await request.context.in_thread(
        _sizes, root, found[offset : offset + limit]
    )
    data = [
        {
            "object": "agent.environment.file",
            "environment_id": record["id"],
            "path": staging.shown_path(rel),
            "size_bytes": size,
        }
        for rel, size in zip(found[offset : offset + limit], sizes, strict=True)
    ]
    more = offset + limit < len(found)
    return {
        "object": "list",
        "data": data,
        "has_more": more,
        "next": f"o{offset + limit}" if more else None,
    }


def _sizes(root: str, rels: list[str]) -> list[int]:
    """The sizes of workspace files (0 for one gone since the listing)."""
    out = []
    for rel in rels:
        try:
            out.append(os.lstat(os.path.join(root, rel)).st_size)
        except OSError:
            out.append(0)
    return out


HANDLERS: dict[str, Any] = {
    "agents_environments_create": agents_environments_create,
    "agents_environments_list": agents_environments_list,
    "agents_environments_get": agents_environments_get,
    "agents_environment_files_create": agents_environment_files_create,
    "agents_environment_files_list": agents_environment_files_list,
}
HANDLERS = restored_first(HANDLERS)
