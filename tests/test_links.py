"""
Capability links (``sandboxd.access.links``, the ``auth`` group): minted narrowed
to the minter's scopes and an audience, checked by the gate as
``link:ID`` on behalf of the minter, listed, revoked, counted and expired;
against a real daemon on loopback.
"""

from __future__ import annotations

import errno
import hashlib
import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import gatherResults, inlineCallbacks
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access.auth import Identity, TokenStore
from sandboxd.access.links import LinkTable, read_key
from sandboxd.errors import ApiError
from sandboxd.policy.document import PolicyError, TokenSpec
from tests.helpers import DaemonTestCase

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


POLICY: dict[str, Any] = {
    "auth": {
        "tokens": [
            {"id": "admin", "token_sha256": _sha(ADMIN), "scopes": ["*"]},
            {
                "id": "reader",
                "token_sha256": _sha(READER),
                "scopes": ["links:mint", "system:read", "core:read"],
            },
        ]
    },
    "defaults": {"audit": "all"},
}


class LinkTableTests(SynchronousTestCase):
    """The token itself: signed, narrowed, expiring, counted."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.table = LinkTable(b"k" * 32, self.clock.seconds)
        self.minter = Identity("alice", frozenset({"preview:use", "files:read"}))

    def mint(self, audience: str = "preview:3000", **kw: Any) -> tuple[Any, str]:
        options: dict[str, Any] = {
            "scopes": None,
            "ttl": 60.0,
            "uses": None,
            "max_links": 10,
        }
        options.update(kw)
        return self.table.mint(
            self.minter,
            audience,
            options["scopes"],
            options["ttl"],
            options["uses"],
            options["max_links"],
        )

    def test_preview_link_carries_only_preview_use(self) -> None:
        """A preview link holds preview:use and acts for its minter."""
        link, token = self.mint()
        identity = self.table.verify(token, "preview:3000")
        self.assertEqual(identity.id, f"link:{link.id}")
        self.assertEqual(identity.on_behalf_of, "alice")
        self.assertEqual(identity.scopes, frozenset({"preview:use"}))

    def test_never_more_than_the_minter(self) -> None:
        """A scope the minter lacks is refused: 403 missing_scope."""
        with self.assertRaises(ApiError) as caught:
            self.mint("console", scopes=["process:run"])
        self.assertEqual(
            (caught.exception.status, caught.exception.code), (403, "missing_scope")
        )
        with self.assertRaises(ApiError) as caught:
            self.mint("preview:3000", scopes=["files:read"])
        self.assertEqual(caught.exception.status, 400)

    def test_never_outlives_a_minting_link(self) -> None:
        """A link minted with a link expires with it at the latest: no renewing for ever."""
        self.minter = Identity("alice", frozenset({"links:mint", "files:read"}))
        parent, token = self.mint("console", ttl=60.0)
        self.minter = self.table.verify(token, "console")
        child, _ = self.mint("console", ttl=3600.0)
        self.assertEqual(child.claims.exp, parent.claims.exp)
        self.assertEqual(child.claims.sub, "alice")
        shorter, _ = self.mint("console", ttl=10.0)
        self.assertEqual(shorter.claims.exp, self.clock.seconds() + 10.0)

    def test_forged_other_audience_expired(self) -> None:
        """A changed byte, another port or a passed expiry: 401 with its code."""
        _, token = self.mint()
        forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
        for bad, audience, code in [
            (forged, "preview:3000", "link_invalid"),
            (token, "preview:3001", "link_invalid"),
            ("sbxl_nonsense", "preview:3000", "link_invalid"),
        ]:
            with self.assertRaises(ApiError) as caught:
                self.table.verify(bad, audience)
            self.assertEqual(
                (caught.exception.status, caught.exception.code), (401, code)
            )
        self.clock.advance(61)
        with self.assertRaises(ApiError) as caught:
            self.table.verify(token, "preview:3000")
        self.assertEqual(caught.exception.code, "link_expired")

    def test_uses_are_counted(self) -> None:
        """A link for one use works once when presented; a cookie does not count."""
        _, token = self.mint(uses=1)
        self.table.verify(token, "preview:3000")
        self.table.verify(token, "preview:3000", consume=False)
        with self.assertRaises(ApiError) as caught:
            self.table.verify(token, "preview:3000")
        self.assertEqual(caught.exception.code, "link_invalid")

    def test_at_most_the_minter_now(self) -> None:
        """
        A link holds only what its minter holds now: narrowed with the
        minter (a ``*`` or ``files:*`` link keeps what the minter kept), and
        refused once the minter is out of the policy, a link's link too;
        ``anonymous``'s links live while requests without a token are let in.
        """
        self.minter = Identity("alice", frozenset({"files:read", "files:write"}))
        _, token = self.mint("console")
        child_minter = self.table.verify(token, "console")
        self.minter = Identity("alice", frozenset({"*"}))
        _, wide = self.mint("console", scopes=["*"])
        self.minter = child_minter
        _, child = self.mint("console", scopes=["files:read"])

        def store(scopes: list[str] | None) -> TokenStore:
            specs = [TokenSpec("bob", ("*",), token_sha256="0" * 64)]
            if scopes is not None:
                specs.append(TokenSpec("alice", tuple(scopes), token_sha256="1" * 64))
            return TokenStore.build(specs)

        narrowed = store(["files:read", "links:mint"])
        self.assertEqual(
            self.table.verify(token, "console", tokens=narrowed).scopes,
            frozenset({"files:read"}),
        )
        self.assertEqual(
            self.table.verify(wide, "console", tokens=narrowed).scopes,
            frozenset({"files:read", "links:mint"}),
        )
        for presented in (token, wide, child):
            with self.assertRaises(ApiError) as caught:
                self.table.verify(presented, "console", tokens=store(None))
            self.assertEqual(
                (caught.exception.status, caught.exception.code),
                (401, "link_invalid"),
            )
            self.assertIn("no longer in the policy", caught.exception.message)
        self.minter = Identity("anonymous", frozenset({"*"}))
        _, anonymous = self.mint("console", scopes=["files:read"])
        self.assertEqual(
            self.table.verify(anonymous, "console", tokens=TokenStore.build([])).scopes,
            frozenset({"files:read"}),
        )
        with self.assertRaises(ApiError):
            self.table.verify(anonymous, "console", tokens=store([]))
        allowed = TokenStore.build(
            [TokenSpec("bob", ("*",), token_sha256="0" * 64)],
            allow_anonymous=True,
            anonymous_scopes=["system:read"],
        )
        self.assertEqual(
            self.table.verify(anonymous, "console", tokens=allowed).scopes,
            frozenset(),
        )

    def test_bounded(self) -> None:
        """At most max_links live links; expired ones make room."""
        for _ in range(3):
            self.mint(max_links=3)
        with self.assertRaises(ApiError) as caught:
            self.mint(max_links=3)
        self.assertEqual(caught.exception.status, 429)
        self.clock.advance(61)
        self.mint(max_links=3)
        self.assertEqual(len(self.table.links), 1)

    def test_key_file(self) -> None:
        """A key file survives restarts: a second table with it verifies the link."""
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        first = LinkTable(read_key(path), self.clock.seconds)
        _, token = first.mint(self.minter, "console", ["files:read"], 60, None, 10)
        second = LinkTable.for_key_file(path, self.clock.seconds)
        self.assertEqual(
            second.verify(token, "console").scopes, frozenset({"files:read"})
        )
        short = self.mktemp()
        with open(short, "wb") as f:
            f.write(b"short")
        self.assertRaises(PolicyError, read_key, short)

    def test_made_before_a_restart(self) -> None:
        """
        With a key made at each start, a link from an earlier start is
        refused saying the daemon may have restarted; with a key file,
        where a restart is not the cause, a link that fails its check is
        only "not valid".
        """
        before = LinkTable.for_key_file(None, self.clock.seconds)
        _, token = before.mint(self.minter, "console", ["files:read"], 60, None, 10)
        after = LinkTable.for_key_file(None, self.clock.seconds)
        with self.assertRaises(ApiError) as caught:
            after.verify(token, "console")
        self.assertEqual(caught.exception.code, "link_invalid")
        self.assertIn("restarted", caught.exception.message)
        self.assertIn("auth.link_key_file", caught.exception.message)
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        kept = LinkTable.for_key_file(path, self.clock.seconds)
        with self.assertRaises(ApiError) as caught:
            kept.verify(token, "console")
        self.assertEqual(caught.exception.message, "the link is not valid")


class LinkRoutesTests(DaemonTestCase):
    """``/auth/links`` and the gate, through the HTTP door."""

    policy = POLICY
    token = ADMIN
    audit = True

    @inlineCallbacks
    def test_mint_use_list_revoke(self) -> None:
        """
        A console link minted by ``reader`` calls what reader may, as
        ``link:ID`` on behalf of reader (both in the audit line), is listed
        for reader only, and stops working once revoked.
        """
        reply = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"], "ttl_seconds": 600},
            token=READER,
        )
        self.assertEqual(reply.status, 201, reply.body)
        minted = reply.json()
        self.assertTrue(minted["token"].startswith("sbxl_"))
        link = minted["token"]
        info = yield self.request("GET", "/system/info", token=link)
        self.assertEqual(info.status, 200, info.body)
        caps = yield self.request("GET", "/capabilities", token=link)
        self.assertEqual(caps.json()["identity"]["on_behalf_of"], "reader")
        denied = yield self.request("GET", "/auth/links", token=link)
        self.assertEqual(denied.status, 403)
        lines = [r for r in self.audit_lines() if r.get("endpoint") == "system_info"]
        self.assertEqual(lines[-1]["identity"], f"link:{minted['link_id']}")
        self.assertEqual(lines[-1]["on_behalf_of"], "reader")
        mine = yield self.request("GET", "/auth/links", token=READER)
        self.assertEqual(
            [x["link_id"] for x in mine.json()["links"]], [minted["link_id"]]
        )
        # An identity holding * sees every live link, with who made it.
        admins = yield self.request("GET", "/auth/links")
        self.assertEqual(
            [(x["link_id"], x["on_behalf_of"]) for x in admins.json()["links"]],
            [(minted["link_id"], "reader")],
        )
        self.assertEqual(mine.json()["links"][0]["on_behalf_of"], "reader")
        gone = yield self.request(
            "DELETE", f"/auth/links/{minted['link_id']}", token=READER
        )
        self.assertEqual(gone.status, 200)
        self.assertTrue(gone.json()["revoked"])
        after = yield self.request("GET", "/system/info", token=link)
        self.assertEqual((after.status, after.json()["code"]), (401, "link_invalid"))

    @inlineCallbacks
    def test_refusals(self) -> None:
        """More than the minter holds, a bad audience, a long TTL (cut to 3600)."""
        wide = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["*"]},
            token=READER,
        )
        self.assertEqual((wide.status, wide.json()["code"]), (403, "missing_scope"))
        bad = yield self.request("POST", "/auth/links", {"audience": "everything"})
        self.assertEqual((bad.status, bad.json()["code"]), (400, "invalid_param"))
        long = yield self.request(
            "POST", "/auth/links", {"audience": "preview:3000", "ttl_seconds": 999999}
        )
        self.assertEqual(long.status, 201)
        self.assertEqual(long.json()["scopes"], ["preview:use"])
        link = long.json()["token"]
        # A preview link is no credential for the API.
        api = yield self.request("GET", "/capabilities", token=link)
        self.assertEqual((api.status, api.json()["code"]), (401, "link_invalid"))

    @inlineCallbacks
    def test_minter_narrowed_or_removed_on_reload(self) -> None:
        """
        A policy reload that narrows the minter narrows its links at once
        (403 where the minter is refused too); one that removes the minter
        kills its links, and the links they made, with a 401 saying why,
        for good: one that gives the minter back does not bring them back.
        """
        yield self.start_on_policy_file(POLICY)
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read", "links:mint"]},
            token=READER,
        )
        link = minted.json()["token"]
        child = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"]},
            token=link,
        )
        self.assertEqual(child.status, 201, child.body)
        for token in (link, child.json()["token"]):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual(info.status, 200, info.body)

        def reload(reader: dict[str, Any] | None) -> None:
            tokens = [POLICY["auth"]["tokens"][0], *([reader] if reader else [])]
            self.reload_policy({**POLICY, "auth": {"tokens": tokens}})

        reload({**POLICY["auth"]["tokens"][1], "scopes": ["links:mint"]})
        for token in (READER, link):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual(
                (info.status, info.json()["code"]), (403, "missing_scope"), token
            )
        caps = yield self.request("GET", "/capabilities", token=link)
        self.assertEqual(caps.json()["identity"]["scopes"], ["links:mint"])
        reload(None)
        for token in (link, child.json()["token"]):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual((info.status, info.json()["code"]), (401, "link_invalid"))
            self.assertIn("was taken out of the policy", info.json()["error"])
        # Giving the identity back does not bring its links back.
        reload(POLICY["auth"]["tokens"][1])
        info = yield self.request("GET", "/system/info", token=READER)
        self.assertEqual(info.status, 200, info.body)
        for token in (link, child.json()["token"]):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual((info.status, info.json()["code"]), (401, "link_invalid"))

    @inlineCallbacks
    def test_shares_of_the_table(self) -> None:
        """
        One identity holds at most its share of the link table (half), so
        the others can still open the console; revoking a link frees its
        place, and so does taking its minter out of the policy.
        """
        third = "third-token-0123456789"
        tokens = [
            *POLICY["auth"]["tokens"],
            {"id": "third", "token_sha256": _sha(third), "scopes": ["links:mint"]},
        ]
        policy = {
            **POLICY,
            "auth": {"tokens": tokens},
            "endpoints": {"links_mint": {"limits": {"max_sessions": 4}}},
        }
        yield self.start_on_policy_file(policy)

        def mint(token: str) -> Any:
            return self.request(
                "POST",
                "/auth/links",
                {"audience": "console", "scopes": []},
                token=token,
            )

        made = []
        for _ in range(2):
            reply = yield mint(READER)
            self.assertEqual(reply.status, 201, reply.body)
            made.append(reply.json()["link_id"])
        over = yield mint(READER)
        self.assertEqual(
            (over.status, over.json()["code"], over.json()["rule"]),
            (
                429,
                "too_many_sessions",
                "default:limits.max_per_identity",
            ),
        )
        for _ in range(2):
            reply = yield mint(ADMIN)
            self.assertEqual(reply.status, 201, reply.body)
        full = yield mint(third)
        self.assertEqual((full.status, full.json()["code"]), (429, "too_many_sessions"))
        gone = yield self.request("DELETE", f"/auth/links/{made[0]}", token=READER)
        self.assertEqual(gone.status, 200, gone.body)
        freed = yield mint(third)
        self.assertEqual(freed.status, 201, freed.body)
        full = yield mint(third)
        self.assertEqual(full.status, 429, full.body)
        self.reload_policy({**policy, "auth": {"tokens": [tokens[0], tokens[2]]}})
        freed = yield mint(third)
        self.assertEqual(freed.status, 201, freed.body)

    @inlineCallbacks
    def test_minters_token_rotated_on_reload(self) -> None:
        """
        A reload that changes the minter's token (its file rewritten, as a
        leaked token is rotated) ends the links it made with the old one,
        and the links they made, with a 401 saying why, for good: the old
        token written back does not bring them back.
        """
        token_file = os.path.join(os.path.dirname(self.base_dir), "reader-token")

        def write(token: str) -> None:
            with open(token_file, "w") as f:
                f.write(token)

        write(READER)
        reader = {
            "id": "reader",
            "token_file": token_file,
            "scopes": ["links:mint", "system:read", "core:read"],
        }
        policy = {**POLICY, "auth": {"tokens": [POLICY["auth"]["tokens"][0], reader]}}
        yield self.start_on_policy_file(policy)
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read", "links:mint"]},
            token=READER,
        )
        link = minted.json()["token"]
        child = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"]},
            token=link,
        )
        self.assertEqual(child.status, 201, child.body)
        rotated = "reader-rotated-0123456789"
        write(rotated)
        self.reload_policy(policy)
        for token in (link, child.json()["token"]):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual((info.status, info.json()["code"]), (401, "link_invalid"))
            self.assertIn("was changed", info.json()["error"])
        old = yield self.request("GET", "/system/info", token=READER)
        self.assertEqual(old.status, 401)
        new = yield self.request("GET", "/system/info", token=rotated)
        self.assertEqual(new.status, 200, new.body)
        write(READER)
        self.reload_policy(policy)
        for token in (link, child.json()["token"]):
            info = yield self.request("GET", "/system/info", token=token)
            self.assertEqual((info.status, info.json()["code"]), (401, "link_invalid"))

    @inlineCallbacks
    def test_refused_calls_spend_no_use(self) -> None:
        """
        A call the gate refuses (a missing scope, a switched-off endpoint,
        a foreign Origin, a rate limit) spends no use of a counted link;
        each call it lets in spends one, and then the link is used up.
        """
        yield self.daemon.stop()
        yield self.start(
            policy={
                **POLICY,
                "endpoints": {
                    "system_metrics": {"enabled": False},
                    "system_info": {"limits": {"rate_per_minute": 3}},
                },
            }
        )
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"], "uses": 3},
        )
        link = minted.json()["token"]
        refused = [
            ("GET", "/auth/links", {}, 403, "missing_scope"),
            ("GET", "/system/metrics", {}, 404, "endpoint_disabled"),
            (
                "GET",
                "/system/info",
                {"Origin": "http://evil.example"},
                403,
                "origin_not_allowed",
            ),
        ]
        for method, path, headers, status, code in refused:
            reply = yield self.request(method, path, token=link, headers=headers)
            self.assertEqual((reply.status, reply.json()["code"]), (status, code))
        for _ in range(2):
            ok = yield self.request("GET", "/system/info", token=link)
            self.assertEqual(ok.status, 200, ok.body)
        limited = yield self.request("GET", "/system/info", token=link)
        self.assertEqual(
            (limited.status, limited.json()["code"]), (429, "rate_limited")
        )
        listed = yield self.request("GET", "/auth/links")
        self.assertEqual(listed.json()["links"][0]["used"], 2)
        last = yield self.request("GET", "/capabilities", token=link)
        self.assertEqual(last.status, 200, last.body)
        spent = yield self.request("GET", "/capabilities", token=link)
        self.assertEqual((spent.status, spent.json()["code"]), (401, "link_invalid"))
        self.assertIn("used up", spent.json()["error"])

    @inlineCallbacks
    def test_one_use_at_once(self) -> None:
        """Twenty calls at once with a link for one use: exactly one is let in."""
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"], "uses": 1},
        )
        link = minted.json()["token"]
        replies = yield gatherResults(
            [self.request("GET", "/system/info", token=link) for _ in range(20)]
        )
        self.assertEqual(sorted(r.status for r in replies), [200] + [401] * 19)

    @inlineCallbacks
    def test_group_can_be_switched_off(self) -> None:
        """The auth group is on by default and a policy can turn it off."""
        yield self.daemon.stop()
        policy = {**POLICY, "groups": {"auth": False}}
        yield self.start(policy=policy)
        reply = yield self.request("POST", "/auth/links", {"audience": "console"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (404, "endpoint_disabled")
        )


class LinkStateTests(SynchronousTestCase):
    """The table kept in the state directory, read back by the next table."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.key = self.mktemp()
        with open(self.key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        self.state = self.mktemp()
        self.minter = Identity("alice", frozenset({"preview:use"}))

    def table(self) -> LinkTable:
        return LinkTable.for_key_file(self.key, self.clock.seconds, self.state)

    def test_counts_and_revocations_survive(self) -> None:
        """A counted link keeps its remaining uses; a revoked one stays refused."""
        first = self.table()
        counted, token = first.mint(self.minter, "preview:3000", None, 60, 3, 10)
        revoked, gone = first.mint(self.minter, "preview:3000", None, 60, None, 10)
        first.verify(token, "preview:3000")
        first.revoke(revoked.id, self.minter)
        path = os.path.join(self.state, "links.json")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        second = self.table()
        self.assertEqual(second.links[counted.id].used, 1)
        second.verify(token, "preview:3000")
        second.verify(token, "preview:3000")
        third = self.table()
        for table, presented in ((third, token), (third, gone)):
            with self.assertRaises(ApiError) as caught:
                table.verify(presented, "preview:3000")
            self.assertEqual(caught.exception.code, "link_invalid")

    def test_expired_and_other_keys_forgotten(self) -> None:
        """Expired links are not read back; a state file of another key is ignored."""
        first = self.table()
        _, token = first.mint(self.minter, "preview:3000", None, 10, 1, 10)
        self.clock.advance(11)
        later = self.table()
        later.prune()
        self.assertEqual(later.links, {})
        with self.assertRaises(ApiError) as caught:
            self.table().verify(token, "preview:3000")
        self.assertEqual(caught.exception.code, "link_expired")
        self.clock.advance(-11)
        with open(self.key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        self.assertEqual(self.table().links, {})

    def test_unreadable_state_refuses_earlier_links(self) -> None:
        """
        A state file that is not JSON fails closed: every link made before
        (a revoked one among them) is refused as revoked, across later
        restarts too; the file is kept as ``links.json.bad``; links made
        since work.
        """
        first = self.table()
        revoked, gone = first.mint(self.minter, "preview:3000", None, 60, None, 10)
        _, kept = first.mint(self.minter, "preview:3000", None, 60, None, 10)
        first.revoke(revoked.id, self.minter)
        path = os.path.join(self.state, "links.json")
        with open(path, "w") as f:
            f.write('{"uses": {"x": ')
        table = self.table()
        with open(path + ".bad") as f:
            self.assertEqual(f.read(), '{"uses": {"x": ')
        _, fresh = table.mint(self.minter, "preview:3000", None, 60, None, 10)
        for later in (table, self.table()):
            for presented in (gone, kept):
                with self.assertRaises(ApiError) as caught:
                    later.verify(presented, "preview:3000")
                self.assertEqual(caught.exception.code, "link_invalid")
                self.assertIn("treated as revoked", caught.exception.message)
            later.verify(fresh, "preview:3000")

    def test_full_disk_leaves_the_old_state(self) -> None:
        """
        A state that cannot be written (a full disk): a mint is refused 507
        and makes no link; the file written before stays as it was, with
        no temporary file beside it.
        """
        table = self.table()
        table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        path = os.path.join(self.state, "links.json")
        with open(path, "rb") as f:
            before = f.read()
        links = dict(table.links)
        replace = self.full_disk()
        with self.assertRaises(ApiError) as caught:
            table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        self.assertEqual(
            (caught.exception.status, caught.exception.code),
            (507, "insufficient_storage"),
        )
        self.assertEqual(table.links, links)
        self.assertEqual(os.listdir(self.state), ["links.json"])
        with open(path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.patch(os, "replace", replace)
        table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        self.assertEqual(len(self.table().links), 2)

    def test_read_only_state_is_not_a_full_disk(self) -> None:
        """
        A state dir that cannot be written for another reason than space
        (a read-only file system): the 507 says so, naming the state file
        and the system's reason, not "the disk is full".
        """
        table = self.table()

        def read_only(*_: Any) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        self.patch(os, "replace", read_only)
        with self.assertRaises(ApiError) as caught:
            table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        error = caught.exception
        self.assertEqual((error.status, error.code), (507, "insufficient_storage"))
        self.assertNotIn("disk is full", error.message)
        self.assertIn("the state dir is not writable", error.message)
        self.assertIn(os.path.join(self.state, "links.json"), error.message)
        self.assertIn("(Read-only file system)", error.message)
        self.assertIn("no link was made", error.message)
        self.assertEqual(table.links, {})
        self.full_disk()
        with self.assertRaises(ApiError) as caught:
            table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        self.assertIn("the disk is full", caught.exception.message)
        self.assertIn("(No space left on device)", caught.exception.message)

    def test_full_disk_revocation_holds(self) -> None:
        """
        A revocation that cannot be kept is 507 but holds from then on (a
        leaked link must stop at once); revoked again once there is room,
        it is kept: a restart still refuses the link.
        """
        table = self.table()
        link, token = table.mint(self.minter, "preview:3000", None, 60, None, 10)
        replace = self.full_disk()
        with self.assertRaises(ApiError) as caught:
            table.revoke(link.id, self.minter)
        self.assertEqual(caught.exception.status, 507)
        self.assertIn("revoke it again", caught.exception.message)
        with self.assertRaises(ApiError) as caught:
            table.verify(token, "preview:3000")
        self.assertEqual(caught.exception.code, "link_invalid")
        self.patch(os, "replace", replace)
        table.revoke(link.id, self.minter)
        with self.assertRaises(ApiError) as caught:
            self.table().verify(token, "preview:3000")
        self.assertEqual(caught.exception.code, "link_invalid")

    def test_full_disk_counted_use_refused(self) -> None:
        """
        A use of a counted link that cannot be kept is refused 507 and not
        counted (a restart must not give a use back); with room it counts.
        """
        table = self.table()
        link, token = table.mint(self.minter, "preview:3000", None, 60, 1, 10)
        replace = self.full_disk()
        with self.assertRaises(ApiError) as caught:
            table.verify(token, "preview:3000")
        self.assertEqual(caught.exception.status, 507)
        self.assertEqual(table.links[link.id].used, 0)
        self.patch(os, "replace", replace)
        table.verify(token, "preview:3000")
        self.assertEqual(self.table().links[link.id].used, 1)

    def full_disk(self) -> Any:
        """Make every write of the state fail with ENOSPC; the real ``os.replace``."""
        replace = os.replace

        def full(*_: Any) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        self.patch(os, "replace", full)
        return replace


class LinkRestartTests(DaemonTestCase):
    """Links across a daemon restart on the same state directory."""

    token = ADMIN
    autostart = False

    @inlineCallbacks
    def test_restart_keeps_counts_and_deaths(self) -> None:
        """
        After a restart with the same key file and state dir: a counted link
        has exactly its remaining uses, a revoked link and an expired link
        are still refused, and the list shows what was used.
        """
        key = os.path.join(self.base_dir, "link.key")
        with open(key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        state = os.path.join(self.base_dir, "state")
        policy = {**POLICY, "auth": {**POLICY["auth"], "link_key_file": key}}

        def mint(**body: Any) -> Any:
            return self.request(
                "POST",
                "/auth/links",
                {"audience": "console", "scopes": ["system:read"], **body},
                token=READER,
            )

        yield self.start(stop_at_end=False, policy=policy, state_dir=state)
        counted = (yield mint(uses=2)).json()
        revoked = (yield mint()).json()
        expiring = (yield mint(ttl_seconds=1)).json()
        used = yield self.request("GET", "/system/info", token=counted["token"])
        self.assertEqual(used.status, 200)
        gone = yield self.request(
            "DELETE", f"/auth/links/{revoked['link_id']}", token=READER
        )
        self.assertEqual(gone.status, 200)
        yield self.daemon.stop()
        yield deferLater(reactor, 1.1, lambda: None)
        yield self.start(policy=policy, state_dir=state)
        listed = yield self.request("GET", "/auth/links", token=READER)
        by_id = {x["link_id"]: x for x in listed.json()["links"]}
        self.assertEqual(by_id[counted["link_id"]]["used"], 1)
        self.assertTrue(by_id[revoked["link_id"]]["revoked"])
        second = yield self.request("GET", "/system/info", token=counted["token"])
        self.assertEqual(second.status, 200, second.body)
        for token, code in (
            (counted["token"], "link_invalid"),
            (revoked["token"], "link_invalid"),
            (expiring["token"], "link_expired"),
        ):
            reply = yield self.request("GET", "/system/info", token=token)
            self.assertEqual((reply.status, reply.json()["code"]), (401, code))

    @inlineCallbacks
    def test_restart_without_the_minter(self) -> None:
        """
        A link kept across a restart (a key file and a state dir) is refused
        when the daemon comes back with a policy that no longer has its
        minter, and stays refused when a later start gives the minter back.
        """
        key = os.path.join(self.base_dir, "link.key")
        with open(key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        state = os.path.join(self.base_dir, "state")
        policy = {**POLICY, "auth": {**POLICY["auth"], "link_key_file": key}}
        yield self.start(stop_at_end=False, policy=policy, state_dir=state)
        minted = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["system:read"]},
            token=READER,
        )
        link = minted.json()["token"]
        yield self.daemon.stop()
        without = {
            "auth": {"tokens": POLICY["auth"]["tokens"][:1], "link_key_file": key}
        }
        yield self.start(stop_at_end=False, policy=without, state_dir=state)
        reply = yield self.request("GET", "/system/info", token=link)
        self.assertEqual((reply.status, reply.json()["code"]), (401, "link_invalid"))
        self.assertIn("was taken out of the policy", reply.json()["error"])
        # Its minter given back at the next start: the link stays ended.
        yield self.daemon.stop()
        yield self.start(policy=policy, state_dir=state)
        reply = yield self.request("GET", "/system/info", token=link)
        self.assertEqual((reply.status, reply.json()["code"]), (401, "link_invalid"))
        self.assertIn("giving the identity back does not", reply.json()["error"])
