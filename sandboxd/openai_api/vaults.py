# -*- test-case-name: tests.openai_api.test_vaults -*-
"""
Vaults and their credentials (``client.beta.agents.vaults``): write-only
secrets for the MCP servers an agent's tools name.

A credential's secret (a bearer token, an OAuth access token) is taken at
create or rotation and never shown again: no answer carries its value,
prefix, length or digest.  It reaches an agent only through that agent's
ACP session (the ``Authorization`` header of the matching ``mcpServers``
entry of ``session/new``, see :mod:`.tools`), never through an environment
variable, a file or a command line, and every output of the session
(messages, tool calls, command output, the agent's stderr) has it masked.

``environment_variable`` credentials are refused: with no egress proxy to
swap a placeholder for the secret, the secret itself would have to sit in
the environment of every command the agent runs.

Held per owner in the door's registry; with a state dir they outlive the
daemon in 0600 files (:mod:`.store`), secrets included, and stay
write-only through the API after a restart.
"""

from __future__ import annotations

import datetime
import ipaddress
import time
import urllib.parse
from typing import Any

from sandboxd.errors import bad_request, not_found
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.inputs import known_keys, metadata
from sandboxd.openai_api.registry import (
    matches,
    metadata_filter,
    owner_of,
    page,
    restored_first,
)
from sandboxd.openai_api.stores import owned, room_for_one, stores
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest

#: Host names an MCP credential may not be bound to (they would send the
#: secret to this machine or its network under a public-looking name).
_PRIVATE_SUFFIXES = (".local", ".internal", ".localhost")


# -- checking ---------------------------------------------------------------------


def _name(value: Any, required: bool) -> str | None:
    """A name trimmed, 1-256 UTF-8 bytes."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value.strip().encode()) <= 256:
        raise bad_request("name must be 1-256 UTF-8 bytes after trimming", param="name")
    return value.strip()


def check_server_url(url: Any, param: str) -> str:
    """
    An MCP server URL a secret may be sent to: https, a public host name
    or address, no user, query or fragment.
    """
    if not isinstance(url, str) or len(url) > 2048:
        raise bad_request(f"{param} must be a URL", param=param)
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" or not host:
        raise bad_request(f"{param} must be an https URL", param=param)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise bad_request(
            f"{param} must not carry a user, a query or a fragment", param=param
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        private = host == "localhost" or host.endswith(_PRIVATE_SUFFIXES)
    else:
        private = not address.is_global
    if private:
        raise bad_request(
            f"{param}: {host} is a private or local host; a credential is only "
            "sent to a public MCP server",
            param=param,
        )
    return url


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL: what a credential is bound to."""
    parts = urllib.parse.urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _secret(value: Any, param: str) -> str:
    """A token: one line of at most :data:`~defaults.OPENAI_MAX_TOKEN_CHARS`."""
    limit = defaults.OPENAI_MAX_TOKEN_CHARS
    if (
        not isinstance(value, str)
        or not value
        or len(value) > limit
        or any(c in value for c in "\r\n\x00")
    ):
        raise bad_request(
            f"{param} must be one line of 1-{limit} characters", param=param
        )
    return value


def _expiry(value: Any, param: str) -> str | None:
    """An RFC 3339 time (kept as given), or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{param} must be an RFC 3339 time", param=param)
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(f"{param} must be an RFC 3339 time", param=param) from None
    if when.tzinfo is None:
        raise bad_request(f"{param} needs a time zone", param=param)
    return value


def expired(credential: dict[str, Any], now: float | None = None) -> bool:
    """Whether the credential's access token is past its ``expires_at``."""
    value = credential["auth"].get("expires_at")
    if not value:
        return False
    when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when.timestamp() <= (time.time() if now is None else now)


def _auth(value: Any) -> tuple[dict[str, Any], str]:
    """``(public auth, secret)`` of a create's ``auth``."""
    if not isinstance(value, dict):
        raise bad_request("auth is required", param="auth")
    kind = value.get("type")
    if kind == "static_bearer":
        known_keys(value, ("type", "mcp_server_url", "token"))
        url = check_server_url(value.get("mcp_server_url"), "auth.mcp_server_url")
        return {"type": kind, "mcp_server_url": url}, _secret(
            value.get("token"), "auth.token"
        )
    if kind == "mcp_oauth":
        known_keys(
            value, ("type", "mcp_server_url", "access_token", "expires_at", "refresh")
        )
        if value.get("refresh") is not None:
            raise bad_request(
                "auth.refresh: no token refresh here; rotate the access token instead",
                param="auth.refresh",
            )
        url = check_server_url(value.get("mcp_server_url"), "auth.mcp_server_url")
        public = {
            "type": kind,
            "mcp_server_url": url,
            "expires_at": _expiry(value.get("expires_at"), "auth.expires_at"),
            "refresh": None,
        }
        return public, _secret(value.get("access_token"), "auth.access_token")
    if kind == "environment_variable":
        raise bad_request(
            "auth.type environment_variable: without an egress proxy the secret "
            "would be in the environment of every command the agent runs",
            param="auth.type",
        )
    raise bad_request("auth.type must be static_bearer or mcp_oauth", param="auth.type")


def _rotated(credential: dict[str, Any], value: Any) -> None:
    """Apply an update's ``auth`` (same type; a new secret, a new expiry)."""
    if not isinstance(value, dict):
        raise bad_request("auth must be an object", param="auth")
    kind = credential["auth"]["type"]
    if value.get("type") != kind:
        raise bad_request(
            f"auth.type cannot change (the credential is {kind})", param="auth.type"
        )
    if kind == "static_bearer":
        known_keys(value, ("type", "token"))
        credential["secret"] = _secret(value.get("token"), "auth.token")
        return
    known_keys(value, ("type", "access_token", "expires_at", "refresh"))
    if value.get("refresh") is not None:
        raise bad_request("auth.refresh: no token refresh here", param="auth.refresh")
    if value.get("access_token") is not None:
        credential["secret"] = _secret(value["access_token"], "auth.access_token")
        credential["auth"]["expires_at"] = None  # a new token, a new expiry
    if "expires_at" in value:
        credential["auth"]["expires_at"] = _expiry(
            value["expires_at"], "auth.expires_at"
        )


# -- records --------------------------------------------------------------------


def describe_vault(record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``vault`` object."""
    return {
        "id": record["id"],
        "object": "vault",
        "created_at": record["created_at"],
        "metadata": record["metadata"],
        "name": record["name"],
    }


def describe_credential(record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``vault.credential`` object: never the secret."""
    return {
        "id": record["id"],
        "object": "vault.credential",
        "vault_id": record["vault_id"],
        "name": record["name"],
        "metadata": record["metadata"],
        "auth": dict(record["auth"]),
        "created_at": record["created_at"],
        "updated_at": record["updated_at"],
    }


def find_vault(
    request: ServerRequest, vault_id: str, param: str = "vault_id"
) -> dict[str, Any]:
    """The caller's vault, or 404."""
    record = stores(request).vaults.get(vault_id)
    if record is None or record["owner"] != owner_of(request):
        raise not_found(f"No vault found with id {vault_id!r}", param=param)
    return record


def vault_ids(request: ServerRequest, value: Any, param: str) -> list[str]:
    """A ``vault_ids`` list: at most 16 of the caller's vaults (404 otherwise)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"{param} must be a list of vault ids", param=param)
    if len(value) > 16:
        raise bad_request(f"{param}: at most 16 vaults", param=param)
    for vault_id in value:
        find_vault(request, vault_id, param)
    return list(dict.fromkeys(value))


def credentials_of(request: ServerRequest, vaults: list[str]) -> list[dict[str, Any]]:
    """Every credential of ``vaults`` (the caller's), oldest first."""
    return [
        c
        for c in stores(request).credentials.values()
        if c["vault_id"] in vaults and c["owner"] == owner_of(request)
    ]


def _credential(request: ServerRequest) -> dict[str, Any]:
    vault = find_vault(request, request.path_params["vault_id"])
    credential_id = request.path_params["credential_id"]
    record = stores(request).credentials.get(credential_id)
    if record is None or record["vault_id"] != vault["id"]:
        raise not_found(
            f"No credential found with id {credential_id!r}", param="credential_id"
        )
    return record


def _filtered(
    request: ServerRequest, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The seed's list filters: ``status`` (all active) and ``metadata[KEY]``."""
    status = request.query.get("status", "active")
    if status not in ("active", "archived"):
        raise bad_request("status must be active or archived", param="status")
    if status == "archived":
        return []
    wanted = metadata_filter(request)
    return [r for r in records if matches(r["metadata"], wanted)]


# -- vault routes ------------------------------------------------------------------


def agents_vaults_create(request: ServerRequest) -> dict[str, Any]:
    """Make a vault."""
    body = request.body
    known_keys(body, ("name", "metadata"))
    mine = owned(stores(request).vaults, owner_of(request))
    room_for_one(len(mine), defaults.OPENAI_MAX_VAULTS, "vaults")
    record: dict[str, Any] = {
        "id": new_id("vlt_"),
        "owner": owner_of(request),
        "created_at": int(time.time()),
        "name": _name(body.get("name"), required=False),
        "metadata": metadata(body.get("metadata")),
    }
    stores(request).vaults[record["id"]] = record
    return describe_vault(record)


def agents_vaults_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's vaults."""
    mine = _filtered(request, owned(stores(request).vaults, owner_of(request)))
    return page(request, [describe_vault(r) for r in mine])


def agents_vaults_get(request: ServerRequest) -> dict[str, Any]:
    """One vault."""
    return describe_vault(find_vault(request, request.path_params["vault_id"]))


def agents_vaults_update(request: ServerRequest) -> dict[str, Any]:
    """Rename a vault or replace its metadata."""
    record = find_vault(request, request.path_params["vault_id"])
    body = request.body
    known_keys(body, ("name", "metadata"))
    name = _name(body.get("name"), required=False) if "name" in body else record["name"]
    meta = metadata(body["metadata"]) if "metadata" in body else record["metadata"]
    record.update(name=name, metadata=meta)
    return describe_vault(record)


def agents_vaults_delete(request: ServerRequest) -> dict[str, Any]:
    """Delete a vault and every credential in it."""
    record = find_vault(request, request.path_params["vault_id"])
    s = stores(request)
    for credential_id in [
        c["id"] for c in s.credentials.values() if c["vault_id"] == record["id"]
    ]:
        s.credentials.pop(credential_id, None)
    s.vaults.pop(record["id"], None)
    return {"id": record["id"], "object": "vault.deleted", "deleted": True}


# -- credential routes -----------------------------------------------------------------


def agents_vault_credentials_create(request: ServerRequest) -> dict[str, Any]:
    """Store a credential; its secret is never shown again."""
    vault = find_vault(request, request.path_params["vault_id"])
    body = request.body
    known_keys(body, ("name", "metadata", "auth"))
    name = _name(body.get("name"), required=True)
    meta = metadata(body.get("metadata"))
    public, secret = _auth(body.get("auth"))
    s = stores(request)
    held = [c for c in s.credentials.values() if c["vault_id"] == vault["id"]]
    if len(held) >= defaults.OPENAI_MAX_CREDENTIALS:
        raise bad_request(
            f"at most {defaults.OPENAI_MAX_CREDENTIALS} credentials per vault"
        )
    now = int(time.time())
    record = {
        "id": new_id("cred_"),
        "owner": owner_of(request),
        "vault_id": vault["id"],
        "name": name,
        "metadata": meta,
        "auth": public,
        "secret": secret,
        "created_at": now,
        "updated_at": now,
    }
    s.credentials[record["id"]] = record
    return describe_credential(record)


def agents_vault_credentials_list(request: ServerRequest) -> dict[str, Any]:
    """A vault's credentials (never their secrets)."""
    vault = find_vault(request, request.path_params["vault_id"])
    held = credentials_of(request, [vault["id"]])
    return page(request, [describe_credential(c) for c in _filtered(request, held)])


def agents_vault_credentials_get(request: ServerRequest) -> dict[str, Any]:
    """One credential (never its secret)."""
    return describe_credential(_credential(request))


def agents_vault_credentials_update(request: ServerRequest) -> dict[str, Any]:
    """
    Rotate a credential's secret or expiry, or replace its metadata; the
    name and type stay.  Sessions started before keep the secret they
    were given; a session whose credential expired or was deleted takes
    no new turn.
    """
    record = _credential(request)
    body = request.body
    known_keys(body, ("auth", "metadata"))
    meta = metadata(body["metadata"]) if "metadata" in body else record["metadata"]
    if "auth" in body:
        changed = {**record, "auth": dict(record["auth"])}
        _rotated(changed, body["auth"])
        record.update(secret=changed["secret"], auth=changed["auth"])
    record.update(metadata=meta, updated_at=int(time.time()))
    return describe_credential(record)


def agents_vault_credentials_delete(request: ServerRequest) -> dict[str, Any]:
    """Delete a credential."""
    record = _credential(request)
    stores(request).credentials.pop(record["id"], None)
    return {"id": record["id"], "object": "vault.credential.deleted", "deleted": True}


HANDLERS: dict[str, Any] = {
    "agents_vaults_create": agents_vaults_create,
    "agents_vaults_list": agents_vaults_list,
    "agents_vaults_get": agents_vaults_get,
    "agents_vaults_update": agents_vaults_update,
    "agents_vaults_delete": agents_vaults_delete,
    "agents_vault_credentials_create": agents_vault_credentials_create,
    "agents_vault_credentials_list": agents_vault_credentials_list,
    "agents_vault_credentials_get": agents_vault_credentials_get,
    "agents_vault_credentials_update": agents_vault_credentials_update,
    "agents_vault_credentials_delete": agents_vault_credentials_delete,
}
HANDLERS = restored_first(HANDLERS)
