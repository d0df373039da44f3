"""
The five-layer merge of SPEC §5.3, table-driven: every selector kind
against every layer, enabled true and false, and the rule string behind
each decision.
"""

from __future__ import annotations

import json
import os
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.endpoints import CapabilityGroup
from sandboxd.policy import PolicyError, load_policy
from sandboxd.policy.defaults import PATH_DECISIONS_KEPT
from sandboxd.policy.paths import FORBIDDEN_ROOTS, in_system_root, under
from sandboxd.policy.paths import decide as decide_path
from sandboxd.routes import builtin_table


def decide(
    policy: Any = None,
    preset: str | None = None,
    env: dict[str, str] | None = None,
    code: list[tuple[str, str]] | None = None,
) -> Any:
    """The compiled policy for a document, preset, environment and code layer."""
    table = builtin_table()
    for action, group in code or []:
        getattr(table, action)(group)
    return load_policy(
        table, explicit=policy or {}, preset=preset, base_dir="/tmp", environ=env or {}
    )


class DefaultLayerTests(SynchronousTestCase):
    """With no policy, optional groups are off and say so."""

    def test_default_on_groups(self) -> None:
        """Core, commands, file_ops, process, terminal and system are on by default (when built)."""
        p = decide()
        self.assertTrue(p.rule("health").enabled)
        self.assertEqual(p.rule("list_commands").enabled_by, "default:on:commands")

    def test_opt_in_groups_off(self) -> None:
        """dev_tools, browser and agents are off with rule default:opt-in:GROUP."""
        p = decide()
        for endpoint, group in (
            ("code_run", "dev_tools"),
            ("browser_navigate", "browser"),
            ("agents_catalog", "agents"),
        ):
            rule = p.rule(endpoint)
            self.assertFalse(rule.enabled)
            if rule.reason != "not_implemented":
                self.assertEqual(rule.enabled_by, f"default:opt-in:{group}")


# (description, layers, endpoint, expected enabled, expected rule)
# Uses list_commands (implemented) so not-implemented never masks the result.
CASES: list[tuple[str, dict[str, Any], str, bool, str]] = [
    (
        "policy group off",
        {"policy": {"groups": {"commands": False}}},
        "list_commands",
        False,
        "policy:groups.commands",
    ),
    (
        "policy endpoints group: off",
        {"policy": {"endpoints": {"group:commands": {"enabled": False}}}},
        "list_commands",
        False,
        "policy:endpoints.group:commands",
    ),
    (
        "policy exact off",
        {"policy": {"endpoints": {"list_commands": {"enabled": False}}}},
        "list_commands",
        False,
        "policy:endpoints.list_commands",
    ),
    (
        "policy glob off",
        {"policy": {"endpoints": {"commands_*": {"enabled": False}}}},
        "list_commands",
        False,
        "policy:endpoints.commands_*",
    ),
    (
        "exact on beats glob off",
        {
            "policy": {
                "endpoints": {
                    "commands_*": {"enabled": False},
                    "list_commands": {"enabled": True},
                }
            }
        },
        "list_commands",
        True,
        "policy:endpoints.list_commands",
    ),
    (
        "glob on beats group off",
        {
            "policy": {
                "groups": {"commands": False},
                "endpoints": {"commands_*": {"enabled": True}},
            }
        },
        "list_commands",
        True,
        "policy:endpoints.commands_*",
    ),
    (
        "defaults off switches a default-on group off (as on the seed)",
        {"policy": {"defaults": {"enabled": False}}},
        "list_commands",
        False,
        "policy:defaults",
    ),
    (
        "a group beats defaults",
        {"policy": {"defaults": {"enabled": False}, "groups": {"commands": True}}},
        "list_commands",
        True,
        "policy:groups.commands",
    ),
    (
        "defaults on leaves an opt-in group off by its own rule",
        {"policy": {"defaults": {"enabled": True}}},
        "git_status",
        False,
        "default:opt-in:dev_tools",
    ),
    (
        "code disable",
        {"code": [("disable_group", "commands")]},
        "list_commands",
        False,
        "code:disable_group:commands",
    ),
    (
        "policy group on beats code disable",
        {
            "code": [("disable_group", "commands")],
            "policy": {"groups": {"commands": True}},
        },
        "list_commands",
        True,
        "policy:groups.commands",
    ),
    ("preset locked", {"preset": "locked"}, "shell", False, "preset:locked"),
    (
        "preset locked keeps commands",
        {"preset": "locked"},
        "list_commands",
        True,
        "preset:locked",
    ),
    (
        "a preset's pattern beats a policy group",
        {"preset": "locked", "policy": {"groups": {"process": True}}},
        "shell",
        False,
        "preset:locked",
    ),
    (
        "policy group beats preset group",
        {"preset": "hardened", "policy": {"groups": {"process": True}}},
        "shell",
        True,
        "policy:groups.process",
    ),
    (
        "a policy's exact id beats a preset's pattern",
        {"preset": "locked", "policy": {"endpoints": {"shell": {"enabled": True}}}},
        "shell",
        True,
        "policy:endpoints.shell",
    ),
    (
        "env turns group on over policy off",
        {
            "policy": {"groups": {"commands": False}},
            "env": {"ABX_SERVER_ENABLED_GROUPS": "commands"},
        },
        "list_commands",
        True,
        "env:ABX_SERVER_ENABLED_GROUPS",
    ),
    (
        "exact policy off beats env group on",
        {
            "policy": {"endpoints": {"list_commands": {"enabled": False}}},
            "env": {"ABX_SERVER_ENABLED_GROUPS": "commands"},
        },
        "list_commands",
        False,
        "policy:endpoints.list_commands",
    ),
    (
        "false wins within a layer and specificity",
        {
            "policy": {
                "endpoints": {
                    "commands_*": {"enabled": True},
                    "*_list": {"enabled": False},
                }
            }
        },
        "list_commands",
        False,
        "policy:endpoints.*_list",
    ),
    (
        "false wins regardless of order",
        {
            "policy": {
                "endpoints": {
                    "*_list": {"enabled": False},
                    "commands_*": {"enabled": True},
                }
            }
        },
        "list_commands",
        False,
        "policy:endpoints.*_list",
    ),
]


class PrecedenceTests(SynchronousTestCase):
    """Each case: the decision and the rule string that made it."""

    def test_cases(self) -> None:
        """Every row of CASES holds."""
        for description, layers, endpoint, enabled, rule in CASES:
            p = decide(
                layers.get("policy"),
                layers.get("preset"),
                layers.get("env"),
                layers.get("code"),
            )
            got = p.rule(endpoint)
            self.assertEqual(
                (got.enabled, got.enabled_by), (enabled, rule), description
            )


class LeafMergeTests(SynchronousTestCase):
    """Leaf keys merge independently; lists replace, never concatenate."""

    def test_limits_merge_per_leaf(self) -> None:
        """A group's limit and an endpoint's other limit both apply."""
        p = decide(
            {
                "endpoints": {
                    "group:commands": {
                        "limits": {"max_concurrency": 4, "rate_per_minute": 10}
                    },
                    "run_command": {"limits": {"rate_per_minute": 60}},
                }
            }
        )
        rule = p.rule("run_command")
        self.assertEqual(rule.limits.max_concurrency, 4)
        self.assertEqual(rule.limits.rate_per_minute, 60)
        self.assertEqual(
            rule.source("limits.rate_per_minute"), "policy:endpoints.run_command"
        )
        self.assertEqual(
            rule.source("limits.max_concurrency"), "policy:endpoints.group:commands"
        )

    def test_lists_replace(self) -> None:
        """An exact rule's allow list replaces the defaults' list."""
        p = decide(
            {
                "defaults": {"params": {"allow_commands": ["ls", "cat"]}},
                "endpoints": {"shell": {"params": {"allow_commands": ["git"]}}},
            }
        )
        self.assertEqual(p.rule("shell").params.allow_commands, ("git",))
        self.assertEqual(p.rule("process_start").params.allow_commands, ("ls", "cat"))

    def test_deny_lists_add_up(self) -> None:
        """Deny lists add up across selectors and layers, as on the seed."""
        p = decide(
            {
                "preset": "hardened",
                "defaults": {"params": {"deny_commands": ["rm", "dd"]}},
                "endpoints": {
                    "shell": {"params": {"deny_commands": ["curl"]}},
                    "files_list": {"paths": {"deny": ["**/secret"]}},
                },
            }
        )
        self.assertEqual(p.rule("shell").params.deny_commands, ("rm", "dd", "curl"))
        self.assertEqual(p.rule("process_start").params.deny_commands, ("rm", "dd"))
        deny = p.rule("files_list").paths.deny
        self.assertIn("**/secret", deny)
        self.assertIn("**/.ssh", deny)

    def test_sizes(self) -> None:
        """Size strings: MB is 10**6, MiB is 2**20; upload caps derive from max_bytes."""
        p = decide(
            {
                "endpoints": {
                    "upload": {"limits": {"max_bytes": "5MB"}},
                    "files_write_raw": {"limits": {"max_bytes": "1GiB"}},
                }
            }
        )
        self.assertEqual(p.rule("upload").limits.max_bytes, 5_000_000)
        self.assertEqual(
            p.rule("upload").limits.max_request_bytes, 5_000_000 * 4 // 3 + 65536
        )
        self.assertEqual(p.rule("files_write_raw").limits.max_bytes, 2**30)
        self.assertEqual(p.rule("files_write_raw").limits.max_request_bytes, 2**30)

    def test_upload_cap_from_environment(self) -> None:
        """ABX_MAX_UPLOAD_SIZE sets the default max_bytes of upload routes."""
        p = decide(env={"ABX_MAX_UPLOAD_SIZE": "1000"})
        self.assertEqual(p.rule("files_upload_stream").limits.max_bytes, 1000)

    def test_scopes_replace(self) -> None:
        """A rule's scopes replace the endpoint's documented scopes."""
        p = decide({"endpoints": {"list_commands": {"scopes": ["files:read"]}}})
        self.assertEqual(p.rule("list_commands").scopes, ("files:read",))
        self.assertEqual(p.rule("files_move").scopes, ("files:write", "files:delete"))


class PresetTests(SynchronousTestCase):
    """The five presets of SPEC §5.4."""

    def test_locked(self) -> None:
        """locked: core and the template's commands only, as on the seed."""
        p = decide(preset="locked")
        self.assertTrue(p.rule("capabilities").enabled)
        self.assertTrue(p.rule("list_commands").enabled)
        self.assertTrue(p.rule("run_command").enabled)
        for endpoint in (
            "download",
            "shell",
            "pty_create_session",
            "system_info",
        ):
            self.assertFalse(p.rule(endpoint).enabled, endpoint)

    def test_transfer_only(self) -> None:
        """transfer-only: uploads and downloads, everything else off but core."""
        p = decide(preset="transfer-only")
        self.assertTrue(p.rule("capabilities").enabled)
        for endpoint in (
            "upload",
            "download",
            "files_upload_stream",
            "files_download_stream",
            "files_read_raw",
            "files_write_raw",
        ):
            self.assertTrue(p.rule(endpoint).enabled, endpoint)
        for endpoint in (
            "files_list",
            "files_stat",
            "files_mkdir",
            "files_delete",
            "files_move",
            "shell",
            "list_commands",
            "system_info",
        ):
            rule = p.rule(endpoint)
            self.assertFalse(rule.enabled, endpoint)

    def test_read_only(self) -> None:
        """
        read-only: writes, processes and terminals off, commands on (as on
        the seed).
        """
        p = decide(preset="read-only")
        for endpoint in (
            "upload",
            "files_delete",
            "shell",
            "env_set",
            "pty_create_session",
        ):
            self.assertFalse(p.rule(endpoint).enabled, endpoint)
        for endpoint in ("run_command", "files_list", "download", "system_info"):
            self.assertTrue(p.rule(endpoint).enabled, endpoint)
        # A write endpoint a policy turns back on writes, as on the seed.
        p = decide(
            {"preset": "read-only", "endpoints": {"files_mkdir": {"enabled": True}}}
        )
        self.assertTrue(decide_path(p.rule("files_mkdir"), "/tmp/new", "write").allowed)

    def test_hardened(self) -> None:
        """
        hardened, as on the seed: process, terminal, dev tools and browser
        off (shell too), env_set off, secrets denied to the file endpoints.
        """
        p = decide(preset="hardened")
        for endpoint in (
            "shell",
            "process_start",
            "pty_create_session",
            "code_run",
            "env_set",
        ):
            self.assertFalse(p.rule(endpoint).enabled, endpoint)
        for endpoint in ("run_command", "files_list", "system_info"):
            self.assertTrue(p.rule(endpoint).enabled, endpoint)
        rule = p.rule("download")
        self.assertEqual(rule.paths.symlinks, "follow")
        self.assertIn("**/.ssh", rule.paths.deny)
        self.assertIsNone(rule.limits.rate_per_minute)
        self.assertEqual(rule.audit, "deny")
        self.assertTrue(p.rule("browser_navigate").params.block_private_networks)

    def test_preset_in_document(self) -> None:
        """A document's preset key works like --preset, and --preset overrides it."""
        self.assertFalse(decide({"preset": "locked"}).rule("files_list").enabled)
        self.assertTrue(
            decide({"preset": "locked"}, preset="default").rule("files_list").enabled
        )


class ValidationTests(SynchronousTestCase):
    """Bad documents stop the daemon, naming the place and the nearest name."""

    def assertInvalid(
        self, policy: Any, *fragments: str, env: dict[str, str] | None = None
    ) -> None:
        with self.assertRaises(PolicyError) as cm:
            decide(policy, env=env)
        for fragment in fragments:
            self.assertIn(fragment, str(cm.exception))

    def test_unknown_endpoint(self) -> None:
        """'shel' suggests 'shell'."""
        self.assertInvalid(
            {"endpoints": {"shel": {}}}, "endpoints.shel", "did you mean 'shell'"
        )

    def test_unknown_top_key(self) -> None:
        """An unknown top-level key is named with a suggestion."""
        self.assertInvalid(
            {"endpoint": {}}, "unknown key 'endpoint'", "did you mean 'endpoints'"
        )

    def test_unknown_rule_keys(self) -> None:
        """Unknown keys inside a rule and its sections are named with their path."""
        self.assertInvalid(
            {"endpoints": {"shell": {"limit": {}}}},
            "endpoints.shell",
            "'limit'",
            "limits",
        )
        self.assertInvalid(
            {"defaults": {"limits": {"max_byte": 1}}}, "defaults.limits", "max_bytes"
        )

    def test_unknown_group_preset_scope(self) -> None:
        """Unknown groups, presets and scopes are refused with suggestions."""
        self.assertInvalid({"groups": {"procss": True}}, "procss", "process")
        self.assertInvalid({"preset": "hardend"}, "hardend", "hardened")
        self.assertInvalid(
            {"endpoints": {"shell": {"scopes": ["process:rnu"]}}},
            "process:rnu",
            "process:run",
        )
        self.assertInvalid({"endpoints": {"group:procss": {}}}, "procss")

    def test_env_groups(self) -> None:
        """ABX_SERVER_ENABLED_GROUPS with an unknown group stops the daemon."""
        self.assertInvalid(
            {},
            "ABX_SERVER_ENABLED_GROUPS",
            "browser",
            env={"ABX_SERVER_ENABLED_GROUPS": "browsr"},
        )

    def test_core_cannot_be_disabled(self) -> None:
        """A policy that disables a core endpoint is invalid; so is disable_group(core)."""
        self.assertInvalid({"endpoints": {"health": {"enabled": False}}}, "core")
        self.assertInvalid({"groups": {"core": False}}, "core")
        # A pattern switching everything off leaves core on (the seed's "*").
        self.assertTrue(
            decide({"endpoints": {"*": {"enabled": False}}}).rule("health").enabled
        )
        with self.assertRaises(ValueError):
            builtin_table().disable_group(CapabilityGroup.CORE)

    def test_bad_values(self) -> None:
        """Wrong types and sizes are refused with the key's path."""
        self.assertInvalid(
            {"endpoints": {"upload": {"limits": {"max_bytes": "5 parsecs"}}}},
            "endpoints.upload.limits.max_bytes",
        )
        self.assertInvalid(
            {"endpoints": {"shell": {"enabled": "yes"}}}, "endpoints.shell.enabled"
        )
        self.assertInvalid({"defaults": {"audit": "some"}}, "defaults.audit")
        self.assertInvalid({"defaults": {"paths": {"symlinks": "maybe"}}}, "symlinks")

    def test_tokens(self) -> None:
        """Token entries need one secret source, a unique id and known scopes."""
        self.assertInvalid(
            {"auth": {"tokens": [{"id": "a", "scopes": ["*"]}]}}, "exactly one"
        )
        self.assertInvalid(
            {"auth": {"tokens": [{"id": "a", "token_sha256": "xyz", "scopes": []}]}},
            "64 hex",
        )
        self.assertInvalid(
            {"auth": {"tokens": [{"id": "legacy", "token_env": "X", "scopes": []}]}},
            "taken",
        )
        self.assertInvalid(
            {
                "auth": {
                    "tokens": [{"id": "a", "token_env": "X", "scopes": ["files:reed"]}]
                }
            },
            "files:read",
        )

    def test_misspelt_scope_in_every_builtin_namespace(self) -> None:
        """
        A misspelt scope is refused, with the scope meant, in every
        namespace the built-in endpoints use, not only the first ones
        (``git:wirte``, ``preview:mange``, ``lsp:raed``, ``links:mnt``,
        ``code:rn``): a token given one would silently lack the scope.
        """
        for typo, meant in (
            ("git:wirte", "git:write"),
            ("preview:mange", "preview:manage"),
            ("lsp:raed", "lsp:read"),
            ("links:mnt", "links:mint"),
            ("code:rn", "code:run"),
        ):
            policy = {
                "auth": {"tokens": [{"id": "a", "token_env": "X", "scopes": [typo]}]}
            }
            with self.assertRaises(PolicyError, msg=typo) as cm:
                decide(policy, env={"X": "x"})
            self.assertIn(repr(typo), str(cm.exception))
            if meant != "lsp:read":
                self.assertIn(f"did you mean {meant!r}", str(cm.exception))

    def test_every_builtin_namespace_is_closed(self) -> None:
        """Each namespace of the built-in table's scopes is checked as built in."""
        from sandboxd.policy.document import BUILTIN_NAMESPACES

        used = {s.partition(":")[0] for e in builtin_table() for s in e.scopes}
        self.assertEqual(sorted(used - set(BUILTIN_NAMESPACES)), [])

    def test_glob_matching_nothing_warns(self) -> None:
        """A pattern that selects no endpoint is a warning, not an error."""
        p = decide({"endpoints": {"nothing_*": {"enabled": False}}})
        self.assertTrue(any("nothing_*" in w for w in p.warnings))

    def test_yaml_server_block(self) -> None:
        """A template.yaml's server: block is a policy."""
        from sandboxd.policy.document import parse_text

        data = parse_text("server:\n  groups:\n    dev_tools: true\n", "template.yaml")
        self.assertEqual(data, {"groups": {"dev_tools": True}})


class SourceOrderTests(SynchronousTestCase):
    """SPEC §5.1: the first policy source found wins."""

    def test_explicit_beats_environment(self) -> None:
        """An explicit policy wins over ABX_SERVER_POLICY."""
        table = builtin_table()
        p = load_policy(
            table,
            explicit={"revision": "a"},
            base_dir="/tmp",
            environ={"ABX_SERVER_POLICY": '{"revision": "b"}'},
        )
        self.assertEqual(p.revision, "a")

    def test_inline_environment_beats_file(self) -> None:
        """ABX_SERVER_POLICY wins over ABX_SERVER_POLICY_FILE."""
        path = self.mktemp()
        with open(path, "w") as f:
            f.write('{"revision": "file"}')
        p = load_policy(
            builtin_table(),
            base_dir="/tmp",
            environ={
                "ABX_SERVER_POLICY": '{"revision": "inline"}',
                "ABX_SERVER_POLICY_FILE": path,
            },
        )
        self.assertEqual(p.revision, "inline")
        p = load_policy(
            builtin_table(), base_dir="/tmp", environ={"ABX_SERVER_POLICY_FILE": path}
        )
        self.assertEqual(p.revision, "file")

    def test_base_dir_refuses_root(self) -> None:
        """/ and /proc cannot be the boundary."""
        for bad in ("/", "/proc"):
            with self.assertRaises(PolicyError):
                load_policy(builtin_table(), explicit={}, base_dir=bad, environ={})


class SystemRootTests(SynchronousTestCase):
    """The system roots are told apart from their look-alikes."""

    def test_same_answer_as_under(self) -> None:
        """``in_system_root`` answers what ``under`` answers for each root, on the roots, below them, beside them and above them."""
        for path in (
            "/proc",
            "/proc/1/environ",
            "/proc/",
            "/procs",
            "/proc.d/x",
            "/sys/kernel",
            "/system",
            "/dev",
            "/dev/null",
            "/devices",
            "/",
            "/home/proc",
            "/tmp/dev/x",
        ):
            expected = any(under(path, root) for root in FORBIDDEN_ROOTS)
            self.assertEqual(in_system_root(path), expected, path)


class DaemonFilesTests(SynchronousTestCase):
    """The daemon's own files are named in every rule, by their real paths."""

    def test_policy_token_and_extra_files(self) -> None:
        """The policy file, each token file, ABX_SERVER_TOKEN_FILE and the caller's extras, links resolved."""
        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        real = os.path.join(base, "real.tok")
        with open(real, "w") as f:
            f.write("t1\n")
        link = os.path.join(base, "link.tok")
        os.symlink(real, link)
        legacy = os.path.join(base, "legacy.tok")
        with open(legacy, "w") as f:
            f.write("t2\n")
        policy_file = os.path.join(base, "policy.json")
        with open(policy_file, "w") as f:
            json.dump(
                {
                    "auth": {
                        "tokens": [{"id": "a", "token_file": link, "scopes": ["*"]}]
                    }
                },
                f,
            )
        p = load_policy(
            builtin_table(),
            path=policy_file,
            base_dir=base,
            environ={"ABX_SERVER_TOKEN_FILE": legacy},
            daemon_files=[os.path.join(base, "audit.log")],
        )
        rule = p.rule("download")
        self.assertEqual(
            set(rule.daemon_files),
            {real, legacy, policy_file, os.path.join(base, "audit.log")},
        )
        for path in (real, "legacy.tok", "policy.json", "audit.log.3"):
            decision = decide_path(rule, path)
            self.assertEqual(
                (decision.allowed, decision.code, decision.rule),
                (False, "path_denied", "guard:daemon-files"),
                path,
            )
        self.assertTrue(decide_path(rule, "audit.logger").allowed)

    def test_state_dir_and_everything_in_it(self) -> None:
        """
        The state dir (a directory among the daemon's files) is refused
        with everything below it; a sibling that only shares its prefix is not.
        """
        base = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(base, "state", "openai"))
        p = load_policy(
            builtin_table(),
            explicit={},
            base_dir=base,
            environ={},
            daemon_files=[os.path.join(base, "state")],
        )
        rule = p.rule("download")
        for path in ("state", "state/openai/webhooks.json"):
            decision = decide_path(rule, path)
            self.assertEqual(
                (decision.allowed, decision.code, decision.rule),
                (False, "path_denied", "guard:daemon-files"),
                path,
            )
        self.assertTrue(decide_path(rule, "stateful/notes.txt").allowed)


class RawWriteInheritanceTests(SynchronousTestCase):
    """
    Resumable uploads (what a client switches to for big files) follow
    what the policy says about files_write_raw by name, unless the policy
    names them too.
    """

    def test_paths_limits_and_switch_inherited(self) -> None:
        """A raw-write path rule, max_bytes and enabled reach the upload routes."""
        p = decide(
            {
                "endpoints": {
                    "files_write_raw": {
                        "paths": {"deny": ["secret/**"]},
                        "limits": {"max_bytes": 4096, "rate_per_minute": 5},
                        "params": {"deny_extensions": [".sh"]},
                    }
                }
            }
        )
        for name in ("files_uploads_create", "files_uploads_append"):
            rule = p.rule(name)
            self.assertEqual(rule.paths.deny, ("secret/**",), name)
            self.assertEqual(rule.limits.max_bytes, 4096, name)
            self.assertEqual(rule.params.deny_extensions, (".sh",), name)
            self.assertEqual(
                rule.source("paths.deny"), "policy:endpoints.files_write_raw"
            )
            # Its rate is its own: one upload is many appends.
            self.assertNotEqual(rule.limits.rate_per_minute, 5)
        off = decide({"endpoints": {"files_write_raw": {"enabled": False}}})
        self.assertFalse(off.rule("files_uploads_create").enabled)
        self.assertTrue(off.rule("files_uploads_get").enabled)

    def test_own_rule_wins(self) -> None:
        """What the policy sets on an upload route by name is kept."""
        p = decide(
            {
                "endpoints": {
                    "files_write_raw": {"limits": {"max_bytes": 4096}},
                    "files_uploads_create": {"limits": {"max_bytes": 8192}},
                }
            }
        )
        self.assertEqual(p.rule("files_uploads_create").limits.max_bytes, 8192)
        self.assertEqual(p.rule("files_uploads_append").limits.max_bytes, 4096)


class KeptDecisionTests(SynchronousTestCase):
    """A rule keeps the path decisions made under it, and only its own."""

    def test_same_answers_bounded(self) -> None:
        """
        Asked again, a path gets the answer it got the first time (the
        same for each operation); a rule of another policy decides for
        itself; what a rule keeps stays within its bound.
        """
        open_rule = decide().rule("files_mkdir")
        closed = decide(
            {"endpoints": {"files_mkdir": {"paths": {"deny": ["secret"]}}}}
        ).rule("files_mkdir")
        for _ in range(2):
            self.assertTrue(decide_path(open_rule, "secret/a").allowed)
            self.assertFalse(decide_path(closed, "secret/a").allowed)
            self.assertTrue(decide_path(open_rule, "/tmp/x", "write").allowed)
            self.assertFalse(decide_path(open_rule, "/tmp", "delete").allowed)
        self.assertFalse(decide_path(open_rule, "/etc/passwd").allowed)
        for n in range(PATH_DECISIONS_KEPT + 10):
            decide_path(open_rule, f"/tmp/{n}")
        self.assertLessEqual(len(open_rule.decisions), PATH_DECISIONS_KEPT)
        self.assertFalse(decide_path(closed, "secret/a").allowed)


def load_text(case: SynchronousTestCase, text: str, suffix: str = ".json") -> Any:
    """The compiled policy of a policy file holding ``text``."""
    path = case.mktemp() + suffix
    with open(path, "w") as f:
        f.write(text)
    return load_policy(builtin_table(), path=path, base_dir="/tmp", environ={})


class NonFiniteNumberTests(SynchronousTestCase):
    """
    A number of the policy is a finite number: NaN and infinity (which
    Python's JSON and YAML readers accept) would reach timers and
    discovery, which cannot use them.
    """

    def assertRefused(self, text: str, place: str, suffix: str = ".json") -> None:
        with self.assertRaises(PolicyError) as cm:
            load_text(self, text, suffix)
        message = str(cm.exception)
        self.assertIn(f"{suffix}: {place}: expected a finite number", message)

    def test_json_constants_and_overflow(self) -> None:
        """NaN, Infinity, -Infinity and 1e400 in JSON are refused at their place."""
        for number in ("NaN", "Infinity", "1e400"):
            self.assertRefused(
                '{"endpoints": {"shell": {"limits": {"timeout_seconds": N}}}}'.replace(
                    "N", number
                ),
                "endpoints.shell.limits.timeout_seconds",
            )
            self.assertRefused(
                '{"defaults": {"limits": {"max_duration_seconds": N}}}'.replace(
                    "N", number
                ),
                "defaults.limits.max_duration_seconds",
            )
        with self.assertRaises(PolicyError) as cm:
            load_text(self, '{"defaults": {"limits": {"timeout_seconds": -Infinity}}}')
        self.assertIn("defaults.limits.timeout_seconds", str(cm.exception))

    def test_yaml_constants(self) -> None:
        """YAML's .nan and .inf are refused the same way."""
        for number in (".nan", ".inf"):
            self.assertRefused(
                "server:\n  endpoints:\n    shell:\n      limits:\n"
                f"        idle_timeout_seconds: {number}\n",
                "endpoints.shell.limits.idle_timeout_seconds",
                ".yaml",
            )

    def test_integer_too_large(self) -> None:
        """An integer too large to be a float is refused, not an OverflowError."""
        with self.assertRaises(PolicyError) as cm:
            decide({"endpoints": {"shell": {"limits": {"timeout_seconds": 10**400}}}})
        self.assertIn("endpoints.shell.limits.timeout_seconds", str(cm.exception))

    def test_size_too_large(self) -> None:
        """A size with more digits than a float holds is refused, not an OverflowError."""
        with self.assertRaises(PolicyError) as cm:
            decide({"defaults": {"limits": {"max_bytes": "9" * 400 + "MB"}}})
        self.assertIn("defaults.limits.max_bytes", str(cm.exception))

    def test_revision(self) -> None:
        """A NaN revision is not a label."""
        with self.assertRaises(PolicyError) as cm:
            load_text(self, '{"revision": NaN}')
        self.assertIn("revision: expected a string", str(cm.exception))

    def test_finite_numbers_kept(self) -> None:
        """Finite numbers (large ones too) still load."""
        p = decide({"endpoints": {"shell": {"limits": {"timeout_seconds": 1e12}}}})
        self.assertEqual(p.rule("shell").limits.timeout_seconds, 1e12)


class SameTokenTests(SynchronousTestCase):
    """One secret, one identity: which one must not depend on the list's order."""

    def test_same_source(self) -> None:
        """Two entries with one hash, variable or file are refused, naming both ids."""
        digest = "ab" * 32
        for key, a, b in (
            ("token_sha256", digest, digest.upper()),
            ("token_env", "T", "T"),
            ("token_file", "/run/t", "/run/t"),
        ):
            policy = {
                "auth": {
                    "tokens": [
                        {"id": "a", key: a, "scopes": ["files:read"]},
                        {"id": "b", key: b, "scopes": ["*"]},
                    ]
                }
            }
            with self.assertRaises(PolicyError) as cm:
                decide(policy, env={"T": "x"})
            self.assertIn(f"auth.tokens[1].{key}:", str(cm.exception))
            self.assertIn("'a' and 'b' are the same secret", str(cm.exception))

    def test_same_value(self) -> None:
        """Two variables (or a variable and a hash) holding one secret are refused."""
        import hashlib

        policy = {
            "auth": {
                "tokens": [
                    {"id": "a", "token_env": "A", "scopes": ["files:read"]},
                    {"id": "b", "token_env": "B", "scopes": ["*"]},
                    {
                        "id": "c",
                        "token_sha256": hashlib.sha256(b"s").hexdigest(),
                        "scopes": ["*"],
                    },
                ]
            }
        }
        with self.assertRaises(PolicyError) as cm:
            decide(policy, env={"A": "same", "B": "same"})
        self.assertIn("'a' and 'b' are the same secret", str(cm.exception))
        with self.assertRaises(PolicyError) as cm:
            decide(policy, env={"A": "s", "B": "other"})
        self.assertIn("'a' and 'c' are the same secret", str(cm.exception))
        self.assertEqual(
            len(decide(policy, env={"A": "one", "B": "two"}).tokens.entries), 3
        )


class NearMissTests(SynchronousTestCase):
    """Valid documents that probably do not say what was meant earn a warning."""

    def test_namespace_one_letter_off(self) -> None:
        """file:read and proces:run suggest files:read and process:run."""
        p = decide(
            {
                "endpoints": {
                    "files_list": {"scopes": ["file:read"]},
                    "shell": {"scopes": ["proces:run"]},
                },
                "auth": {
                    "tokens": [{"id": "a", "token_env": "A", "scopes": ["fiels:*"]}]
                },
            },
            env={"A": "a"},
        )
        self.assertIn(
            "endpoints.files_list.scopes: the scope 'file:read' is not built in "
            "(its namespace 'file' is none of sandboxd's); did you mean 'files:read'?",
            p.warnings,
        )
        self.assertTrue(
            any("'proces:run'" in w and "'process:run'" in w for w in p.warnings)
        )
        self.assertTrue(
            any(
                w.startswith("auth.tokens[0].scopes: the scope 'fiels:*'")
                for w in p.warnings
            )
        )

    def test_builtin_namespace_wildcards_quiet(self) -> None:
        """
        ``code:*`` (and the other built-in namespaces' wildcards) is a
        built-in scope: no warning that it is not, nor advice to change it
        to ``core:*``, which would take code access away.
        """
        p = decide(
            {
                "auth": {
                    "tokens": [
                        {
                            "id": "a",
                            "token_env": "A",
                            "scopes": ["code:*", "git:*", "lsp:*", "links:*"],
                        }
                    ]
                }
            },
            env={"A": "a"},
        )
        self.assertFalse([w for w in p.warnings if "not built in" in w], p.warnings)

    def test_own_namespaces_quiet(self) -> None:
        """A template's own namespaces are not near misses."""
        p = decide(
            {
                "endpoints": {
                    "shell": {"scopes": ["myapp:deploy", "myfiles:read", "ops"]}
                }
            }
        )
        self.assertFalse([w for w in p.warnings if "not built in" in w], p.warnings)

    def test_repeated_json_keys(self) -> None:
        """A key written twice in one JSON object is named with its place."""
        p = load_text(
            self,
            '{"endpoints": {"shell": {"enabled": false}, "shell": {"enabled": true},'
            ' "files_list": {"limits": {"max_entries": 1, "max_entries": 2}}},'
            ' "revision": "a", "revision": "b"}',
        )
        self.assertEqual(
            [w for w in p.warnings if "more than once" in w],
            [
                "policy: the key 'revision' is written more than once; only the last counts",
                "endpoints: the key 'shell' is written more than once; only the last counts",
                "endpoints.files_list.limits: the key 'max_entries' is written more "
                "than once; only the last counts",
            ],
        )

    def test_repeated_yaml_keys(self) -> None:
        """A YAML policy's repeated keys are named as JSON's are (were kept silently)."""
        p = load_text(
            self,
            "endpoints:\n"
            "  shell: {enabled: false}\n"
            "  shell: {enabled: true}\n"
            "revision: a\n",
            suffix=".yaml",
        )
        self.assertEqual(
            [w for w in p.warnings if "more than once" in w],
            [
                "endpoints: the key 'shell' is written more than once; only the last counts"
            ],
        )
        self.assertTrue(p.rule("shell").enabled)


class EmptyFileTests(SynchronousTestCase):
    """
    A policy file that holds no document (empty, only a YAML comment, JSON
    ``null``) is refused, naming the file: it is a broken deployment (a
    failed render, a rewrite caught half-way), and running with every
    default and no token on it would drop every rule the operator wrote.
    """

    def test_refused(self) -> None:
        for text, suffix in (
            ("", ".yaml"),
            ("# the policy comes later\n", ".yml"),
            ("null", ".json"),
            ("~\n", ".yaml"),
        ):
            with self.assertRaises(PolicyError) as cm:
                load_text(self, text, suffix)
            self.assertIn("holds no policy", str(cm.exception))
            self.assertIn(suffix, str(cm.exception))

    def test_inline_null_refused(self) -> None:
        """The same for ``ABX_SERVER_POLICY=null``."""
        with self.assertRaises(PolicyError) as cm:
            load_policy(
                builtin_table(), base_dir="/tmp", environ={"ABX_SERVER_POLICY": "null"}
            )
        self.assertIn("ABX_SERVER_POLICY", str(cm.exception))

    def test_an_empty_object_is_a_policy(self) -> None:
        """``{}`` is still the policy with every default."""
        self.assertTrue(load_text(self, "{}").rule("shell").enabled)


class LocatedErrorTests(SynchronousTestCase):
    """An error names the policy source it came from, then the place in it."""

    def test_file_and_variables(self) -> None:
        """A policy file, ABX_SERVER_POLICY and ABX_SERVER_POLICY_FILE are named."""
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            f.write('{"endpoints": {"shell": {"limts": {}}}}')
        with self.assertRaises(PolicyError) as cm:
            load_policy(builtin_table(), path=path, base_dir="/tmp", environ={})
        self.assertTrue(
            str(cm.exception).startswith(f"{path}: endpoints.shell: unknown rule key"),
            cm.exception,
        )
        with self.assertRaises(PolicyError) as cm:
            load_policy(
                builtin_table(),
                base_dir="/tmp",
                environ={"ABX_SERVER_POLICY_FILE": path},
            )
        self.assertTrue(
            str(cm.exception).startswith(
                f"{path} (ABX_SERVER_POLICY_FILE): endpoints.shell:"
            ),
            cm.exception,
        )
        with self.assertRaises(PolicyError) as cm:
            load_policy(
                builtin_table(),
                base_dir="/tmp",
                environ={"ABX_SERVER_POLICY": '{"endpoints": {"shel": {}}}'},
            )
        self.assertEqual(
            str(cm.exception),
            "ABX_SERVER_POLICY: endpoints.shel: unknown endpoint 'shel'; "
            "did you mean 'shell'?",
        )

    def test_environment_errors_keep_their_name(self) -> None:
        """An error about another variable is not blamed on the policy file."""
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            f.write("{}")
        with self.assertRaises(PolicyError) as cm:
            load_policy(
                builtin_table(),
                path=path,
                base_dir="/tmp",
                environ={"ABX_SERVER_ENABLED_GROUPS": "browsr"},
            )
        self.assertTrue(str(cm.exception).startswith("ABX_SERVER_ENABLED_GROUPS:"))

    def test_unknown_custom_route_hints_commands(self) -> None:
        """An id near no endpoint may be a custom route from a --commands file."""
        with self.assertRaises(PolicyError) as cm:
            decide({"endpoints": {"myapp_crash": {"scopes": ["myapp:ops"]}}})
        self.assertEqual(
            str(cm.exception),
            "endpoints.myapp_crash: unknown endpoint 'myapp_crash'; a custom "
            "route's id is known only when the file that registers it is loaded "
            "(--commands FILE)",
        )


class CredentialFreeRouteTests(SynchronousTestCase):
    """Scopes for a route that asks no credential are applied or reported."""

    def test_builtin_stays_open_and_warns(self) -> None:
        """
        health keeps answering anyone (its scopes shown as the seed shows
        them, never asked for); a policy naming scopes for it is told.
        """
        from sandboxd.access.gate import needs_credential

        p = decide({"endpoints": {"health": {"scopes": ["core:read"]}}})
        self.assertEqual(p.rule("health").scopes, ("core:read",))
        health = builtin_table().get("health")
        self.assertFalse(needs_credential(health, p.rule("health")))
        self.assertIn(
            "policy:endpoints.health.scopes: not applied: 'health' answers every "
            "caller without a credential",
            p.warnings,
        )

    def test_custom_route_claims_no_group_scope(self) -> None:
        """
        A custom route registered with auth_required=False has no scope of
        its own, so check-config and the start warn that anyone may call it.
        """
        table = builtin_table()
        table.register(
            "POST", "/open", lambda r: None, auth_required=False, name="open_route"
        )
        p = load_policy(table, explicit={}, base_dir="/tmp", environ={})
        self.assertEqual(p.rule("open_route").scopes, ())
        self.assertTrue(
            any(
                "'open_route' requires no scope: anyone who can reach the port" in w
                for w in p.warnings
            ),
            p.warnings,
        )
