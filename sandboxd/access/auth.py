# -*- test-case-name: tests.web.test_pipeline -*-
"""
Who is calling: tokens, identities and scopes (SPEC §4).

Tokens are kept only as SHA-256 digests and compared with
``hmac.compare_digest`` against every known digest, so timing says nothing
and a token with odd bytes is a plain 401.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence

import attrs

from sandboxd.errors import ambiguous_credentials, unauthorized
from sandboxd.policy.document import PolicyError, TokenSpec, same_token

#: Scopes every identity holds (SPEC §17: ``core:read``, which opening an
#: MCP session needs, grants nothing but discovery).
IMPLIED_SCOPES = frozenset({"core:read"})


@attrs.frozen
class Identity:
    """
    An authenticated caller and the scopes it holds.

    :ivar on_behalf_of: for a capability link (``link:ID``), the identity
        that minted it; the audit names both.
    :ivar expires: for a link, when it expires (Unix time): a connection
        it opened is ended then.
    """

    id: str
    scopes: frozenset[str]
    on_behalf_of: str | None = None
    expires: float | None = attrs.field(default=None, eq=False)
    #: Which token this caller presented (:func:`fingerprint`; for a link,
    #: the token its minter presented): a connection it opened ends when a
    #: reload changes that token, not only when the identity goes.  None
    #: without a token (local mode, ``anonymous``).
    credential: str | None = attrs.field(default=None, eq=False)

    def has_scope(self, scope: str) -> bool:
        """
        Whether this identity holds ``scope``: ``*`` holds every scope and
        ``files:*`` every scope of its namespace.
        """
        if "*" in self.scopes or scope in self.scopes or scope in IMPLIED_SCOPES:
            return True
        namespace, colon, _ = scope.partition(":")
        return bool(colon) and f"{namespace}:*" in self.scopes

    @property
    def root(self) -> str:
        """
        Who this caller acts for: a link's minter, else the caller itself.
        Every per-identity bound (``rate_per_minute``, ``max_per_identity``
        and the like) counts against it, and what a caller opens belongs to
        it: a token that mints links gets no more than its own share.
        """
        return self.on_behalf_of or self.id

    def acts_for(self, owner: str) -> bool:
        """
        Whether this identity may see and drive what ``owner`` made (a
        terminal, a code context, a git job, a language server): it is
        ``owner``, a capability link ``owner`` minted (the web console
        watching an agent's work), or it holds ``*``.  Everyone else is
        told such a thing is not there.
        """
        return self.id == owner or self.on_behalf_of == owner or "*" in self.scopes

    def missing(self, required: Iterable[str]) -> str | None:
        """The first required scope this identity lacks, or None."""
        for scope in required:
            if not self.has_scope(scope):
                return scope
        return None

    def as_json(self) -> dict[str, object]:
        """``{id, scopes}`` (and ``on_behalf_of`` for a link) for discovery."""
        out: dict[str, object] = {"id": self.id, "scopes": sorted(self.scopes)}
        if self.on_behalf_of is not None:
            out["on_behalf_of"] = self.on_behalf_of
        return out


ANONYMOUS = Identity("anonymous", frozenset({"*"}))


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def fingerprint(digest: bytes) -> str:
    """
    A token's name for :attr:`Identity.credential`: derived from its digest
    (never the token), so the same token read again at a reload gives the
    same name and a changed one another.
    """
    return hashlib.sha256(b"sandboxd-credential\0" + digest).hexdigest()[:32]


def _read_token_file(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        raise PolicyError(
            f"{where}: cannot read token file {path!r}: {e.strerror}"
        ) from None


@attrs.define
class TokenStore:
    """
    The identities a daemon accepts.

    Empty means local mode: every request is :data:`ANONYMOUS`.
    """

    entries: list[tuple[bytes, Identity]] = attrs.Factory(list)
    #: Who a request without credentials is: in local mode always someone
    #: (every scope unless ``auth.anonymous_scopes`` narrows them); with
    #: tokens, only when ``auth.allow_anonymous`` lets them in.
    anonymous: Identity | None = ANONYMOUS
    #: environment variables that hold tokens (never passed to children).
    secret_env: frozenset[str] = frozenset()
    warnings: list[str] = attrs.Factory(list)
    #: The tokens this store knows in clear, longest first: read from the
    #: environment and from files, and a ``token_sha256`` one once it is
    #: presented.  What the audit and the spans mask wherever it appears
    #: (:meth:`secrets`).
    _secrets: list[str] = attrs.field(factory=list, init=False)

    @property
    def local_mode(self) -> bool:
        """No token configured: no authentication."""
        return not self.entries

    @classmethod
    def build(
        cls,
        specs: Iterable[TokenSpec],
        environ: Mapping[str, str] | None = None,
        fail_closed: bool = True,
        allow_anonymous: bool = False,
        anonymous_scopes: Iterable[str] | None = None,
    ) -> TokenStore:
        """
        Resolve the legacy token and every policy token at start.

        :param fail_closed: a configured source that yields no token (an
            empty ``ABX_SERVER_TOKEN_FILE`` or ``token_file``, an unset
            ``token_env``) stops the start (SPEC §20); ``check-config``
            passes False to report it as a warning instead.
        :param allow_anonymous: with tokens, let a request without
            credentials in as ``anonymous``.
        :param anonymous_scopes: what ``anonymous`` holds (default ``*``).
        :raises PolicyError: naming the source that yielded nothing.
        """
        env = os.environ if environ is None else environ
        specs = list(specs)
        store = cls()
        empty: list[str] = []
        secret_env = {"ABX_SERVER_TOKEN", "ABX_SERVER_TOKEN_FILE"}
        # The trace collector's credentials, when the daemon was given some.
        from sandboxd.access.tracing import SECRET_VARIABLES

        secret_env.update(n for n in SECRET_VARIABLES if env.get(n))
        legacy = env.get("ABX_SERVER_TOKEN", "")
        legacy_file = env.get("ABX_SERVER_TOKEN_FILE", "")
        if not legacy and legacy_file:
            legacy = _read_token_file(legacy_file, "ABX_SERVER_TOKEN_FILE")
            if not legacy:
                empty.append(
                    f"ABX_SERVER_TOKEN_FILE: the token file {legacy_file!r} is empty"
                )
        if legacy:
            store._learn(legacy)
        if legacy and not specs:
            # As on the seed, the legacy token is an identity of its own only
            # when the policy declares no tokens; a policy that does decides
            # what that token may do (``token_env: ABX_SERVER_TOKEN``).
            digest = _digest(legacy.encode("utf-8"))
            store.entries.append(
                (
                    digest,
                    Identity(
                        "legacy", frozenset({"*"}), credential=fingerprint(digest)
                    ),
                )
            )
        owners: dict[bytes, str] = {}

        def add(digest: bytes, identity: Identity) -> None:
            # Two sources (a variable and a file, or a hash) can hold one
            # secret that the document alone cannot see is shared.
            if digest in owners:
                raise same_token("auth.tokens", owners[digest], identity.id)
            owners[digest] = identity.id
            store.entries.append(
                (digest, attrs.evolve(identity, credential=fingerprint(digest)))
            )

        for spec in specs:
            identity = Identity(spec.id, frozenset(spec.scopes))
            value = ""
            if spec.token_sha256:
                add(bytes.fromhex(spec.token_sha256), identity)
                continue
            if spec.token_env:
                secret_env.add(spec.token_env)
                value = env.get(spec.token_env, "")
                if not value.strip():
                    value = ""
                    empty.append(
                        f"auth.tokens: token {spec.id!r}: environment variable "
                        f"{spec.token_env} is unset or empty"
                    )
            elif spec.token_file:
                where = f"auth.tokens {spec.id!r}"
                value = _read_token_file(spec.token_file, where)
                if not value:
                    empty.append(
                        f"{where}: the token file {spec.token_file!r} is empty"
                    )
            if value:
                store._learn(value)
                add(_digest(value.encode("utf-8")), identity)
        store.secret_env = frozenset(secret_env)
        if (legacy and specs) and not any(
            s.token_env == "ABX_SERVER_TOKEN"
            or (legacy_file and s.token_file == legacy_file)
            for s in specs
        ):
            # The advice must be one that starts: a token read from the
            # file is named by the file, ABX_SERVER_TOKEN being unset.
            if env.get("ABX_SERVER_TOKEN", ""):
                named, entry = "ABX_SERVER_TOKEN", '"token_env": "ABX_SERVER_TOKEN"'
            else:
                named, entry = "ABX_SERVER_TOKEN_FILE", f'"token_file": "{legacy_file}"'
            store.warnings.append(
                f"{named} is set but auth.tokens does not name it, so it logs"
                f" nobody in; add an entry with {entry} and its scopes to keep it"
            )
        if empty and fail_closed:
            raise PolicyError(f"{empty[0]}; refused rather than run without that token")
        store.warnings.extend(f"{e}, so this identity cannot log in" for e in empty)
        if not store.entries and (empty or specs):
            # Tokens were configured but none resolved: fail closed, never open.
            store.entries.append((b"\x00" * 32, Identity("nobody", frozenset())))
        anonymous = Identity(
            "anonymous",
            frozenset(anonymous_scopes if anonymous_scopes is not None else ("*",)),
        )
        store.anonymous = anonymous if store.local_mode or allow_anonymous else None
        return store

    def _learn(self, token: str) -> None:
        """Keep ``token`` among :meth:`secrets` (once; longest first)."""
        if token and token not in self._secrets:
            self._secrets.append(token)
            self._secrets.sort(key=len, reverse=True)

    def secrets(self) -> Sequence[str]:
        """
        The tokens known in clear, longest first: no audit line and no span
        may hold one, whoever's command prints it.  A ``token_sha256``
        token is among them from the moment it is first presented (the
        daemon cannot know it before).
        """
        return self._secrets

    def learn_from(self, before: TokenStore) -> None:
        """
        Keep, after a reload, the presented tokens ``before`` learnt that
        still log in here (a ``token_sha256`` one is not presented again
        before the next command echoes it).
        """
        for token in before._secrets:
            if self.identify(token.encode("utf-8"), learn=False) is not None:
                self._learn(token)

    def holds(self, identity_id: str, credential: str) -> bool:
        """Whether the identity ``identity_id`` still logs in with that token."""
        return any(
            identity.id == identity_id and identity.credential == credential
            for _, identity in self.entries
        )

    def ids(self) -> list[str]:
        """The identities that can log in, in the order configured."""
        names: list[str] = []
        for _, identity in self.entries:
            if identity.scopes or identity.id != "nobody":
                if identity.id not in names:
                    names.append(identity.id)
        return names

    def identity_named(self, identity_id: str) -> Identity | None:
        """
        The identity configured under ``identity_id`` (a policy token's
        ``id``), or None: what a door lets a caller without credentials
        stand for, when its policy names one.
        """
        for _, identity in self.entries:
            if identity.id == identity_id:
                return identity
        return None

    def current(self, identity_id: str) -> Identity | None:
        """
        The identity ``identity_id`` is under this policy, with the scopes
        it holds now: a policy token's (or the legacy token's), or
        ``anonymous`` while requests without credentials are let in; None
        for an identity this policy no longer has.  What a capability
        link asks of its minter each time it is presented.
        """
        named = self.identity_named(identity_id)
        if named is not None:
            return named
        if self.anonymous is not None and identity_id == self.anonymous.id:
            return self.anonymous
        return None

    def identify(self, token: bytes, learn: bool = True) -> Identity | None:
        """
        The identity whose token this is, checking every digest.

        :param learn: keep a token that logs in among :meth:`secrets` (at
            most one per identity: only a token that matches a digest).
        """
        digest = _digest(token)
        found: Identity | None = None
        for known, identity in self.entries:
            if hmac.compare_digest(known, digest) and found is None:
                found = identity
        if found is not None and learn:
            text = token.decode("utf-8", "replace")
            if text not in self._secrets:
                self._learn(text)
        return found


def presented_tokens(headers: Mapping[bytes, Sequence[bytes]]) -> list[bytes]:
    """
    The different tokens a request presents: at most one ``X-Access-Token``
    and one ``Authorization: Bearer``, the Bearer first.

    :raises ApiError: 400 ``ambiguous_credentials`` when two differing
        ``X-Access-Token`` values, or two differing Bearer tokens, are
        presented.
    """
    out: list[bytes] = []
    for values in (
        [
            rest.strip()
            for scheme, _, rest in (
                v.strip().partition(b" ") for v in headers.get(b"authorization", [])
            )
            if scheme.lower() == b"bearer"
        ],
        [v.strip() for v in headers.get(b"x-access-token", [])],
    ):
        distinct = set(values)
        if len(distinct) > 1:
            raise ambiguous_credentials("two different credentials were presented")
        if distinct and (token := distinct.pop()) not in out:
            out.append(token)
    return out


def presented_token(headers: Mapping[bytes, Sequence[bytes]]) -> bytes | None:
    """
    The token a request presents, or None.

    :raises ApiError: 400 ``ambiguous_credentials`` when two differing
        tokens are presented.
    """
    tokens = presented_tokens(headers)
    if len(tokens) > 1:
        raise ambiguous_credentials("two different credentials were presented")
    return tokens[0] if tokens else None


def authenticate_either(store: TokenStore, tokens: Sequence[bytes]) -> Identity:
    """
    The identity of a request that presents an ``X-Access-Token`` and a
    different Bearer token (:func:`presented_tokens`).

    A gateway in front of the daemon may add an ``X-Access-Token`` of its
    own, which this daemon does not know: as on the seed, the one token
    that logs in is used. Two that log in as different identities are
    never a choice the daemon makes (400), and in local mode neither
    matters.

    :raises ApiError: 401 when neither logs in; 400
        ``ambiguous_credentials`` when both do, as different identities.
    """
    if store.local_mode:
        return store.anonymous or ANONYMOUS
    found = {i for i in map(store.identify, tokens) if i is not None}
    if len(found) > 1:
        raise ambiguous_credentials("two different valid credentials were presented")
    if not found:
        raise unauthorized()
    return found.pop()


def authenticate(
    store: TokenStore, headers: Mapping[bytes, Sequence[bytes]]
) -> Identity:
    """The caller's identity; raises the 401 or 400 of SPEC §4."""
    return authenticate_token(store, presented_token(headers))


def authenticate_token(store: TokenStore, token: bytes | None) -> Identity:
    """
    The identity of a token already taken from the request's headers by
    :func:`presented_token` (which refused two differing ones); raises the
    401 of SPEC §4.
    """
    if store.local_mode:
        return store.anonymous or ANONYMOUS
    if not token:
        if store.anonymous is not None:
            return store.anonymous
        raise unauthorized()
    identity = store.identify(token)
    if identity is None:
        raise unauthorized()
    return identity
