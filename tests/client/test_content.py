"""
Awkward but legitimate output and file names through the HTTP API, as
``sandboxd.client`` shows them: the bytes printed (U+FFFD where they were
not UTF-8), whole characters wherever output is cut, names as written.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client.errors import PermissionDenied
from sandboxd.policy.defaults import MAX_LINE_BYTES
from tests.client.base import ClientCase

#: Who commits (the daemon's machine may have no git identity).
AUTHOR = {"name": "Ada", "email": "ada@example.com"}

#: Line separators JSON leaves raw (NEL, U+2028, U+2029), a NUL, a lone CR
#: and a byte that is not UTF-8, on one line.
AWKWARD = "printf 'a\\302\\205b\\342\\200\\250c\\342\\200\\251d\\000e\\rf\\377g\\n'"
AWKWARD_TEXT = "a\u0085b\u2028c\u2029d\x00e\rf\ufffdg"

#: A 4-byte character whose first two bytes are read before the rest.
SPLIT_CHARACTER = "printf '\\360\\237'; sleep 0.3; printf '\\230\\200z\\n'"

#: Three-byte characters: more than a line's bound of them, in two writes
#: so the line is cut before its end has been read; the bound is not a
#: multiple of 3, so the cut falls inside a character.
LONG_LINE_CHARS = MAX_LINE_BYTES // 3 + 2000
LONG_LINE = (
    'python3 -c "import sys, time; w = sys.stdout.buffer;'
    f" w.write(b'\\xe2\\x82\\xac' * {LONG_LINE_CHARS}); w.flush(); time.sleep(0.3);"
    " w.write(b'\\xe2\\x82\\xac' * 100 + b'\\n')\""
)


class OutputTests(ClientCase):
    """What a command printed, through every way the client reads it."""

    @inlineCallbacks
    def test_awkward_line_everywhere(self) -> Any:
        """
        One line holding line separators, a NUL, a lone CR and a bad byte
        arrives as one line, the same text through ``/shell``,
        ``/shell/stream``, a background process's output page and its
        event stream.
        """
        sb = self.sandbox()

        def run() -> Any:
            lines: list[str] = []
            plain = sb.commands.run(AWKWARD, shell="bash")
            streamed = sb.commands.run(AWKWARD, shell="bash", on_stdout=lines.append)
            process = sb.commands.start(AWKWARD, shell="bash")
            process.wait(20)
            page = process.output(after=0)
            events = [e for e in process.stream(after=0) if e.event == "stdout"]
            return plain, streamed, lines, page, events

        plain, streamed, lines, page, events = yield self.in_thread(run)
        self.assertEqual(plain.stdout, AWKWARD_TEXT + "\n")
        self.assertEqual(streamed.stdout, AWKWARD_TEXT + "\n")
        self.assertEqual(lines, [AWKWARD_TEXT])
        self.assertEqual([e["data"] for e in page["events"]], [AWKWARD_TEXT + "\n"])
        self.assertEqual([e.data["data"] for e in events], [AWKWARD_TEXT + "\n"])

    @inlineCallbacks
    def test_character_split_across_reads(self) -> Any:
        """
        A character whose bytes the daemon reads in two reads arrives whole,
        and a background process's output page does not count its first
        bytes as dropped.
        """
        sb = self.sandbox()

        def run() -> Any:
            lines: list[str] = []
            sb.commands.run(SPLIT_CHARACTER, shell="bash", on_stdout=lines.append)
            process = sb.commands.start(SPLIT_CHARACTER, shell="bash")
            process.wait(20)
            return lines, process.output(after=0)

        lines, page = yield self.in_thread(run)
        self.assertEqual(lines, ["\U0001f600z"])
        self.assertEqual("".join(e["data"] for e in page["events"]), "\U0001f600z\n")
        self.assertFalse(page["dropped"])
        self.assertEqual(page["dropped_bytes"], 0)

    @inlineCallbacks
    def test_long_line_cut_between_characters(self) -> Any:
        """
        A line longer than the stream's line bound comes in pieces of at
        most the bound, each cut between characters: joined they are the
        line printed, with no replacement character.
        """
        sb = self.sandbox()

        def run() -> list[str]:
            lines: list[str] = []
            sb.commands.run(LONG_LINE, shell="bash", on_stdout=lines.append)
            return lines

        lines = yield self.in_thread(run)
        self.assertGreater(len(lines), 1)
        self.assertEqual("".join(lines), "\u20ac" * (LONG_LINE_CHARS + 100))
        for line in lines:
            self.assertLessEqual(len(line.encode()), MAX_LINE_BYTES)

    @inlineCallbacks
    def test_terminal(self) -> Any:
        """
        A terminal's output frames carry line separators, a NUL and a
        character split across reads as printed, a bad byte as U+FFFD.
        """
        sb = self.sandbox()

        def run() -> str:
            with sb.pty.open(shell="sh") as term:
                term.send(f"{AWKWARD}; {SPLIT_CHARACTER}; echo END-$((6*7))\n")
                return term.expect("END-42", timeout=20)

        seen = yield self.in_thread(run)
        self.assertIn(AWKWARD_TEXT + "\r\n\U0001f600z\r\nEND-42", seen)


class NameTests(ClientCase):
    """File names that are awkward but legal, through the file routes."""

    @inlineCallbacks
    def test_awkward_names(self) -> Any:
        """
        Names with a newline, a leading dash, a trailing space, U+2028 or NEL
        are listed, statted and downloaded as written; a name that is not
        UTF-8 is listed with its bad byte as ``\\xNN``.
        """
        names = ["nl\nname", "-dash", "space ", "sep\u2028name", "nel\u0085x"]
        os.makedirs(self.path("odd"))
        for name in names:
            with open(self.path("odd", name), "w") as f:
                f.write(name)
        with open(os.path.join(self.path("odd").encode(), b"bad\xffname"), "wb"):
            pass
        sb = self.sandbox()

        def run() -> Any:
            listed = sorted(e["name"] for e in sb.files.list("odd"))
            stats = [sb.files.stat(f"odd/{name}")["name"] for name in names]
            bodies = [sb.files.read_text(f"odd/{name}") for name in names]
            return listed, stats, bodies

        listed, stats, bodies = yield self.in_thread(run)
        self.assertEqual(listed, sorted([*names, "bad\\xffname"]))
        self.assertEqual(stats, names)
        self.assertEqual(bodies, names)

    @inlineCallbacks
    def test_cli_ls_escapes_what_is_not_printable(self) -> Any:
        """
        ``sandboxd ls`` prints a name holding a newline, an escape sequence
        or U+2028 with those escaped: one line per entry, and nothing a
        terminal would act on; ``--json`` keeps the names as they are.
        """
        os.makedirs(self.path("cli"))
        names = ["nl\nname", "esc\x1b]0;title\x07x", "sep\u2028x", "caf\u00e9 "]
        for name in names:
            with open(self.path("cli", name), "w"):
                pass
        done = yield self.cli("ls", "cli")
        raw = yield self.cli("ls", "--json", "cli")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(
            done.stdout.decode().split("\n"),
            ["caf\u00e9 ", "esc\\x1b]0;title\\x07x", "nl\\nname", "sep\\u2028x", ""],
        )
        entries = json.loads(raw.stdout)["entries"]
        self.assertEqual(sorted(e["name"] for e in entries), sorted(names))

    @inlineCallbacks
    def test_cli_ps_escapes_what_is_not_printable(self) -> Any:
        """``sandboxd ps`` prints a command line and a tag the same way: one line each."""
        sb = self.sandbox()
        process = yield self.in_thread(
            sb.commands.start,
            ["sh", "-c", "sleep 30", "\x1b]0;title\x07\nx"],
            tag="t\u2028g",
        )
        self.addCleanup(self.in_thread, process.kill)
        done = yield self.cli("ps", "--tag", "t\u2028g")
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.decode().splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertIn("t\\u2028g", lines[1])
        self.assertIn("\\x1b]0;title\\x07\\nx", lines[1])


class GitNameTests(ClientCase):
    """The git group with names holding a line separator git allows."""

    policy = {"groups": {"git": True}}

    @inlineCallbacks
    def test_repository_and_branch_names(self) -> Any:
        """
        A repository whose directory name holds U+2028 works, a branch
        whose name holds U+2028 or NEL is listed, and a stash whose message
        holds U+2028 is one stash (git's output is read in lines ended by a
        newline only).
        """

        def body() -> Any:
            sb = self.sandbox()
            repo = "re\u2028po"
            sb.git.init(repo)
            sb.files.write_text(f"{repo}/a.txt", "one\n")
            sb.git.add(repo, ["a.txt"])
            sb.git.commit(repo, "first", author=AUTHOR)
            sb.git.create_branch(repo, "feat\u2028x")
            sb.git.create_branch(repo, "nel\u0085y")
            sb.files.write_text(f"{repo}/a.txt", "two\n")
            stashed = sb.request(
                "POST",
                "/git/stash",
                json={"path": repo, "action": "push", "message": "wip\u2028more"},
            )
            return sb.git.branches(repo), stashed

        branches, stashed = yield self.in_thread(body)
        names = sorted(b["name"] for b in branches["branches"])
        self.assertEqual(names, ["feat\u2028x", "main", "nel\u0085y"])
        self.assertEqual(len(stashed["stashes"]), 1, stashed)
        self.assertIn("wip\u2028more", stashed["stashes"][0]["message"])


class GitPlaceTests(ClientCase):
    """Where git writes is checked when its path holds a line separator too."""

    policy = {
        "groups": {"git": True},
        "endpoints": {"group:git": {"paths": {"read_only": ["ro", "ro\u2028d"]}}},
    }

    @inlineCallbacks
    def test_git_dir_in_a_read_only_directory(self) -> Any:
        """
        A work tree whose git dir lies in a read-only directory is refused a
        commit, whether or not that directory's name holds U+2028.
        """
        for holder in ("ro", "ro\u2028d"):
            os.makedirs(self.path(holder))
            subprocess.run(
                [
                    "git",
                    "init",
                    "-q",
                    f"--separate-git-dir={self.path(holder, 'g.git')}",
                    self.path(f"w-{len(holder)}"),
                ],
                check=True,
            )
        sb = self.sandbox()

        def body() -> Any:
            refused = []
            for holder in ("ro", "ro\u2028d"):
                work = f"w-{len(holder)}"
                sb.files.write_text(f"{work}/a.txt", "one\n")
                try:
                    sb.git.add(work, ["a.txt"])
                    sb.git.commit(work, "first", author=AUTHOR)
                except PermissionDenied as e:
                    refused.append(e.code)
            return refused

        refused = yield self.in_thread(body)
        self.assertEqual(refused, ["read_only", "read_only"])


class DevtoolsPlaceTests(ClientCase):
    """git_status checks the repository's top when its name holds U+2028."""

    #: ``top`` and ``x`` are what the top's path would be cut into at U+2028.
    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {
            "git_status": {"paths": {"allow": ["top", "x", "top\u2028x/sub"]}}
        },
    }

    @inlineCallbacks
    def test_repository_top_outside_the_allowed_paths(self) -> Any:
        """
        A status asked from an allowed directory inside a repository whose
        top (its name holding U+2028) is not allowed is refused.
        """
        os.makedirs(self.path("top\u2028x", "sub"))
        subprocess.run(["git", "init", "-q", self.path("top\u2028x")], check=True)
        sb = self.sandbox()

        def body() -> Any:
            sb.request("GET", "/git/status", params={"path": "top\u2028x/sub"})

        failure = yield self.assertFailure(self.in_thread(body), PermissionDenied)
        self.assertEqual(failure.code, "path_not_allowed")
