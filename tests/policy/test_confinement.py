"""
``params.confine*``: what a policy asks children to be confined to, and
the refusal of a policy this kernel cannot enforce (in memory).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import landlock
from sandboxd.policy import confinement, load_policy
from sandboxd.policy.confinement import check, confinement_note, confinement_of
from sandboxd.policy.document import PolicyError
from sandboxd.routes import builtin_table


def compiled(params: dict[str, Any], selector: str = "shell") -> Any:
    """The rules of a policy that sets ``params`` on ``selector``."""
    policy = {"endpoints": {selector: {"params": params}}}
    return load_policy(
        builtin_table(), explicit=policy, base_dir="/srv/work", environ={}
    ).rules


#: The daemon's own (unpatched) list of what confined commands start through.
REAL_STARTERS = confinement._starters


class KernelCase(SynchronousTestCase):
    """Policies loaded as on a kernel with every Landlock feature."""

    def setUp(self) -> None:
        self.patch(landlock, "abi_version", lambda: 7)
        # Wherever this checkout lives (below /tmp, say), these policies'
        # write directories never hold the daemon's interpreter.
        self.patch(
            confinement,
            "_starters",
            lambda: {
                "/opt/sandboxd/bin/python": "the interpreter confined commands start in",
                "/opt/sandboxd/lib/landlock.py": "the script that confines commands",
            },
        )


class ConfinementOfTests(KernelCase):
    """The confinement a rule describes."""

    def test_off_by_default(self) -> None:
        """Without ``confine`` no endpoint's children are confined."""
        rules = load_policy(
            builtin_table(), explicit={}, base_dir="/srv", environ={}
        ).rules
        self.assertEqual([r for r in rules.values() if confinement_of(r)], [])

    def test_paths_made_absolute(self) -> None:
        """Relative paths are below the base dir; ``.`` is the base dir itself."""
        rules = compiled(
            {"confine": True, "confine_write": [".", "out", "/tmp/x/../y"]}
        )
        got = confinement_of(rules["shell"])
        assert got is not None
        self.assertEqual(got.write, ("/srv/work", "/srv/work/out", "/tmp/y"))
        self.assertEqual(got.read, ("/",))
        self.assertTrue(got.signals)
        self.assertIsNone(confinement_of(rules["shell_stream"]))

    def test_options_are_what_the_child_reads(self) -> None:
        """The child's command line names every setting."""
        rules = compiled(
            {
                "confine": True,
                "confine_signals": "any",
                "confine_tcp_connect": [443],
                "confine_tcp_bind": [],
            }
        )
        got = confinement_of(rules["shell"])
        assert got is not None
        self.assertEqual(
            got.options,
            (
                "--read=/",
                "--write=/srv/work",
                "--write=/tmp",
                "--write=/var/tmp",
                "--write=/dev/shm",
                "--tcp-connect=443",
                "--tcp-bind=",
            ),
        )

    def test_group_selector(self) -> None:
        """A group selector confines every endpoint of the group."""
        rules = compiled({"confine": True}, selector="group:process")
        for endpoint in ("shell", "shell_stream", "process_start"):
            self.assertIsNotNone(confinement_of(rules[endpoint]), endpoint)


class NoteTests(KernelCase):
    """The sentence a model reads about a confined tool."""

    def test_sentence(self) -> None:
        """Paths as the command sees them, ``~`` kept, signals and ports named."""
        rules = compiled(
            {
                "confine": True,
                "confine_write": [".", "out", "~/.cache"],
                "confine_tcp_connect": [443, 80],
                "confine_tcp_bind": [],
            }
        )
        self.assertEqual(
            confinement_note(rules["shell"]),
            "Commands run confined by the kernel: they may write only below"
            " /srv/work, /srv/work/out, ~/.cache; signal only processes they"
            " started; connect to TCP ports 443, 80 only; listen on no TCP port.",
        )
        self.assertIsNone(confinement_note(rules["shell_stream"]))


class PolicyCheckTests(KernelCase):
    """Policies refused for what they ask."""

    def test_unknown_signals_choice(self) -> None:
        """``confine_signals`` is ``own`` or ``any``."""
        with self.assertRaises(PolicyError) as caught:
            compiled({"confine": True, "confine_signals": "mine"})
        self.assertIn("expected one of own, any", str(caught.exception))

    def test_ports_must_be_ports(self) -> None:
        """A port outside 1-65535 is refused, naming the rule."""
        for port in (0, 70000):
            with self.assertRaises(PolicyError) as caught:
                compiled({"confine": True, "confine_tcp_bind": [port]})
            self.assertIn("policy:endpoints.shell", str(caught.exception))
            self.assertIn(f"{port} is not a TCP port", str(caught.exception))

    def test_no_landlock(self) -> None:
        """A kernel without Landlock refuses any confinement."""
        rules = compiled({"confine": True, "confine_signals": "any"})
        with self.assertRaises(PolicyError) as caught:
            check(rules, abi=0)
        self.assertEqual(
            str(caught.exception),
            "policy:endpoints.shell: confine needs Landlock ABI 1 and this kernel"
            " has no Landlock",
        )

    def test_signals_need_abi_6(self) -> None:
        """Keeping signals in needs ABI 6; the message says how to do without."""
        rules = compiled({"confine": True})
        with self.assertRaises(PolicyError) as caught:
            check(rules, abi=5)
        self.assertIn("needs Landlock ABI 6", str(caught.exception))
        self.assertIn("set confine_signals: any", str(caught.exception))
        check(compiled({"confine": True, "confine_signals": "any"}), abi=5)

    def test_ports_need_abi_4(self) -> None:
        """TCP port rules need ABI 4."""
        rules = compiled(
            {"confine": True, "confine_signals": "any", "confine_tcp_connect": [443]}
        )
        with self.assertRaises(PolicyError) as caught:
            check(rules, abi=3)
        self.assertIn(
            "confine_tcp_connect / confine_tcp_bind needs Landlock ABI 4",
            str(caught.exception),
        )
        check(rules, abi=4)

    def test_unconfined_rules_ask_nothing(self) -> None:
        """Without ``confine`` the kernel is not asked: any policy loads anywhere."""
        self.patch(landlock, "abi_version", lambda: 0)
        rules = compiled({"confine_tcp_bind": [0], "confine_signals": "own"})
        check(rules)

    def test_load_refuses(self) -> None:
        """Loading (a start, a reload, check-config) refuses what the kernel lacks."""
        self.patch(landlock, "abi_version", lambda: 5)
        with self.assertRaises(PolicyError) as caught:
            compiled({"confine": True})
        self.assertIn("needs Landlock ABI 6", str(caught.exception))


class WarningTests(KernelCase):
    """Where ``confine`` does not reach, the policy says so."""

    def test_defaults_warn_about_the_rest(self) -> None:
        """
        ``defaults.params.confine`` with git and code contexts on: a
        warning names git, whose children it does not reach; the process
        group alone earns none.
        """
        policy = load_policy(
            builtin_table(),
            explicit={
                "groups": {"git": True, "code": True},
                "defaults": {"params": {"confine": True}},
            },
            base_dir="/srv",
            environ={},
        )
        [warning] = [w for w in policy.warnings if "params.confine" in w]
        self.assertEqual(
            warning,
            "params.confine confines the commands of shell, shell_stream,"
            " process_start, pty_create_session, code_run, code_context_create,"
            " agents_session_create, lsp_session_create, lsp_connect only; what"
            " git start is not confined",
        )
        policy = load_policy(
            builtin_table(),
            explicit={"endpoints": {"group:process": {"params": {"confine": True}}}},
            base_dir="/srv",
            environ={},
        )
        self.assertEqual([w for w in policy.warnings if "params.confine" in w], [])

    def test_daemon_files_below_confine_write(self) -> None:
        """A token file below a directory confined commands may write is named."""
        base = os.path.realpath(self.mktemp())
        os.makedirs(base)
        token_file = os.path.join(base, ".token")
        with open(token_file, "w") as f:
            f.write("a-long-enough-token-for-the-test-0123456789")
        policy = load_policy(
            builtin_table(),
            explicit={
                "auth": {
                    "tokens": [{"id": "ci", "token_file": token_file, "scopes": ["*"]}]
                },
                "endpoints": {"shell": {"params": {"confine": True}}},
            },
            base_dir=base,
            environ={},
        )
        self.assertIn(
            f"policy:endpoints.shell: the daemon's own file {token_file} is below"
            f" confine_write {base}: a confined command may change it",
            policy.warnings,
        )

    def test_interpreter_below_confine_write(self) -> None:
        """
        A confine_write over the daemon's interpreter or its script is
        refused: a command that changed them would unconfine the next ones.
        """
        with self.assertRaises(PolicyError) as caught:
            compiled({"confine": True, "confine_write": ["/opt/sandboxd/lib"]})
        self.assertEqual(
            str(caught.exception),
            "policy:endpoints.shell: confine_write /opt/sandboxd/lib holds the"
            " script that confines commands (/opt/sandboxd/lib/landlock.py): a"
            " confined command could change it and leave the next ones"
            " unconfined; install sandboxd outside the directories commands may"
            " write, or narrow confine_write",
        )

    def test_real_starters(self) -> None:
        """What is checked is this daemon's own interpreter and script."""
        starters = REAL_STARTERS()
        for path in (sys.executable, landlock.__file__, os.path.dirname(os.__file__)):
            self.assertIn(os.path.realpath(path), starters)
