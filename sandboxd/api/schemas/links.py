"""What the endpoints of capability links take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema
from sandboxd.api.fragments import LINK_MINTED

_LINK_TEXT = (
    "{link_id, audience, scopes, created_at, expires_at, uses, used, revoked, "
    "on_behalf_of}"
)


_LINK_RECORD = (
    F("link_id"),
    F("audience"),
    F("scopes", "array", items="string"),
    F("created_at", doc="ISO 8601 UTC"),
    F("expires_at", doc="ISO 8601 UTC"),
    F("uses", "integer", "null: any number", nullable=True),
    F("used", "integer"),
    F("revoked", "boolean"),
    F("on_behalf_of", doc="the identity that minted it, which the link acts for"),
)


SCHEMAS: dict[str, Schema] = {
    "links_mint": Schema(
        body=(
            F(
                "audience",
                doc='"console", or "preview:PORT" for one preview',
                required=True,
                example="preview:3000",
            ),
            F(
                "scopes",
                "array",
                "at most the caller's, narrowed to the audience (a preview link: "
                "preview:use); default: all the audience allows",
                items="string",
            ),
            F(
                "ttl_seconds",
                "number",
                "cut to limits.max_link_ttl_seconds (3600)",
                default=900,
                example=900,
            ),
            F("uses", "integer", "how many times it may be presented", minimum=1),
        ),
        status=201,
        response=LINK_MINTED,
        errors=(
            E(400, "invalid_param", "an audience, scope, ttl or uses it cannot take"),
            E(403, "missing_scope", "a scope the caller does not hold"),
            E(
                429,
                "too_many_sessions",
                "limits.max_sessions (1000) links are live, the caller holds "
                "its share of them (max_per_identity: half when more than one "
                "identity can log in), or as many revoked links are remembered "
                "until they expire; a revoked link holds no place",
                "ResourceError",
            ),
            E(
                507,
                "insufficient_storage",
                "the links' state (--state-dir) cannot be written (the disk is "
                "full, or the state dir is not writable; the message names the "
                "file and the system's reason): no link was made",
                "OSError",
            ),
        ),
        notes="The token (sbxl_...) goes in X-Access-Token, Authorization: Bearer, or "
        "on the preview door as ?sbx_link=. The gate sees it as identity link:ID on "
        "behalf of the minter, in every audit line. Links die with the daemon unless "
        "auth.link_key_file names the key.",
    ),
    "links_list": Schema(
        response=(
            F(
                "links",
                "array",
                "the caller's live links (every live link for an identity "
                "holding *): " + _LINK_TEXT,
                items="object",
            ),
        ),
    ),
    "links_revoke": Schema(
        response=_LINK_RECORD,
        errors=(
            E(
                404,
                "not_found",
                "no live link of the caller's with this id",
                "NotFoundError",
            ),
            E(
                507,
                "insufficient_storage",
                "the link is revoked from now on, but the links' state cannot be "
                "written (a full disk, a state dir that is not writable) and the "
                "revocation is not kept across a restart: revoke it again once "
                "it can be",
                "OSError",
            ),
        ),
    ),
}
