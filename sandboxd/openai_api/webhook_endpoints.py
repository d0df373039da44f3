# -*- test-case-name: tests.openai_api.test_webhooks -*-
"""
The ``/v1`` door's webhook endpoints (``client.webhooks``): register,
list, get, update, delete, rotate the secret, send a test event, and the
event types sent.

An endpoint belongs to the identity that registered it (another gets a
404) and receives that identity's sessions' events; its signing secret is
shown once, at create and at rotation.  Deliveries are
:mod:`.webhooks`'.  With a state dir, endpoints outlive the daemon.
"""

from __future__ import annotations

import time
from typing import Any

from sandboxd.errors import bad_request, not_found, remote_error
from sandboxd.openai_api.face import new_id
from sandboxd.openai_api.inputs import known_keys
from sandboxd.openai_api.registry import door, owner_of, page, restored_first
from sandboxd.openai_api.stores import owned, room_for_one
from sandboxd.openai_api.webhooks import (
    EVENT_TYPES,
    DeliveryFailed,
    attempt,
    check_destination,
    envelope,
    new_secret,
)
from sandboxd.policy import defaults
from sandboxd.web.messages import ServerRequest

_KEYS = ("url", "event_types", "name")


def _event_types(value: Any) -> list[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(e, str) for e in value)
    ):
        raise bad_request(
            "event_types must be a non-empty list of event types", param="event_types"
        )
    for e in value:
        if e not in EVENT_TYPES:
            raise bad_request(
                f"event_types: {e!r} is not sent here; see /v1/webhook_event_types",
                param="event_types",
            )
    return list(dict.fromkeys(value))


def _name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > defaults.OPENAI_MAX_NAME_CHARS:
        raise bad_request(
            f"name must be a string of at most {defaults.OPENAI_MAX_NAME_CHARS} characters",
            param="name",
        )
    return value


def _shown(record: dict[str, Any], secret: bool = False) -> dict[str, Any]:
    """The ``webhook_endpoint`` object (its secret only when just made)."""
    shown = {
        "id": record["id"],
        "object": "webhook_endpoint",
        "created_at": record["created_at"],
        "event_types": list(record["event_types"]),
        "name": record["name"],
        "signing_secret_hint": record["secret"][:10] + "…",
        "url": record["url"],
        "updated_at": record["updated_at"],
    }
    if secret:
        shown["signing_secret"] = record["secret"]
    return shown


def _endpoint(request: ServerRequest) -> dict[str, Any]:
    wanted = request.path_params["webhook_endpoint_id"]
    record = door(request).webhooks.get(wanted)
    if record is None or record["owner"] != owner_of(request):
        raise not_found(
            f"No webhook endpoint found with id {wanted!r}",
            param="webhook_endpoint_id",
        )
    return record


async def agents_webhooks_create(request: ServerRequest) -> dict[str, Any]:
    """Register an endpoint; its secret is in this answer and no other."""
    body = request.body
    known_keys(body, _KEYS)
    url = await check_destination(request.context, body.get("url"), request.rule)
    event_types = _event_types(body.get("event_types"))
    name = _name(body.get("name", ""))
    reg = door(request)
    mine = owned(reg.webhooks, owner_of(request))
    room_for_one(
        len(mine), defaults.WEBHOOK_ENDPOINTS_PER_IDENTITY, "webhook endpoints"
    )
    now = int(time.time())
    record: dict[str, Any] = {
        "id": new_id("we_"),
        "owner": owner_of(request),
        "url": url,
        "event_types": event_types,
        "name": name,
        "secret": new_secret(),
        "created_at": now,
        "updated_at": now,
    }
    reg.webhooks[record["id"]] = record
    reg.webhooks_changed()
    return _shown(record, secret=True)


def agents_webhooks_list(request: ServerRequest) -> dict[str, Any]:
    """The caller's endpoints (no secrets)."""
    owned = [
        _shown(w)
        for w in door(request).webhooks.values()
        if w["owner"] == owner_of(request)
    ]
    return page(request, owned)


def agents_webhooks_get(request: ServerRequest) -> dict[str, Any]:
    """One endpoint (no secret)."""
    return _shown(_endpoint(request))


async def agents_webhooks_update(request: ServerRequest) -> dict[str, Any]:
    """Change the URL, the event types or the name (checked as at create)."""
    record = _endpoint(request)
    body = request.body
    known_keys(body, _KEYS)
    changes: dict[str, Any] = {}
    if "url" in body:
        changes["url"] = await check_destination(
            request.context, body["url"], request.rule
        )
    if "event_types" in body:
        changes["event_types"] = _event_types(body["event_types"])
    if "name" in body:
        changes["name"] = _name(body["name"])
    if any(record[k] != v for k, v in changes.items()):
        record.update(changes, updated_at=int(time.time()))
        door(request).webhooks_changed()
    return _shown(record)


def agents_webhooks_delete(request: ServerRequest) -> dict[str, Any]:
    """Forget an endpoint: its pending deliveries are dropped."""
    record = _endpoint(request)
    reg = door(request)
    reg.webhooks.pop(record["id"], None)
    reg.webhooks_changed()
    return {"id": record["id"], "object": "webhook_endpoint.deleted", "deleted": True}


def agents_webhooks_rotate_secret(request: ServerRequest) -> dict[str, Any]:
    """A new secret, shown once; the old one signs nothing more."""
    record = _endpoint(request)
    known_keys(request.body, ("keep_old_secret_active_for_24_hours",))
    if request.body.get("keep_old_secret_active_for_24_hours"):
        raise bad_request(
            "keep_old_secret_active_for_24_hours: deliveries are signed with one "
            "secret at a time",
            param="keep_old_secret_active_for_24_hours",
        )
    record.update(secret=new_secret(), updated_at=int(time.time()))
    door(request).webhooks_changed()
    return _shown(record, secret=True)


async def agents_webhooks_test(request: ServerRequest) -> dict[str, Any]:
    """
    One sample event, signed and sent now (not retried); the receiver's
    status, whatever it is.
    """
    record = _endpoint(request)
    known_keys(request.body, ("event_type",))
    event_type = request.body.get("event_type")
    if event_type not in EVENT_TYPES:
        raise bad_request(
            f"event_type must be one of {', '.join(EVENT_TYPES)}", param="event_type"
        )
    data: dict[str, Any] = {
        "id": "agsess_test",
        "environment_type": "self_hosted",
        "environment_id": None,
    }
    if event_type == "agent.session.action_required":
        data = {
            "id": "agsess_test",
            "required_action": {"type": "mcp_approval_request"},
        }
    try:
        status = await attempt(
            request.context, record["url"], record["secret"], envelope(event_type, data)
        )
    except DeliveryFailed as e:
        raise remote_error(str(e), "network") from None
    return {
        "object": "webhook_endpoint.test",
        "event_type": event_type,
        "status_code": status,
        "success": True,
        "webhook_endpoint_id": record["id"],
    }


def agents_webhook_event_types(request: ServerRequest) -> dict[str, Any]:
    """The event types this daemon sends."""
    return {"object": "list", "data": list(EVENT_TYPES)}


HANDLERS: dict[str, Any] = {
    "agents_webhooks_create": agents_webhooks_create,
    "agents_webhooks_list": agents_webhooks_list,
    "agents_webhooks_get": agents_webhooks_get,
    "agents_webhooks_update": agents_webhooks_update,
    "agents_webhooks_delete": agents_webhooks_delete,
    "agents_webhooks_rotate_secret": agents_webhooks_rotate_secret,
    "agents_webhooks_test": agents_webhooks_test,
    "agents_webhook_event_types": agents_webhook_event_types,
}
HANDLERS = restored_first(HANDLERS)
