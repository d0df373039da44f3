# -*- test-case-name: tests.openai_api.test_environments -*-
"""
Environment templates (``client.beta.agents.environments.templates``):
variables and files an environment starts from
(``environment.environment_template_id``); the request's own variables and
files go on top.

A template's paths and variables are checked when it is stored, so a bad
one is refused then, not at every environment made from it.  Its inline
files are kept with it (bounded by the request size and
:data:`~sandboxd.policy.defaults.OPENAI_MAX_TEMPLATES` per identity; with a
state dir, in its 0600 file under it); a
``file_id`` is read from the caller's files when an environment is made.
OpenAI's hosted settings (network, packages, setup commands, plugins,
skills, desktop) are refused: the agent runs in this sandbox as it is.
"""

from __future__ import annotations

import time
from typing import Any

from sandboxd.errors import bad_request, not_found
from sandboxd.openai_api import files, staging
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.inputs import known_keys
from sandboxd.openai_api.registry import owner_of, page, restored_first
from sandboxd.openai_api.stores import owned, room_for_one, stores
from sandboxd.policy import defaults
from sandboxd.processes.environment import validate_env
from sandboxd.web.messages import ServerRequest

#: OpenAI's settings of a hosted environment: refused when set.
HOSTED = (
    "network",
    "packages",
    "setup_commands",
    "plugins",
    "skills",
    "desktop",
    "container_size",
    "capability_directories",
)


def refuse_hosted(body: dict[str, Any], where: str) -> None:
    """A hosted environment's setting, set: 400 (never silently ignored)."""
    for key in HOSTED:
        if body.get(key):
            raise bad_request(
                f"{where}{key}: a hosted environment's setting; the agent runs "
                "in this sandbox",
                param=f"{where}{key}",
            )


async def file_specs(
    request: ServerRequest, value: Any, param: str
) -> list[dict[str, Any]]:
    """
    Files to stage, checked: ``[{type: inline, path, data: bytes}]`` or
    ``[{type: file_id, path, file_id}]`` (the caller's file must exist).
    """
    if value is None:
        return []
    most = defaults.OPENAI_MAX_STAGED_FILES
    if not isinstance(value, list) or len(value) > most:
        raise bad_request(f"{param}: a list of at most {most} files", param=param)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, spec in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(spec, dict):
            raise bad_request(f"{where} must be an object", param=where)
        kind = spec.get("type")
        rel = staging.relative(spec.get("path"), f"{where}.path")
        if rel in seen:
            raise bad_request(f"{where}.path: the same path twice", param=where)
        seen.add(rel)
        if kind == "inline":
            known_keys(spec, ("type", "path", "data"))
            data = staging.decode(spec.get("data"), f"{where}.data")
            out.append({"type": "inline", "path": rel, "data": data})
        elif kind == "file_id":
            known_keys(spec, ("type", "path", "file_id"))
            file_id = spec.get("file_id")
            if not isinstance(file_id, str):
                raise bad_request(f"{where}.file_id is required", param=where)
            await files.find(request, file_id, f"{where}.file_id")
            out.append({"type": "file_id", "path": rel, "file_id": file_id})
        else:
            raise bad_request(
                f"{where}.type must be inline or file_id", param=f"{where}.type"
            )
    return out


def describe_files(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A template's files as shown (never their bytes)."""
    return [
        {
            "type": "inline",
            "path": staging.shown_path(s["path"]),
            "size_bytes": len(s["data"]),
        }
        if s["type"] == "inline"
        else {
            "type": "file_id",
            "file_id": s["file_id"],
            "path": staging.shown_path(s["path"]),
        }
        for s in specs
    ]


def describe(record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``agent.environment.template`` (variables' values never shown)."""
    return {
        "id": record["id"],
        "object": "agent.environment.template",
        "created_at": record["created_at"],
        "updated_at": record["updated_at"],
        "name": record["name"],
        "files": describe_files(record["files"]),
        "capability_directories": [],
        "network": {"access": "enabled", "allowed_domains": []},
        "packages": {"npm": [], "python": [], "system": []},
        "plugins": [],
        "skills": [],
        "desktop": None,
    }


def find(request: ServerRequest, template_id: str, param: str) -> dict[str, Any]:
    """The caller's template, or 404."""
    record = stores(request).templates.get(template_id)
    if record is None or record["owner"] != owner_of(request):
        raise not_found(
            f"No environment template found with id {template_id!r}", param=param
        )
    return record


def _name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise bad_request(
            "name must be a string of at most 256 characters", param="name"
        )
    return value


async def _fields(request: ServerRequest, body: dict[str, Any]) -> dict[str, Any]:
    known_keys(body, ("name", "env", "files", *HOSTED))
    refuse_hosted(body, "")
    out: dict[str, Any] = {}
    if "name" in body:
        out["name"] = _name(body["name"])
    if "env" in body:
        out["env"] = validate_env(body["env"])
    if "files" in body:
        out["files"] = await file_specs(request, body["files"], "files")
    return out


async def agents_environment_templates_create(request: ServerRequest) -> dict[str, Any]:
    """Store a template."""
    fields = await _fields(request, request.body)
    s = stores(request)
    mine = owned(s.templates, owner_of(request))
    room_for_one(len(mine), defaults.OPENAI_MAX_TEMPLATES, "templates")
    now = int(time.time())
    record = {
        "id": new_id("envtmpl_"),
        "owner": owner_of(request),
        "created_at": now,
        "updated_at": now,
        "name": None,
        "env": {},
        "files": [],
        **fields,
    }
    s.templates[record["id"]] = record
    return describe(record)


def agents_environment_templates_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's templates."""
    mine = owned(stores(request).templates, owner_of(request))
    return page(request, [describe(r) for r in mine])


def agents_environment_templates_get(request: ServerRequest) -> dict[str, Any]:
    """One template."""
    return describe(find(request, request.path_params["template_id"], "template_id"))


async def agents_environment_templates_update(request: ServerRequest) -> dict[str, Any]:
    """Change a template (what is given replaces what it had)."""
    record = find(request, request.path_params["template_id"], "template_id")
    fields = await _fields(request, request.body)
    record.update(fields, updated_at=int(time.time()))
    return describe(record)


def agents_environment_templates_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget a template (environments made from it keep their files)."""
    record = find(request, request.path_params["template_id"], "template_id")
    stores(request).templates.pop(record["id"], None)
    return {
        "id": record["id"],
        "object": "agent.environment.template.deleted",
        "deleted": True,
    }


HANDLERS: dict[str, Any] = {
    "agents_environment_templates_create": agents_environment_templates_create,
    "agents_environment_templates_list": agents_environment_templates_list,
    "agents_environment_templates_get": agents_environment_templates_get,
    "agents_environment_templates_update": agents_environment_templates_update,
    "agents_environment_templates_delete": agents_environment_templates_delete,
}
HANDLERS = restored_first(HANDLERS)
