"""
Policy files written for agent-sandbox-server mean on sandboxd what they
mean there (SPEC §21): command patterns, the legacy token beside policy
tokens, ``@defaults`` inside ``endpoints``, timeout caps and variable globs,
against a real daemon.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd.policy import load_policy
from sandboxd.policy.commandrules import match, split_short_options
from sandboxd.policy.document import PolicyError
from sandboxd.routes import builtin_table
from tests.helpers import DaemonTestCase


class PatternTests(SynchronousTestCase):
    """The seed's command pattern language, word by word."""

    def test_executable_globs(self) -> None:
        """One word is a glob on argv[0] or its basename."""
        self.assertEqual(match("mk*", ["mkdir", "x"]), [])
        self.assertEqual(match("rm", ["/bin/rm", "x"]), [])
        self.assertEqual(match("/usr/bin/*", ["/usr/bin/cat"]), [])
        self.assertIsNone(match("rm", ["rmdir", "x"]))

    def test_whole_argv(self) -> None:
        """Several words match the whole argv; globs never cross a '/' or an option."""
        words = split_short_options(["rm", "-rf", "x"])
        self.assertEqual(words, ["rm", "-r", "-f", "x"])
        self.assertEqual(match("rm ... -f ...", words), [])
        self.assertIsNone(match("rm -f", words))
        self.assertEqual(match("git push ...", ["git", "push", "origin", "main"]), [])
        self.assertIsNone(match("cat *.txt", ["cat", "../a.txt"]))
        self.assertIsNone(match("cat *", ["cat", "-n"]))
        self.assertEqual(match("head -n {int} {path}", ["head", "-n", "5", "f"]), [3])
        self.assertIsNone(match("head -n {int} {path}", ["head", "-n", "x", "f"]))

    def test_bad_patterns_stop_the_start(self) -> None:
        """An unsplittable pattern, or one with four '...', is refused at load."""
        for pattern in ("echo 'open", "a ... b ... c ... d ..."):
            with self.assertRaises(PolicyError) as cm:
                load_policy(
                    builtin_table(),
                    explicit={
                        "endpoints": {"shell": {"params": {"deny_commands": [pattern]}}}
                    },
                    base_dir="/tmp",
                    environ={},
                )
            self.assertIn("deny_commands", str(cm.exception))


class CommandRuleTests(DaemonTestCase):
    """allow_commands and deny_commands as a seed policy writes them."""

    policy = {
        "endpoints": {
            "@defaults": {"params": {"deny_commands": ["mk*", "rm", "ls ... -a ..."]}},
        }
    }

    @inlineCallbacks
    def test_deny_globs_and_patterns(self) -> Any:
        """A glob and an argv pattern refuse on shell, stream and process start alike."""
        for command in ("mkdir x", "/bin/rm x", "ls -la /", "ls -a"):
            for path in ("/shell", "/shell/stream", "/process/start"):
                reply = yield self.request("POST", path, {"command": command})
                self.assertEqual(
                    (reply.status, reply.json()["code"]),
                    (403, "command_not_allowed"),
                    (command, path),
                )
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "x")))
        reply = yield self.request("POST", "/shell", {"command": "ls -l"})
        self.assertEqual(reply.status, 200)


class PathPatternTests(DaemonTestCase):
    """An allow pattern's {path} goes through the path guard."""

    @property
    def policy(self) -> Any:  # type: ignore[override]
        return {
            "endpoints": {
                "shell": {
                    "params": {"allow_commands": ["cat {path}", "echo ..."]},
                    "paths": {"allow": [os.path.join(self.base_dir, "out")]},
                }
            }
        }

    @inlineCallbacks
    def test_path_argument_is_guarded(self) -> Any:
        """Inside the allowed tree it runs (relative to cwd); outside, 403."""
        out = os.path.join(self.base_dir, "out")
        os.makedirs(out)
        with open(os.path.join(out, "a.txt"), "w") as f:
            f.write("alpha")
        reply = yield self.request(
            "POST", "/shell", {"command": "cat a.txt", "cwd": out}
        )
        self.assertEqual((reply.status, reply.json()["stdout"]), (200, "alpha"))
        for command in ("cat /etc/hostname", "cat ../secret"):
            reply = yield self.request(
                "POST", "/shell", {"command": command, "cwd": out}
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "path_not_allowed"), command
            )
        for command in ("cat -n a.txt", "cat a.txt a.txt", "head a.txt"):
            reply = yield self.request(
                "POST", "/shell", {"command": command, "cwd": out}
            )
            self.assertEqual(reply.status, 403, command)
        reply = yield self.request(
            "POST", "/shell", {"command": "echo hi there", "cwd": out}
        )
        self.assertEqual((reply.status, reply.json()["stdout"]), (200, "hi there\n"))


class TimeoutCapTests(DaemonTestCase):
    """A policy's timeout_seconds caps the timeout a request asks for."""

    policy = {"endpoints": {"shell": {"limits": {"timeout_seconds": 1}}}}

    @inlineCallbacks
    def test_request_cannot_raise_the_cap(self) -> Any:
        """sleep 5 with timeout 60 still ends after about a second, as a timeout."""
        started = time.monotonic()
        reply = yield self.request(
            "POST", "/shell", {"command": "sleep 5", "timeout": 60}
        )
        self.assertEqual((reply.status, reply.json()["type"]), (500, "TimeoutError"))
        self.assertLess(time.monotonic() - started, 4)


LEGACY = "legacy-secret"


class LegacyBesidePolicyTokensTests(DaemonTestCase):
    """With auth.tokens, ABX_SERVER_TOKEN is not an identity holding '*'."""

    token = LEGACY
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "reader",
                    "token_env": "ABX_SERVER_TOKEN",
                    "scopes": ["files:read"],
                },
            ]
        },
        "defaults": {"params": {"default_user": "root"}},
    }

    @inlineCallbacks
    def test_named_legacy_token_is_narrowed(self) -> Any:
        """The token named by a policy entry holds that entry's scopes only."""
        reply = yield self.request("GET", "/capabilities")
        self.assertEqual(
            reply.json()["identity"], {"id": "reader", "scopes": ["files:read"]}
        )
        reply = yield self.request("POST", "/shell", {"command": "true"})
        self.assertEqual((reply.status, reply.json()["code"]), (403, "missing_scope"))


class LegacyNotNamedTests(DaemonTestCase):
    """A legacy token the policy's tokens do not name logs nobody in."""

    token = LEGACY
    policy = {
        "auth": {
            "tokens": [
                {
                    "id": "admin",
                    "token_sha256": hashlib.sha256(b"admin-token").hexdigest(),
                    "scopes": ["*"],
                },
            ]
        },
        "defaults": {"params": {"default_user": "root"}},
    }

    @inlineCallbacks
    def test_legacy_token_is_refused(self) -> Any:
        """401 for the legacy token; the policy's own token still works."""
        reply = yield self.request("GET", "/system/info")
        self.assertEqual(reply.status, 401)
        reply = yield self.request("GET", "/system/info", token="admin-token")
        self.assertEqual(reply.status, 200)


class VariableGlobTests(DaemonTestCase):
    """allow_vars and deny_vars take globs, as the seed's do."""

    policy = {
        "endpoints": {
            "env_set": {
                "params": {"allow_vars": ["APP_*"], "deny_vars": ["APP_SECRET*"]}
            }
        }
    }

    def tearDown(self) -> None:
        os.environ.pop("APP_A", None)

    @inlineCallbacks
    def test_globs(self) -> Any:
        """APP_A is allowed; OTHER and APP_SECRET_KEY are refused and left unset."""
        reply = yield self.request("POST", "/env", {"vars": {"APP_A": "1"}})
        self.assertEqual(reply.status, 200)
        for name in ("OTHER", "APP_SECRET_KEY"):
            reply = yield self.request("POST", "/env", {"vars": {name: "1"}})
            self.assertEqual(reply.status, 403, name)
            self.assertNotIn(name, os.environ)


class EmptyAllowListTests(DaemonTestCase):
    """
    An allow list written empty is no list, as on the seed: a seed policy
    with ``allow_commands: []`` runs commands there and here alike.
    """

    policy = {
        "endpoints": {
            "shell": {"params": {"allow_commands": []}},
            "env_get": {"params": {"allow_vars": []}},
            "env_set": {"params": {"allow_vars": ["APP_*"]}},
            "group:system": {"params": {"allow_vars": ["APP_*"]}},
        }
    }

    @inlineCallbacks
    def test_commands_and_variables_run_and_show(self) -> Any:
        """
        The shell runs ``echo``; GET /env shows HOME (the endpoint's ``[]``
        wins over the group's list).
        """
        reply = yield self.request("POST", "/shell", {"command": "echo hi"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], "hi\n")
        reply = yield self.request("GET", "/env?filter=HOME")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["variables"], {"HOME": os.environ["HOME"]})

    def test_check_config_warns(self) -> None:
        """The policy loads with a warning naming each empty list."""
        compiled = load_policy(builtin_table(), explicit=self.policy, base_dir="/tmp")
        found = [w for w in compiled.warnings if "is empty, which means no list" in w]
        self.assertEqual(
            [w.split(" ")[0] for w in found],
            [
                "endpoints.shell.params.allow_commands",
                "endpoints.env_get.params.allow_vars",
            ],
        )


READER = "reader-token-123456"
WRITER = "writer-token-654321"
ADMIN = "admin-token-abcdef"


def tokens(**extra: Any) -> dict[str, Any]:
    """Three identities by hash, and whatever else the policy says."""
    return {
        "auth": {
            "tokens": [
                {
                    "id": name,
                    "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                    "scopes": scopes,
                }
                for name, token, scopes in (
                    ("reader", READER, ["files:read"]),
                    ("writer", WRITER, ["files:write"]),
                    ("admin", ADMIN, ["*"]),
                )
            ]
        },
        "defaults": {"params": {"default_user": "root"}},
        **extra,
    }


class DiscoveryTests(DaemonTestCase):
    """/capabilities as the seed's SDK reads it."""

    policy = tokens(
        endpoints={"files_stat": {"paths": {"allow": ["/srv/secret-place"]}}}
    )

    @inlineCallbacks
    def test_configuration_only_for_callers_that_may_call(self) -> Any:
        """limits, paths and params of an endpoint are shown only when it is allowed."""
        reply = yield self.request("GET", "/capabilities", token=WRITER)
        entry = reply.json()["endpoints"]["files_stat"]
        self.assertFalse(entry["allowed"])
        for key in ("limits", "paths", "params"):
            self.assertNotIn(key, entry)
        reply = yield self.request("GET", "/capabilities", token=READER)
        entry = reply.json()["endpoints"]["files_stat"]
        self.assertEqual(entry["paths"]["allow"], ["/srv/secret-place"])

    @inlineCallbacks
    def test_policy_block_and_warnings(self) -> Any:
        """preset, a revision hash, configured; a '*' identity is warned."""
        reply = yield self.request("GET", "/capabilities", token=ADMIN)
        body = reply.json()
        self.assertEqual(body["policy"]["preset"], "default")
        self.assertTrue(body["policy"]["configured"])
        self.assertRegex(body["policy"]["revision"], "^[0-9a-f]{16}$")
        self.assertIn("identity holds the wildcard scope '*'", body["warnings"])
        reply = yield self.request("GET", "/capabilities", token=READER)
        self.assertNotIn(
            "identity holds the wildcard scope '*'", reply.json()["warnings"]
        )
        yield self.daemon.stop()
        yield self.start(policy=tokens(preset="read-only"))
        reply = yield self.request("GET", "/capabilities", token=ADMIN)
        self.assertNotEqual(
            reply.json()["policy"]["revision"], body["policy"]["revision"]
        )


class UnconfiguredDiscoveryTests(DaemonTestCase):
    """Without a policy, discovery says so."""

    @inlineCallbacks
    def test_not_configured(self) -> Any:
        """configured is false, the preset is 'default', no warning about '*'."""
        reply = yield self.request("GET", "/capabilities")
        body = reply.json()
        self.assertEqual(
            (body["policy"]["configured"], body["policy"]["preset"]), (False, "default")
        )
        self.assertNotIn("identity holds the wildcard scope '*'", body["warnings"])


class SeedCodeTests(DaemonTestCase):
    """Refusals by the command, language and extension lists carry the seed's codes."""

    @property
    def policy(self) -> Any:  # type: ignore[override]
        return {
            "groups": {"dev_tools": True},
            "endpoints": {
                "shell": {"params": {"allow_commands": ["echo", "ls"]}},
                "code_run": {"params": {"languages": ["python"]}},
                "files_upload_stream": {
                    "params": {"overwrite": False, "deny_extensions": [".sh", ".SO"]}
                },
            },
        }

    @inlineCallbacks
    def test_codes(self) -> Any:
        """command_not_allowed, language_not_allowed, extension_not_allowed (any case)."""
        reply = yield self.request("POST", "/shell", {"command": "cat /etc/hostname"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "command_not_allowed")
        )
        reply = yield self.request(
            "POST", "/code/run", {"language": "bash", "code": "echo 1"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "language_not_allowed")
        )
        for name in ("x.sh", "x.SH", "y.so", "y.SO"):
            reply = yield self.request(
                "POST",
                "/files/upload-stream",
                {"path": name, "content_base64": "IyE="},
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]),
                (403, "extension_not_allowed"),
                name,
            )
            self.assertFalse(os.path.exists(os.path.join(self.base_dir, name)))
        reply = yield self.request(
            "POST",
            "/capabilities/check",
            {"endpoint": "shell", "params": {"command": "cat x"}},
        )
        self.assertEqual(reply.json()["code"], "command_not_allowed")

    @inlineCallbacks
    def test_policy_overwrite_is_409(self) -> Any:
        """params.overwrite false over an existing file: 409 file_exists naming the rule."""
        body = {"path": "dup.txt", "content_base64": "b25l"}
        reply = yield self.request("POST", "/files/upload-stream", body)
        self.assertEqual(reply.status, 200)
        reply = yield self.request(
            "POST", "/files/upload-stream", {**body, "content_base64": "dHdv"}
        )
        self.assertEqual(
            (reply.status, reply.json()["code"], reply.json()["rule"]),
            (409, "file_exists", "policy:endpoints.files_upload_stream"),
        )
        with open(os.path.join(self.base_dir, "dup.txt"), "rb") as f:
            self.assertEqual(f.read(), b"one")


class SecretVariableTests(DaemonTestCase):
    """A child's env may not name a variable that holds a token."""

    environ = {"MY_SERVER_TOKEN": "scrub-test-token-123"}
    policy = {
        "auth": {
            "tokens": [{"id": "a", "token_env": "MY_SERVER_TOKEN", "scopes": ["*"]}]
        },
        "defaults": {"params": {"default_user": "root"}},
    }
    token = "scrub-test-token-123"

    @inlineCallbacks
    def test_refused_not_dropped(self) -> Any:
        """403 protected_variable, and the command does not run."""
        marker = os.path.join(self.base_dir, "ran")
        for path in ("/shell", "/process/start"):
            reply = yield self.request(
                "POST",
                path,
                {"command": f"touch {marker}", "env": {"MY_SERVER_TOKEN": "x"}},
            )
            self.assertEqual(
                (reply.status, reply.json()["code"]), (403, "protected_variable"), path
            )
        self.assertFalse(os.path.exists(marker))
        reply = yield self.request(
            "POST", "/shell", {"command": "true", "env": {"OTHER": "x"}}
        )
        self.assertEqual(reply.status, 200)


class DisabledMessageTests(DaemonTestCase):
    """A 404 endpoint_disabled says which rule, and how to turn an opt-in group on."""

    policy = {"endpoints": {"shell": {"enabled": False}}}

    @inlineCallbacks
    def test_messages(self) -> Any:
        """The policy's rule is named; an opt-in group's answer says how to enable it."""
        reply = yield self.request("POST", "/shell", {"command": "true"})
        body = reply.json()
        self.assertEqual((reply.status, body["rule"]), (404, "policy:endpoints.shell"))
        self.assertIn("policy:endpoints.shell", body["error"])
        reply = yield self.request("POST", "/code/run", {"code": "print(1)"})
        body = reply.json()
        self.assertEqual(body["rule"], "default:opt-in:dev_tools")
        self.assertIn("ABX_SERVER_ENABLED_GROUPS=dev_tools", body["error"])


class MissingAllowedRootTests(DaemonTestCase):
    """An upload below an allowed directory that does not exist yet makes it."""

    @property
    def policy(self) -> Any:  # type: ignore[override]
        return {
            "preset": "transfer-only",
            "endpoints": {
                "files_upload_stream": {
                    "paths": {
                        "allow": [
                            os.path.join(self.base_dir, "uploads"),
                            os.path.join(self.base_dir, "frozen", "in"),
                        ],
                        "read_only": [os.path.join(self.base_dir, "frozen")],
                    }
                },
            },
        }

    @inlineCallbacks
    def test_made_as_a_parent(self) -> Any:
        """
        uploads/ is made and the file written; outside the allowed list, or
        below a read-only directory, nothing is made.
        """
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "uploads/deep/n.txt", "content_base64": "aGVsbG8="},
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "uploads", "deep", "n.txt"), "rb") as f:
            self.assertEqual(f.read(), b"hello")
        for path, code in (
            (os.path.join(self.base_dir, "out", "n.txt"), "path_not_allowed"),
            ("frozen/in/n.txt", "read_only"),
        ):
            reply = yield self.request(
                "POST", "/files/upload-stream", {"path": path, "content_base64": ""}
            )
            self.assertEqual((reply.status, reply.json()["code"]), (403, code), path)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "out")))
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "frozen")))
        reply = yield self.request(
            "GET", "/files/download-stream?path=uploads/none.txt"
        )
        self.assertEqual(reply.status, 404)


class RelativeToAllowedDirectoryTests(DaemonTestCase):
    """
    A relative path that the allow list leaves out when taken from the base
    dir is taken from the first allowed directory, as agent-sandbox-server
    takes it; one allowed from the base dir keeps that meaning.
    """

    def setUp(self) -> Any:
        self.autostart = False
        super().setUp()
        self.out = os.path.join(self.base_dir, "out")
        os.makedirs(os.path.join(self.out, "sub"))
        os.makedirs(os.path.join(self.base_dir, "secret"))
        for path, text in (
            ("out/a.txt", "in out"),
            ("a.txt", "in base"),
            ("secret/s.txt", "s"),
        ):
            with open(os.path.join(self.base_dir, path), "w") as f:
                f.write(text)

    def allow(self, *roots: str) -> Any:
        self.policy = {"endpoints": {"files_*": {"paths": {"allow": list(roots)}}}}
        return self.start()

    @inlineCallbacks
    def read(self, path: str) -> Any:
        reply = yield self.request("GET", f"/files/raw?path={path}")
        return reply

    @inlineCallbacks
    def test_first_allowed_directory(self) -> Any:
        """Reads, writes and listings take ``a.txt`` from out/; ``..`` out of it is refused."""
        yield self.allow(self.out, os.path.join(self.base_dir, "elsewhere"))
        reply = yield self.read("a.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.body, b"in out")
        reply = yield self.request(
            "POST",
            "/files/upload-stream",
            {"path": "sub/new.txt", "content_base64": "dw=="},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["path"], os.path.join(self.out, "sub", "new.txt"))
        with open(os.path.join(self.out, "sub", "new.txt")) as f:
            self.assertEqual(f.read(), "w")
        reply = yield self.request("GET", "/files/list?path=sub")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual([e["name"] for e in reply.json()["entries"]], ["new.txt"])
        reply = yield self.read("../secret/s.txt")
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "path_not_allowed")
        )
        reply = yield self.read("out/a.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.body, b"in out")

    @inlineCallbacks
    def test_no_path(self) -> Any:
        """A listing or a search that names no directory works in out/."""
        yield self.allow(self.out)
        reply = yield self.request("GET", "/files/list")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            sorted(e["name"] for e in reply.json()["entries"]), ["a.txt", "sub"]
        )
        reply = yield self.request("POST", "/files/search", {"pattern": "*.txt"})
        self.assertEqual(reply.status, 200, reply.body)
        found = [m["path"] for m in reply.json()["results"]]
        self.assertEqual(found, [os.path.join(self.out, "a.txt")])

    @inlineCallbacks
    def test_base_dir_allowed(self) -> Any:
        """An allow list that holds the base dir leaves relative paths on the base dir."""
        yield self.allow(self.out, self.base_dir)
        reply = yield self.read("a.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.body, b"in base")


class CommandUnderAllowListTests(DaemonTestCase):
    """
    A command's paths under an allow list that leaves the base dir out: a
    relative ``cwd`` is taken from the first allowed directory, and a
    command that names none runs as it does on agent-sandbox-server.
    """

    def setUp(self) -> Any:
        self.autostart = False
        super().setUp()
        self.work = os.path.join(self.base_dir, "work")
        os.makedirs(os.path.join(self.work, "sub"))
        self.policy = {"endpoints": {"shell": {"paths": {"allow": [self.work]}}}}
        return self.start()

    @inlineCallbacks
    def test_cwd(self) -> Any:
        """``sub`` is below work/; no ``cwd`` is work/; ``/`` is refused."""
        reply = yield self.request("POST", "/shell", {"command": "pwd", "cwd": "sub"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], os.path.join(self.work, "sub") + "\n")
        reply = yield self.request("POST", "/shell", {"command": "pwd"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stdout"], self.work + "\n")
        reply = yield self.request("POST", "/shell", {"command": "pwd", "cwd": "/"})
        self.assertEqual(
            (reply.status, reply.json()["code"]), (403, "path_not_allowed")
        )
