"""
A policy written for the seed's own server loads here with the same effect:
every key and spelling the seed accepts, checked on the compiled policy.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.access import auth
from sandboxd.policy import PolicyError, load_policy
from sandboxd.policy.paths import decide as decide_path
from sandboxd.routes import builtin_table

TOKENS = {"T_ADMIN": "admin-token", "T_CI": "ci-token"}


def load(policy: Any, env: dict[str, str] | None = None, table: Any = None) -> Any:
    """The compiled policy, base dir /home/user."""
    return load_policy(
        table if table is not None else builtin_table(),
        explicit=policy,
        base_dir="/tmp",
        environ=env if env is not None else TOKENS,
    )


def who(policy: Any, token: str | None) -> auth.Identity:
    """The identity a request presenting ``token`` (or none) gets."""
    headers = {b"authorization": [b"Bearer " + token.encode()]} if token else {}
    return auth.authenticate(load(policy).tokens, headers)


class DocumentTests(SynchronousTestCase):
    """The seed's top-level keys."""

    def test_version_and_description(self) -> None:
        """version 1 and a description load; another version is refused."""
        p = load({"version": 1, "description": "CI runner"})
        self.assertEqual(p.document.description, "CI runner")
        with self.assertRaises(PolicyError) as cm:
            load({"version": 2})
        self.assertIn("version", str(cm.exception))

    def test_groups_as_a_list(self) -> None:
        """``groups: [dev_tools]`` turns the listed groups on."""
        p = load({"groups": ["dev_tools", "browser"]})
        self.assertTrue(p.rule("git_status").enabled)
        self.assertTrue(p.rule("browser_navigate").enabled)
        self.assertEqual(p.rule("git_status").enabled_by, "policy:groups.dev_tools")
        with self.assertRaises(PolicyError):
            load({"groups": ["dev_tols"]})

    def test_star_leaves_core_on(self) -> None:
        """``"*": {enabled: false}`` turns everything but core off."""
        p = load(
            {"endpoints": {"*": {"enabled": False}, "files_list": {"enabled": True}}}
        )
        for endpoint in ("health", "capabilities", "capabilities_check", "files_list"):
            self.assertTrue(p.rule(endpoint).enabled, endpoint)
        for endpoint in ("shell", "files_stat", "system_info"):
            self.assertFalse(p.rule(endpoint).enabled, endpoint)


class PathSpellingTests(SynchronousTestCase):
    """``read_only`` and ``symlinks`` in the seed's spellings."""

    def test_read_only_true(self) -> None:
        """read_only: true refuses every write; false lifts an inherited true."""
        p = load(
            {
                "endpoints": {
                    "files_*": {"paths": {"read_only": True}},
                    "files_upload_stream": {"paths": {"read_only": False}},
                }
            }
        )
        mkdir = decide_path(p.rule("files_mkdir"), "/tmp/new", "write")
        self.assertEqual((mkdir.allowed, str(mkdir.code)), (False, "read_only"))
        self.assertTrue(decide_path(p.rule("files_list"), "/tmp/x", "read").allowed)
        self.assertTrue(
            decide_path(p.rule("files_upload_stream"), "/tmp/x", "write").allowed
        )

    def test_symlinks_within_and_never(self) -> None:
        """within is follow-inside-the-boundary, never is deny."""
        p = load(
            {
                "endpoints": {
                    "files_list": {"paths": {"symlinks": "within"}},
                    "files_stat": {"paths": {"symlinks": "never"}},
                }
            }
        )
        self.assertEqual(p.rule("files_list").paths.symlinks, "follow")
        self.assertEqual(p.rule("files_stat").paths.symlinks, "deny")
        with self.assertRaises(PolicyError):
            load({"endpoints": {"files_stat": {"paths": {"symlinks": "sometimes"}}}})

    def test_deny_covers_what_lies_below(self) -> None:
        """
        ``**/.ssh`` denies the keys inside it, and ``*.pem`` a pem file
        anywhere, as the seed reads its deny lists.
        """
        p = load({"endpoints": {"files_*": {"paths": {"deny": ["**/.ssh", "*.pem"]}}}})
        rule = p.rule("files_stat")
        for path in ("/tmp/.ssh", "/tmp/.ssh/id_rsa", "/tmp/a/b/key.pem"):
            self.assertFalse(decide_path(rule, path).allowed, path)
        self.assertTrue(decide_path(rule, "/tmp/ssh-notes.txt").allowed)


class LimitNameTests(SynchronousTestCase):
    """The seed's limit names load and bound what they bound there."""

    def test_seed_limit_names(self) -> None:
        """max_depth, max_results and max_files are limits of their endpoints."""
        p = load(
            {
                "endpoints": {
                    "files_list": {"limits": {"max_depth": 3}},
                    "files_search": {"limits": {"max_results": 100, "max_depth": 5}},
                    "files_archive": {"limits": {"max_files": 1000}},
                }
            }
        )
        self.assertEqual(p.rule("files_list").limits.max_depth, 3)
        self.assertEqual(p.rule("files_search").limits.max_results, 100)
        self.assertEqual(p.rule("files_archive").limits.max_files, 1000)


class ScopeTests(SynchronousTestCase):
    """Custom scopes, namespace wildcards and the seed's read scopes."""

    def test_custom_scope_namespace(self) -> None:
        """A template's own scope (``myapp:deploy``) loads; a typo in ours does not."""
        p = load({"endpoints": {"shell": {"scopes": ["myapp:deploy"]}}})
        self.assertEqual(p.rule("shell").scopes, ("myapp:deploy",))
        with self.assertRaises(PolicyError) as cm:
            load({"endpoints": {"shell": {"scopes": ["files:reed"]}}})
        self.assertIn("files:read", str(cm.exception))

    def test_namespace_wildcard(self) -> None:
        """``files:*`` holds every files scope and nothing else."""
        identity = auth.Identity("r", frozenset({"files:*"}))
        self.assertTrue(identity.has_scope("files:delete"))
        self.assertFalse(identity.has_scope("process:run"))

    def test_seed_scopes_of_endpoints(self) -> None:
        """Listing and reading take the seed's own scopes."""
        p = load({})
        self.assertEqual(p.rule("list_commands").scopes, ("commands:list",))
        self.assertEqual(p.rule("process_list").scopes, ("process:read",))
        self.assertEqual(p.rule("git_diff").scopes, ("devtools:read",))
        self.assertEqual(p.rule("browser_evaluate").scopes, ("browser:evaluate",))


class AnonymousTests(SynchronousTestCase):
    """``allow_anonymous`` and ``anonymous_scopes``."""

    ADMIN = {"id": "admin", "token_env": "T_ADMIN", "scopes": ["*"]}

    def test_tokens_refuse_anonymous_by_default(self) -> None:
        """With tokens and no allow_anonymous, no credentials is 401."""
        from sandboxd.errors import ApiError

        with self.assertRaises(ApiError) as cm:
            who({"auth": {"tokens": [self.ADMIN]}}, None)
        self.assertEqual(cm.exception.status, 401)

    def test_allow_anonymous(self) -> None:
        """allow_anonymous lets a call with no token in, with anonymous_scopes."""
        policy = {
            "auth": {
                "tokens": [self.ADMIN],
                "allow_anonymous": True,
                "anonymous_scopes": ["files:read"],
            }
        }
        anonymous = who(policy, None)
        self.assertEqual(
            (anonymous.id, anonymous.scopes), ("anonymous", frozenset({"files:read"}))
        )
        self.assertEqual(who(policy, "admin-token").id, "admin")

    def test_anonymous_scopes_bound_local_mode(self) -> None:
        """With no tokens, anonymous_scopes narrow local mode itself."""
        identity = who({"auth": {"anonymous_scopes": ["system:read"]}}, None)
        self.assertEqual(identity.scopes, frozenset({"system:read"}))

    def test_everything_to_anonymous_warns(self) -> None:
        """allow_anonymous without anonymous_scopes loads, with a warning."""
        p = load({"auth": {"tokens": [self.ADMIN], "allow_anonymous": True}})
        self.assertTrue(any("allow_anonymous" in w for w in p.warnings))


class WarningTests(SynchronousTestCase):
    """What check-config says about a policy that loads."""

    def test_browser_url_rules_on_one_endpoint(self) -> None:
        """
        A url_deny or block_private_networks written on browser_navigate
        alone earns a warning naming the params and the endpoints: the
        one page meets every endpoint's URL rules.  Written on the group,
        or on none, it earns none.
        """
        p = load(
            {
                "groups": {"browser": True},
                "endpoints": {
                    "browser_navigate": {
                        "params": {
                            "url_deny": ["*/admin*"],
                            "block_private_networks": True,
                        }
                    }
                },
            }
        )
        found = [w for w in p.warnings if "browser endpoints" in w]
        self.assertEqual(len(found), 1, p.warnings)
        self.assertIn("params url_deny, block_private_networks differ", found[0])
        self.assertIn("(browser_navigate; browser_screenshot, ", found[0])
        self.assertIn("group:browser", found[0])
        for policy in (
            {"groups": {"browser": True}},
            {
                "groups": {"browser": True},
                "endpoints": {"group:browser": {"params": {"url_deny": ["*/admin*"]}}},
            },
        ):
            p = load(policy)
            self.assertEqual(
                [w for w in p.warnings if "browser endpoints" in w], [], policy
            )

    def test_open_custom_route(self) -> None:
        """A custom route registered with no scope earns a warning naming it."""
        table = builtin_table()
        table.register("GET", "/open", lambda r: {}, name="open_route", scopes=())
        p = load({}, table=table)
        self.assertTrue(
            any("'open_route'" in w and "no scope" in w for w in p.warnings), p.warnings
        )

    def test_narrowed_token(self) -> None:
        """A token with process:manage but not process:read is told what changed."""
        p = load(
            {
                "auth": {
                    "tokens": [
                        {"id": "ci", "token_env": "T_CI", "scopes": ["process:manage"]}
                    ]
                }
            }
        )
        self.assertTrue(
            any("'ci'" in w and "process:read" in w for w in p.warnings), p.warnings
        )

    def test_narrowed_one_command_token(self) -> None:
        """A token for one command (commands:run:NAME) is told listing needs commands:list."""
        p = load(
            {
                "auth": {
                    "tokens": [
                        {
                            "id": "ci",
                            "token_env": "T_CI",
                            "scopes": ["commands:run:build"],
                        }
                    ]
                }
            }
        )
        self.assertTrue(
            any("'ci'" in w and "commands:list" in w for w in p.warnings), p.warnings
        )


class TemplateScopeTests(SynchronousTestCase):
    """A custom route's own scopes are checked as a command's are."""

    def test_custom_route_scope_warned(self) -> None:
        """
        A custom route requiring a misspelt built-in scope is warned about,
        naming the scope it likely meant (was: loaded silently, callable
        by ``*`` tokens alone); with no tokens listed, nothing is said of
        who holds a template's own scope.
        """
        from sandboxd.endpoints import CapabilityGroup
        from sandboxd.policy.lint import template_warnings

        table = builtin_table()

        @table.route(
            "POST",
            "/myapp/wipe",
            group=CapabilityGroup.COMMANDS,
            name="myapp_wipe",
            scopes=["files:delte"],
        )
        def wipe(request: Any) -> dict[str, Any]:
            return {}

        policy = load_policy(table, {}, base_dir="/tmp", environ={}, fail_closed=False)
        self.assertEqual(
            template_warnings([], table, policy.document),
            [
                "custom route 'myapp_wipe': the scope 'files:delte' is no "
                "built-in scope; did you mean 'files:delete'?; no token can "
                "hold it, so only a '*' token may call it"
            ],
        )
