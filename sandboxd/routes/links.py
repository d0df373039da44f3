# -*- test-case-name: tests.routes.test_links -*-
"""The ``auth`` group: mint, list and revoke capability links (SPEC §23)."""

from __future__ import annotations

from typing import Any

from sandboxd.access.links import audience_port, check_audience, iso
from sandboxd.errors import bad_request, limit_rule
from sandboxd.policy.defaults import LINK_DEFAULT_TTL_SECONDS, identity_cap
from sandboxd.web import params
from sandboxd.web.messages import ServerRequest, ServerResponse


def mint(
    request: ServerRequest,
    audience: str,
    scopes: list[str] | None,
    ttl_value: Any,
    uses_value: Any,
) -> dict[str, Any]:
    """
    Mint one link for the caller with the endpoint's limits (``links_mint``
    and ``preview_link`` share this).
    """
    limits = request.rule.limits
    ttl = params.seconds(
        ttl_value,
        "ttl_seconds",
        min(float(LINK_DEFAULT_TTL_SECONDS), limits.max_link_ttl_seconds or 3600.0),
        ceiling=limits.max_link_ttl_seconds,
    )
    uses = params.integer(uses_value, "uses", None, low=1)
    total = limits.max_sessions
    share = None
    if total is not None:
        identities = len(request.context.policy.tokens.ids())
        share = identity_cap(total, identities, limits.max_per_identity)
    link, token = request.context.links.mint(
        request.identity,
        audience,
        scopes,
        ttl,
        uses,
        total,
        limit_rule(request.rule, "max_sessions"),
        share,
        limit_rule(request.rule, "max_per_identity"),
    )
    out: dict[str, Any] = {
        "link_id": link.id,
        "token": token,
        "audience": link.claims.aud,
        "scopes": list(link.claims.scopes),
        "expires_at": iso(link.claims.exp),
        "uses": link.claims.uses,
    }
    port = audience_port(audience)
    preview = request.context.preview
    if port is not None and preview is not None:
        out["url"] = preview.link_url(port, token)
    return out


def links_mint(request: ServerRequest) -> ServerResponse:
    """``POST /auth/links``: a link narrowed to its audience and the caller's scopes."""
    body = request.body
    if "audience" not in body:
        raise bad_request("'audience' is required")
    audience = check_audience(body.get("audience"))
    scopes = params.strings(body.get("scopes"), "scopes", None)
    made = mint(request, audience, scopes, body.get("ttl_seconds"), body.get("uses"))
    return ServerResponse.ok(made, status=201)


def links_list(request: ServerRequest) -> dict[str, Any]:
    """``GET /auth/links``: the caller's live links (never their tokens)."""
    return {
        "links": [link.as_json() for link in request.context.links.of(request.identity)]
    }


def links_revoke(request: ServerRequest) -> dict[str, Any]:
    """``DELETE /auth/links/{link_id}``: the link stops working at once."""
    link = request.context.links.revoke(
        request.path_params["link_id"], request.identity
    )
    return link.as_json()


HANDLERS = {
    "links_mint": links_mint,
    "links_list": links_list,
    "links_revoke": links_revoke,
}
