# -*- test-case-name: tests.test_links -*-
"""
Capability links: short-lived, scope-narrowed tokens a caller mints for
someone else (a person opening a preview in a browser, the web console).

A link is ``sbxl_`` + base64url(JSON claims) + ``.`` + base64url(HMAC-SHA256
of everything before the dot).  The stdlib's :mod:`hmac` signs it with one
key, so there is no algorithm field to play games with and no JWT library.
The key is random per start (every link dies with the daemon) unless the
policy's ``auth.link_key_file`` names one.

The gate turns a valid link into the identity ``link:ID`` acting on behalf
of its minter, holding at most the minter's scopes narrowed to the link's
audience.  The daemon remembers every link it minted until it expires (at
most ``limits.max_sessions`` of ``links_mint``), so a link can be listed,
revoked and counted (``uses``); what it forgets is expired anyway.

With a key file the links outlive the daemon, so what it remembers of them
must too: given a state directory (``--state-dir``), the table is kept in
``links.json`` there (0600, replaced atomically on every mint, revocation
and counted use) and read back at start, so a counted link keeps its
remaining uses and a revoked one stays dead across a restart.  The file
names the key it belongs to (a digest): another key starts an empty table.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from sandboxd.access.auth import IMPLIED_SCOPES, Identity, TokenStore
from sandboxd.errors import (
    ApiError,
    Code,
    bad_request,
    insufficient_storage,
    limit_exceeded,
    link_refused,
    missing_scope,
    not_found,
)
from sandboxd.policy.document import PolicyError

#: What every link token starts with (and how the gate tells it from a token).
PREFIX = "sbxl_"

#: The audiences a link may name: the console, or one preview port.
CONSOLE = "console"
_PREVIEW = re.compile(r"^preview:([1-9][0-9]{0,4})$")

#: The scopes a preview link can carry: using the preview, nothing more.
PREVIEW_SCOPES = frozenset({"preview:use"})

KEY_BYTES = 32

#: The table's file in the state directory.
STATE_FILE = "links.json"

log = Logger(namespace="sandboxd.access.links")


def preview_audience(port: int) -> str:
    """The audience of a link that opens port ``port``'s preview."""
    return f"preview:{port}"


def audience_port(audience: str) -> int | None:
    """The port of a ``preview:PORT`` audience, else None."""
    m = _PREVIEW.match(audience)
    if m is None or not 0 < int(m.group(1)) < 65536:
        return None
    return int(m.group(1))


def check_audience(audience: object) -> str:
    """
    :raises ApiError: 400 ``invalid_param`` for an audience links cannot name.
    """
    if not isinstance(audience, str) or (
        audience != CONSOLE and audience_port(audience) is None
    ):
        raise bad_request(
            'audience: expected "console" or "preview:PORT" (a port 1-65535)'
        )
    return audience


def iso(ts: float) -> str:
    """Unix time as ISO 8601 UTC (seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def read_key(path: str) -> bytes:
    """
    The signing key from ``auth.link_key_file``: its bytes, at least 32.

    :raises PolicyError: when it cannot be read or is too short.
    """
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise PolicyError(
            f"auth.link_key_file: cannot read {path!r}: {e.strerror}"
        ) from None
    if len(key) < KEY_BYTES:
        raise PolicyError(
            f"auth.link_key_file: {path!r} holds {len(key)} bytes; at least "
            f"{KEY_BYTES} are needed"
        )
    return key


@attrs.frozen
class Claims:
    """What a link says about itself (signed)."""

    jti: str
    sub: str
    aud: str
    scopes: tuple[str, ...]
    exp: float
    uses: int | None = None

    def encode(self) -> bytes:
        """The claims as compact JSON (keys sorted, so a token is stable)."""
        data = {
            "jti": self.jti,
            "sub": self.sub,
            "aud": self.aud,
            "scopes": list(self.scopes),
            "exp": int(self.exp),
        }
        if self.uses is not None:
            data["uses"] = self.uses
        return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


@attrs.define
class Link:
    """A minted link as the daemon remembers it."""

    claims: Claims
    created_at: float
    used: int = 0
    revoked: bool = False
    #: Revoked because its minter was taken out of the policy.
    minter_removed: bool = False
    #: Which token its minter presented (:attr:`Identity.credential`).
    minter_credential: str | None = None
    #: Revoked because a reload changed (or removed) that token.
    minter_rotated: bool = False

    @property
    def id(self) -> str:
        """The link's id (``link_id``)."""
        return self.claims.jti

    def to_state(self) -> dict[str, Any]:
        """The link as the state file keeps it (claims and counters, no token)."""
        c = self.claims
        return {
            "jti": c.jti,
            "sub": c.sub,
            "aud": c.aud,
            "scopes": list(c.scopes),
            "exp": c.exp,
            "uses": c.uses,
            "created_at": self.created_at,
            "used": self.used,
            "revoked": self.revoked,
            "minter_removed": self.minter_removed,
            "minter_credential": self.minter_credential,
            "minter_rotated": self.minter_rotated,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Link:
        """A link read back from the state file.

        :raises ValueError, KeyError, TypeError: for an entry that is not one.
        """
        claims = Claims(
            jti=str(data["jti"]),
            sub=str(data["sub"]),
            aud=check_audience(data["aud"]),
            scopes=tuple(str(s) for s in data["scopes"]),
            exp=float(data["exp"]),
            uses=int(data["uses"]) if data.get("uses") is not None else None,
        )
        return cls(
            claims,
            float(data["created_at"]),
            used=int(data["used"]),
            revoked=bool(data["revoked"]),
            minter_removed=bool(data.get("minter_removed", False)),
            minter_credential=(
                str(data["minter_credential"])
                if data.get("minter_credential") is not None
                else None
            ),
            minter_rotated=bool(data.get("minter_rotated", False)),
        )

    def as_json(self) -> dict[str, object]:
        """What ``links_list`` shows (never the token)."""
        return {
            "link_id": self.id,
            "audience": self.claims.aud,
            "scopes": list(self.claims.scopes),
            "created_at": iso(self.created_at),
            "expires_at": iso(self.claims.exp),
            "uses": self.claims.uses,
            "used": self.used,
            "revoked": self.revoked,
            "on_behalf_of": self.claims.sub,
        }


def root_of(identity: Identity) -> str:
    """Who a caller acts for: a link's minter, else the caller itself."""
    return identity.root


def within(scopes: frozenset[str], minter: Identity) -> frozenset[str]:
    """
    What a link's ``scopes`` still grant under its minter's scopes now:
    each that the minter still holds, and each of the minter's that the
    link's hold (a link minted with ``*`` or ``files:*`` keeps ``files:read``
    of a minter narrowed to it), so the link never holds more than either.
    """
    link = Identity("link", scopes)
    return frozenset(s for s in scopes if minter.has_scope(s)) | frozenset(
        s for s in minter.scopes if s not in IMPLIED_SCOPES and link.has_scope(s)
    )


#: Why a well-formed link fails its check when the key is made at each
#: start: almost always it was made before a restart, and a person told
#: only "not valid" cannot guess that.
NOT_SIGNED_HERE = (
    "the link is not valid; the daemon may have restarted since it was made, "
    "and without auth.link_key_file its links end at a restart"
)


class LinkTable:
    """
    The key and the links minted with it.

    :param clock: Unix time (the reactor's ``seconds``).
    """

    def __init__(
        self,
        key: bytes,
        clock: Callable[[], float],
        state_path: str | None = None,
        random_key: bool = False,
    ) -> None:
        self._key = key
        self._clock = clock
        #: The key was made at this start, so every link made before it
        #: fails its check: a refusal says a restart is the likely cause.
        self.random_key = random_key
        self.links: dict[str, Link] = {}
        #: Where the table is kept across restarts (None: nowhere).
        self.state_path = state_path
        #: Why the last :meth:`save` failed (None: it did not).
        self.save_error: OSError | None = None
        #: The state file was lost (unreadable): a link this table does not
        #: know may have been revoked or used up, so it is refused, for
        #: good (kept in the file); every link made since is known.
        self.refuse_unknown = False
        #: Told when a link is minted or ended (revoked, its minter gone):
        #: the daemon asks the connections links hold open again and
        #: watches the next expiry.
        self.listeners: list[Callable[[], None]] = []
        self._key_id = hashlib.sha256(b"sandboxd-links\0" + key).hexdigest()[:32]
        if state_path is not None:
            self._load()

    @classmethod
    def for_key_file(
        cls,
        path: str | None,
        clock: Callable[[], float],
        state_dir: str | None = None,
    ) -> LinkTable:
        """
        The table for ``auth.link_key_file`` (random key when None).

        :param state_dir: where the table survives a restart; used only
            with a key file (with a random key every link dies anyway).
        """
        if not path:
            return cls(secrets.token_bytes(KEY_BYTES), clock, random_key=True)
        if state_dir is None:
            log.warn(
                "sandboxd: links outlive a restart (auth.link_key_file) but "
                "their revocations and use counts do not: give --state-dir"
            )
            return cls(read_key(path), clock)
        return cls(read_key(path), clock, os.path.join(state_dir, STATE_FILE))

    # -- the state file -------------------------------------------------------

    def _load(self) -> None:
        """
        Read the table back (another key's links are dropped).  A file that
        cannot be read fails closed (:meth:`_lost`): what it exists to
        remember is which links were revoked.
        """
        assert self.state_path is not None
        try:
            with open(self.state_path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self._lost(str(e))
            return
        if not isinstance(data, dict) or not isinstance(data.get("links", []), list):
            self._lost("not the links' table")
            return
        if data.get("key") != self._key_id:
            return  # another key's links: none of them verifies now
        self.refuse_unknown = data.get("refuse_unknown") is True
        # The clock is not asked here (a reactor that is never run has
        # none): expired links are pruned as they always are, on the
        # next mint, list or revocation, and no expired link verifies.
        for entry in data.get("links", []):
            try:
                link = Link.from_state(entry)
            except (ValueError, KeyError, TypeError, AttributeError, ApiError):
                # Not an entry this version wrote: it may be a revocation.
                self.refuse_unknown = True
                continue
            self.links[link.id] = link
        if self.refuse_unknown and not data.get("refuse_unknown"):
            self._lost("some entries are not links")

    def _lost(self, why: str) -> None:
        """
        The state file cannot be read: refuse every link this table does
        not know (made before this start: any may have been revoked), keep
        the file aside as ``links.json.bad`` for the operator, and say so.
        """
        assert self.state_path is not None
        self.refuse_unknown = True
        bad = self.state_path + ".bad"
        try:
            os.replace(self.state_path, bad)
            kept = f"it is kept as {bad}"
        except OSError as e:
            kept = f"it could not be set aside ({e.strerror or e})"
        log.error(
            "sandboxd: cannot read the links' state {path}: {why}; {kept}. Every "
            "link made before now is refused as revoked (which ones were cannot "
            "be known): mint new ones",
            path=self.state_path,
            why=why,
            kept=kept,
        )
        self.save()

    def save(self) -> bool:
        """
        Write the table to the state file, replacing it atomically (a
        temporary file renamed over it): a crash leaves the old table or
        the new one, never half of one.  The file is small (at most the
        live links), so it is written in the reactor's turn.

        :return: whether the table is kept (True with no state file); False
            when it could not be written (a full disk), which is logged.
        """
        if self.state_path is None:
            return True
        # An empty table is written at start (:meth:`_lost`), before a
        # reactor that is never run could be asked the time.
        now = self._clock() if self.links else 0.0
        data: dict[str, Any] = {
            "version": 1,
            "key": self._key_id,
            "refuse_unknown": self.refuse_unknown,
            "links": [
                link.to_state() for link in self.links.values() if link.claims.exp > now
            ],
        }
        folder = os.path.dirname(self.state_path)
        temporary = f"{self.state_path}.{os.getpid()}.tmp"
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(
                temporary,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                0o600,
            )
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(data, separators=(",", ":")).encode())
            os.replace(temporary, self.state_path)
        except OSError as e:
            # A full disk, a read-only or foreign state dir: the old state
            # stays whole, and nothing beside it.
            self.save_error = e
            try:
                os.unlink(temporary)
            except OSError:
                pass
            log.error(
                "sandboxd: cannot write the links' state {path}: {error}",
                path=self.state_path,
                error=e.strerror or str(e),
            )
            return False
        self.save_error = None
        return True

    def _unkept(self, consequence: str) -> ApiError:
        """
        The 507 of a change :meth:`save` could not keep, naming the state
        file and the system's reason: a full disk says so, and a read-only
        or foreign state dir is not mistaken for one.
        """
        e = self.save_error
        reason = (e.strerror or str(e)) if e is not None else "not written"
        full = e is None or e.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "the disk is full" if full else "the state dir is not writable"
        return insufficient_storage(
            f"{what}: the links' state {self.state_path} cannot be written "
            f"({reason}), {consequence}"
        )

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._key, (PREFIX + body).encode("ascii"), hashlib.sha256)
        return _b64(mac.digest())

    def prune(self) -> None:
        """Forget links past their expiry (revoked ones included)."""
        now = self._clock()
        for jti in [j for j, link in self.links.items() if link.claims.exp <= now]:
            del self.links[jti]

    # -- minting --------------------------------------------------------------

    def mint(
        self,
        minter: Identity,
        audience: str,
        scopes: Iterable[str] | None,
        ttl: float,
        uses: int | None,
        max_links: int | None,
        rule: str | None = None,
        share: int | None = None,
        share_rule: str | None = None,
    ) -> tuple[Link, str]:
        """
        A new link and its token.

        Only live links count against ``max_links`` and ``share``: a
        revoked one (its minter's removal included) is remembered until it
        expires, so that its token stays refused, but holds no place.
        Those remembered are bounded too, at as many again as the live
        (per minter and in all), so that minting and revoking in a loop
        cannot grow the table.

        :param scopes: asked for; None: everything the audience allows that
            the minter holds.
        :param share: the live links one minter may hold
            (:func:`~sandboxd.policy.defaults.identity_cap`): one identity
            filling the table would lock every other out of the console
            and the previews.
        :raises ApiError: 400 for scopes outside the audience, 403
            ``missing_scope`` for one the minter lacks, 429 when the table
            or the minter's share of it is full.
        """
        check_audience(audience)
        wanted = tuple(sorted(set(scopes))) if scopes is not None else None
        if audience_port(audience) is not None:
            if wanted is None:
                wanted = tuple(sorted(PREVIEW_SCOPES))
            outside = [s for s in wanted if s not in PREVIEW_SCOPES]
            if outside:
                raise bad_request(
                    f"a preview link carries only {sorted(PREVIEW_SCOPES)}; "
                    f"not {outside[0]!r}"
                )
        elif wanted is None:
            wanted = tuple(sorted(minter.scopes))
        for scope in wanted:
            if not minter.has_scope(scope):
                raise missing_scope("links_mint", scope, "links:minter_scopes")
        self.prune()
        if max_links is not None:
            self._check_room(root_of(minter), max_links, rule, share, share_rule)
        now = self._clock()
        claims = Claims(
            jti=secrets.token_urlsafe(12),
            sub=root_of(minter),
            aud=audience,
            scopes=wanted,
            exp=min(now + ttl, self._expiry_of(minter)),
            uses=uses,
        )
        link = Link(claims, now, minter_credential=minter.credential)
        self.links[claims.jti] = link
        if not self.save():
            # Not kept, it could not be revoked after a restart.
            del self.links[claims.jti]
            raise self._unkept("so no link was made")
        self.changed()
        body = _b64(claims.encode())
        return link, f"{PREFIX}{body}.{self._sign(body)}"

    def _check_room(
        self,
        root: str,
        max_links: int,
        rule: str | None,
        share: int | None,
        share_rule: str | None,
    ) -> None:
        """:raises ApiError: 429 when ``root`` may mint no link now."""
        live = kept = mine_live = mine_kept = 0
        for link in self.links.values():
            own = link.claims.sub == root
            if link.revoked:
                kept += 1
                mine_kept += own
            else:
                live += 1
                mine_live += own
        if live >= max_links:
            raise limit_exceeded(
                429,
                f"{live} links are live; revoke some or wait for them to expire",
                Code.TOO_MANY_SESSIONS,
                rule,
                limit=max_links,
            )
        mine = max_links if share is None else min(share, max_links)
        if mine_live >= mine:
            raise limit_exceeded(
                429,
                f"you have {mine_live} live links, your share of {max_links} "
                "(max_per_identity); revoke some or wait for them to expire",
                Code.TOO_MANY_SESSIONS,
                share_rule or rule,
                limit="max_per_identity",
            )
        if kept >= max_links or mine_kept >= mine:
            raise limit_exceeded(
                429,
                f"{mine_kept if mine_kept >= mine else kept} revoked links are "
                "remembered until they expire (so that their tokens stay "
                "refused); wait for them to expire",
                Code.TOO_MANY_SESSIONS,
                rule,
                limit=max_links,
            )

    def _expiry_of(self, minter: Identity) -> float:
        """
        When the minter stops working: a link that mints a link (the
        console opening a preview) cannot hand out one that outlives it,
        or a link could renew itself for ever; a token does not expire.
        """
        if minter.on_behalf_of is None or not minter.id.startswith("link:"):
            return float("inf")
        parent = self.links.get(minter.id.removeprefix("link:"))
        return parent.claims.exp if parent is not None else self._clock()

    # -- checking -------------------------------------------------------------

    def verify(
        self,
        token: bytes | str,
        audience: str,
        consume: bool = True,
        tokens: TokenStore | None = None,
        *,
        spend: bool = True,
    ) -> Identity:
        """
        The identity a link token stands for.

        :param audience: where it is presented (``console`` for the API,
            ``preview:PORT`` on the preview door).
        :param consume: the link is presented, so it counts as a use (not
            a cookie that holds one already exchanged): a used-up link is
            refused.
        :param spend: with ``consume``, count the use now.  The gate says
            False and spends it (:meth:`spend`) once it has let the call
            in, so a call it refuses costs none.
        :param tokens: the policy's identities now.  A link acts for its
            minter, so it holds no more than the minter holds *now*: the
            minter's scopes narrowed since the link was made narrow it too,
            and a minter taken out of the policy (how a leaked or departed
            identity is shut out) takes its links with it.  None checks
            nothing of the minter (the table on its own).
        :raises ApiError: 401 ``link_expired``, or ``link_invalid`` for a
            token that is malformed, forged, revoked, used up, for another
            audience or made by an identity the policy no longer has; 507
            for a counted link whose use cannot be kept (a full disk).
        """
        text = token.decode("latin-1") if isinstance(token, bytes) else token
        body, dot, mac = text.removeprefix(PREFIX).partition(".")
        if not text.startswith(PREFIX) or not dot:
            raise link_refused("the link is malformed")
        if not hmac.compare_digest(mac.encode("latin-1"), self._sign(body).encode()):
            raise link_refused(
                NOT_SIGNED_HERE if self.random_key else "the link is not valid"
            )
        try:
            data = json.loads(_unb64(body))
            claims = Claims(
                jti=str(data["jti"]),
                sub=str(data["sub"]),
                aud=str(data["aud"]),
                scopes=tuple(str(s) for s in data["scopes"]),
                exp=float(data["exp"]),
                uses=int(data["uses"]) if data.get("uses") is not None else None,
            )
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise link_refused("the link is malformed") from None
        if claims.exp <= self._clock():
            raise link_refused("the link has expired", expired=True)
        link = self.links.get(claims.jti)
        if link is not None and link.revoked:
            raise link_refused(revoked_message(link))
        if link is None and self.refuse_unknown:
            raise link_refused(LOST)
        if claims.aud != audience:
            raise link_refused("the link is for another audience")
        if claims.uses is not None:
            if link is None:
                # A counted link from before a restart with no state kept:
                # its count is lost, so it counts as used up.
                raise link_refused("the link was used up")
            if consume and link.used >= claims.uses:
                raise link_refused("the link was used up")
        scopes = frozenset(claims.scopes)
        credential = link.minter_credential if link is not None else None
        if tokens is not None:
            minter = tokens.current(claims.sub)
            if minter is None:
                raise link_refused(
                    f"the identity that made this link ({claims.sub!r}) is no "
                    "longer in the policy, so its links no longer work"
                )
            if credential is not None and not tokens.holds(claims.sub, credential):
                raise link_refused(_ROTATED.format(sub=claims.sub))
            scopes = within(scopes, minter)
        identity = Identity(
            f"link:{claims.jti}",
            scopes,
            on_behalf_of=claims.sub,
            expires=claims.exp,
            credential=credential,
        )
        if consume and spend:
            self.spend(identity)
        return identity

    def spend(self, identity: Identity) -> None:
        """
        Count one use of the link ``identity`` stands for (nothing for a
        token).  Checked again here, not only in :meth:`verify`: two calls
        verified at once must not both spend the last use, nor may one
        spend a link revoked or expired since it was verified.

        :raises ApiError: 401 ``link_invalid``/``link_expired``; 507 when
            a counted use cannot be kept (a full disk): it is not taken.
        """
        if identity.on_behalf_of is None or not identity.id.startswith("link:"):
            return
        link = self.links.get(identity.id.removeprefix("link:"))
        if link is None:
            return  # an uncounted link from before a restart: nothing to count
        if link.revoked:
            raise link_refused(revoked_message(link))
        if link.claims.exp <= self._clock():
            raise link_refused("the link has expired", expired=True)
        uses = link.claims.uses
        if uses is None:
            link.used += 1
            return
        if link.used >= uses:
            raise link_refused("the link was used up")
        link.used += 1
        if not self.save():
            # A restart must not give a use back.
            link.used -= 1
            raise self._unkept("so this use of a counted link was not made")

    # -- listing and revoking -------------------------------------------------

    def of(self, identity: Identity) -> list[Link]:
        """
        The live links minted by (or for) the caller, oldest first; every
        live link for an identity holding ``*``, which may revoke any: an
        operator shutting out a leaked identity must be able to find its
        links (each names its minter).
        """
        self.prune()
        if "*" in identity.scopes:
            return list(self.links.values())
        root = root_of(identity)
        return [link for link in self.links.values() if link.claims.sub == root]

    def revoke(self, link_id: str, identity: Identity) -> Link:
        """
        Revoke a link of the caller's (any link, for an identity holding ``*``).

        :raises ApiError: 404 for a link the caller cannot see; 507 when the
            revocation holds but could not be kept (a full disk): the link
            is refused from now on, but would work again after a restart,
            and revoking it again once there is room keeps it.
        """
        self.prune()
        link = self.links.get(link_id)
        if link is None or not (
            link.claims.sub == root_of(identity) or "*" in identity.scopes
        ):
            raise not_found(f"no such link: {link_id}")
        link.revoked = True
        self.changed()
        if not self.save():
            raise self._unkept(
                "so the link is revoked only until a restart, after which it "
                "would work again; revoke it again once the state can be written"
            )
        return link

    def ended(self, identity: Identity) -> ApiError | None:
        """
        Why a connection ``identity`` opened must end now, when it is a
        link that was revoked (its minter taken out of the policy
        included) or has expired; None while it lives, and for a token.
        """
        if identity.on_behalf_of is None or not identity.id.startswith("link:"):
            return None
        link = self.links.get(identity.id.removeprefix("link:"))
        if link is not None and link.revoked:
            return link_refused(revoked_message(link))
        if link is None and self.refuse_unknown:
            return link_refused(LOST)
        if identity.expires is not None and identity.expires <= self._clock():
            return link_refused("the link has expired", expired=True)
        return None

    def next_expiry(self, after: float) -> float | None:
        """When the next live link expires after ``after`` (None: none does)."""
        return min(
            (
                link.claims.exp
                for link in self.links.values()
                if not link.revoked and link.claims.exp > after
            ),
            default=None,
        )

    def changed(self) -> None:
        """Tell the listeners that links were minted or ended."""
        for listener in list(self.listeners):
            listener()

    def end_orphans(self, tokens: TokenStore) -> list[Link]:
        """
        Revoke, for good, every link whose minter is not in the policy
        ``tokens`` belong to, or no longer logs in with the token it made
        the link with (asked at start and at each reload): a link already
        fails while its minter is out, but giving the identity (or the old
        token) back (an old policy file restored) would otherwise bring
        its links back, a leaked token's included.  The links ended, saved
        when there are any (a revocation that cannot be kept is logged: it
        is made again at the next start while the minter stays out).
        """
        ended = []
        for link in self.links.values():
            if link.revoked:
                continue
            if tokens.current(link.claims.sub) is None:
                link.revoked = link.minter_removed = True
                ended.append(link)
            elif link.minter_credential is not None and not tokens.holds(
                link.claims.sub, link.minter_credential
            ):
                link.revoked = link.minter_rotated = True
                ended.append(link)
        if ended and self.state_path is not None and not self.save():
            log.warn(
                "sandboxd: the links of identities no longer in the policy are "
                "ended, but that could not be written to {path}: {error}",
                path=self.state_path,
                error=str(self.save_error),
            )
        return ended


class ExpiryWatch:
    """
    Asks the connections links hold open (``recheck``) again whenever a
    link is minted or ended, and once each link expires: a link presented
    for every request stops working at its expiry by itself, but a
    terminal socket or an event stream it opened lasts as long as its
    client keeps it.
    """

    #: After an expiry, how long before asking (the link is past it then).
    SLACK_SECONDS = 0.05

    def __init__(
        self, clock: IReactorTime, table: LinkTable, recheck: Callable[[], None]
    ) -> None:
        self.clock = clock
        self.table = table
        self.recheck = recheck
        self._timer: IDelayedCall | None = None

    def start(self) -> None:
        """Follow the table."""
        self.table.listeners.append(self._changed)
        self._arm()

    def stop(self) -> None:
        """Stop following it."""
        if self._changed in self.table.listeners:
            self.table.listeners.remove(self._changed)
        self._cancel()

    def _changed(self) -> None:
        """A link minted or ended, or the next one expired: ask, then re-arm."""
        self.recheck()
        self._arm()

    def _cancel(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _arm(self) -> None:
        self._cancel()
        now = self.clock.seconds()
        due = self.table.next_expiry(now)
        if due is not None:
            self._timer = self.clock.callLater(
                due - now + self.SLACK_SECONDS, self._changed
            )


#: Why a link the table does not know is refused once its state was lost.
LOST = (
    "the link was made before the daemon's record of revoked links was lost "
    "(an unreadable links.json), so it is treated as revoked; mint a new one"
)

#: Why a link made with a token that was since changed is refused.
_ROTATED = (
    "the link ended when the token that made it ({sub!r}'s) was changed in "
    "the policy; changing it back does not bring its links back"
)


def revoked_message(link: Link) -> str:
    """Why a revoked link is refused."""
    if link.minter_rotated:
        return _ROTATED.format(sub=link.claims.sub)
    if link.minter_removed:
        return (
            f"the link ended when the identity that made it ({link.claims.sub!r}) "
            "was taken out of the policy; giving the identity back does not "
            "bring its links back"
        )
    return "the link was revoked"


def is_link(token: bytes | str | None) -> bool:
    """Whether a presented credential is a link (rather than a token)."""
    if isinstance(token, bytes):
        return token.startswith(PREFIX.encode())
    return token is not None and token.startswith(PREFIX)


__all__ = [
    "CONSOLE",
    "PREFIX",
    "STATE_FILE",
    "Claims",
    "Link",
    "LinkTable",
    "audience_port",
    "check_audience",
    "is_link",
    "preview_audience",
    "read_key",
    "root_of",
    "within",
]
