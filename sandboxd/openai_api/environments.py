# -*- test-case-name: tests.openai_api.test_definitions -*-
"""
Environments (``client.beta.agents.environments``): a named working
directory (checked by the path rule when made) and environment variables
(checked as any child's), which a session names with ``environment.id``.

Only ``self_hosted`` environments exist here: the agent runs in this
sandbox.  Staged files, templates and vaults are not served yet and are
refused rather than ignored.
"""

from __future__ import annotations

import time
from typing import Any

from sandboxd.errors import bad_request, not_found
from sandboxd.guard import PathGuard
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.registry import door, page
from sandboxd.policy import defaults
from sandboxd.processes.environment import validate_env
from sandboxd.web.messages import ServerRequest

#: Fields of a hosted environment: refused when set.
_HOSTED = (
    "network",
    "packages",
    "setup_commands",
    "plugins",
    "skills",
    "desktop",
    "container_size",
    "capability_directories",
)


def _checked(request: ServerRequest, body: dict[str, Any]) -> dict[str, Any]:
    for key in body:
        if key not in ("environment", "vault_ids"):
            raise bad_request(f"{key}: unknown or unsupported parameter", param=key)
    if body.get("vault_ids"):
        raise not_found(
            f"No vault found with id {body['vault_ids'][0]!r}", param="vault_ids"
        )
    env = body.get("environment")
    if not isinstance(env, dict):
        raise bad_request("'environment' is required", param="environment")
    for key, value in env.items():
        if key in _HOSTED and value:
            raise bad_request(
                f"environment.{key}: a hosted environment's setting; the agent "
                "runs in this sandbox",
                param=f"environment.{key}",
            )
        if key in ("files", "environment_template_id") and value:
            raise bad_request(
                f"environment.{key}: staged files and templates are not supported",
                param=f"environment.{key}",
            )
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
    }


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """The ``agent.environment`` object (its variables' values are never shown)."""
    return {
        "id": record["id"],
        "object": "agent.environment",
        "type": "self_hosted",
        "status": "ready",
        "files": [],
        "plugins": [],
        "skills": [],
        "capability_directories": [],
        "workspace_directory": record["workspace_directory"],
        "vault_ids": [],
        "created_at": record["created_at"],
    }


def find(request: ServerRequest, environment_id: str, param: str) -> dict[str, Any]:
    """The caller's environment, or 404."""
    record: dict[str, Any] | None = door(request).environments.get(environment_id)
    if record is None or record["owner"] != request.identity.id:
        raise not_found(f"No environment found with id {environment_id!r}", param=param)
    return record


def agents_environments_create(request: ServerRequest) -> dict[str, Any]:
    """Store an environment."""
    fields = _checked(request, request.body)
    reg = door(request)
    mine = [r for r in reg.environments.values() if r["owner"] == request.identity.id]
    if len(mine) >= defaults.AGENT_KEPT_ITEMS:
        raise bad_request(
            f"at most {defaults.AGENT_KEPT_ITEMS} environments per identity"
        )
    record = {
        "id": new_id("env_"),
        "owner": request.identity.id,
        "created_at": int(time.time()),
        **fields,
    }
    reg.environments[record["id"]] = record
    return describe(record)


def agents_environments_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's environments (all ``self_hosted``)."""
    kind = request.query.get("type")
    mine = [
        describe(r)
        for r in door(request).environments.values()
        if r["owner"] == request.identity.id and kind in (None, "self_hosted")
    ]
    return page(request, mine)


def agents_environments_get(request: ServerRequest) -> dict[str, Any]:
    """One environment."""
    return describe(
        find(request, request.path_params["environment_id"], "environment_id")
    )


HANDLERS: dict[str, Any] = {
    "agents_environments_create": agents_environments_create,
    "agents_environments_list": agents_environments_list,
    "agents_environments_get": agents_environments_get,
}
