"""
git status and diff (SPEC §7.7): the porcelain and numstat parsers on
fixed bytes, then the endpoints on repositories the tests build, including
hostile ones whose configuration names commands that must never run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase

from sandboxd import git
from sandboxd.routes import devtools
from tests.helpers import DaemonTestCase

GIT = shutil.which("git")
NO_GIT = None if GIT else "git is not installed"

#: Tests build repositories with a plain, isolated git of their own.
_TEST_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def run_git(repo: str, *args: str) -> str:
    """Run git in ``repo`` for test setup (blocking is fine before requests)."""
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env=_TEST_ENV,
        capture_output=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return done.stdout.decode()


def write(path: str, text: str) -> None:
    """Create or replace a file, with its parent directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def new_repo(path: str, files: dict[str, str]) -> str:
    """A repository on branch main with ``files`` committed."""
    os.makedirs(path)
    run_git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        write(os.path.join(path, name), text)
    run_git(path, "add", "-A")
    run_git(path, "commit", "-q", "-m", "first")
    return path


class ParserTests(SynchronousTestCase):
    """The parsers on bytes as git prints them."""

    def test_status(self) -> None:
        """Every porcelain code maps to its word; renames keep the old path."""
        out = (
            b"## main...origin/main [ahead 2, behind 1]\x00"
            b" M mod.txt\x00MM both.txt\x00A  new.txt\x00 D gone.txt\x00D  staged-gone.txt\x00"
            b"R  to.txt\x00from.txt\x00C  copy.txt\x00orig.txt\x00UU conflict.txt\x00AA both-added.txt\x00"
            b"?? with space.txt\x00 T type.txt\x00"
        )
        result = git.status_result(out)
        self.assertEqual(
            (result["branch"], result["ahead"], result["behind"], result["upstream"]),
            ("main", 2, 1, "origin/main"),
        )
        self.assertFalse(result["clean"])
        self.assertEqual(
            [(f["path"], f["status"]) for f in result["files"]],
            [
                ("mod.txt", "modified"),
                ("both.txt", "modified"),
                ("new.txt", "added"),
                ("gone.txt", "deleted"),
                ("staged-gone.txt", "deleted"),
                ("to.txt", "renamed"),
                ("copy.txt", "copied"),
                ("conflict.txt", "unmerged"),
                ("both-added.txt", "unmerged"),
                ("with space.txt", "untracked"),
                ("type.txt", "modified"),
            ],
        )
        self.assertEqual(result["files"][5]["orig_path"], "from.txt")
        self.assertEqual(
            [f["staged"] for f in result["files"][:4]], [False, True, True, False]
        )

    def test_branch_headers(self) -> None:
        """Fresh repositories, detached heads and gone upstreams parse."""
        self.assertEqual(git.parse_branch("No commits yet on main").branch, "main")
        empty_clone = git.parse_branch("No commits yet on main...origin/main [gone]")
        self.assertEqual(
            (empty_clone.branch, empty_clone.upstream, empty_clone.gone),
            ("main", "origin/main", True),
        )
        detached = git.parse_branch("HEAD (no branch)")
        self.assertEqual((detached.branch, detached.detached), ("HEAD", True))
        gone = git.parse_branch("dev...origin/dev [gone]")
        self.assertEqual(
            (gone.branch, gone.upstream, gone.gone, gone.ahead),
            ("dev", "origin/dev", True, 0),
        )
        self.assertEqual(
            git.status_result(b"## main\x00"),
            {"branch": "main", "clean": True, "ahead": 0, "behind": 0, "files": []},
        )

    def test_numstat(self) -> None:
        """Counts add up; binary files count as changed; renames take two extra records."""
        out = b"3\t1\ta.txt\x00-\t-\timg.png\x000\t0\t\x00old.txt\x00new.txt\x0010\t0\tb.txt\x00"
        self.assertEqual(
            git.parse_numstat(out),
            {"files_changed": 4, "insertions": 13, "deletions": 1},
        )

    def test_numstat_conflict_is_one_file(self) -> None:
        """A file in conflict prints a record per side: it is one file changed."""
        out = b"0\t0\tf\x004\t0\tf\x001\t1\tg\x00"
        self.assertEqual(
            git.parse_numstat(out),
            {"files_changed": 2, "insertions": 5, "deletions": 1},
        )
        self.assertEqual(
            git.numstat_names(b"1\t0\ta\xe9\x000\t0\t\x00old\x00new\x00"),
            ["a\udce9", "old", "new"],
        )

    def test_truncate(self) -> None:
        """A diff over the limit is cut at a line end and ends with the seed's marker."""
        diff = b"".join(b"+line %d\n" % i for i in range(300000))
        text, cut = git.truncate_diff(diff, 10**6)
        self.assertTrue(cut)
        self.assertTrue(text.endswith("\n... (truncated at 1MB)"))
        self.assertLessEqual(len(text.encode()), 10**6 + 30)
        self.assertEqual(git.truncate_diff(b"small\n", 10**6), ("small\n", False))

    def test_filter_overrides(self) -> None:
        """Every filter driver the repository defines is emptied and made optional."""
        names = [
            "core.bare",
            "filter.lfs.clean",
            "filter.lfs.smudge",
            "filter.my.driver.process",
        ]
        overrides = git.filter_overrides(names)
        self.assertIn("filter.lfs.clean=", overrides)
        self.assertIn("filter.my.driver.process=", overrides)
        self.assertIn("filter.lfs.required=false", overrides)

    def test_program_overrides(self) -> None:
        """
        Merge drivers become git's own text merge, filters are emptied; a
        driver whose name holds ``=`` (which ``-c`` cannot name) is refused.
        """
        overrides = git.program_overrides(
            [
                "merge.Evil.driver",
                "merge.Evil.name",
                "filter.f.clean",
                "diff.d.textconv",
            ]
        )
        self.assertEqual(
            overrides,
            [
                "filter.f.clean=",
                "filter.f.smudge=",
                "filter.f.process=",
                "filter.f.required=false",
                f"merge.Evil.driver={git.TEXT_MERGE}",
            ],
        )
        with self.assertRaises(git.UnsettableName):
            git.program_overrides(["filter.a=b.clean"])

    def test_identity_values(self) -> None:
        """
        ``git config --null --get-regexp`` output read name by name, the
        last of a name winning; values git could not write in a commit
        header are left out.
        """
        output = (
            b"user.name\nGrace Hopper\0user.email\ngrace@example.com\0"
            b"user.name\nGrace\0Author.Email\na@example.com\0"
            b"committer.name\n\0committer.email\n" + b"x" * 300 + b"\0"
            b"user.bogus\0"
        )
        self.assertEqual(
            git.identity_values(output),
            {
                "user.name": "Grace",
                "user.email": "grace@example.com",
                "author.email": "a@example.com",
            },
        )
        self.assertEqual(git.identity_values(b""), {})

    def test_identity_environment(self) -> None:
        """
        Only the parts the repository's own settings leave unsaid are
        given, a role's own setting before ``user.*``.
        """
        home = {
            "user.name": "Grace",
            "user.email": "grace@example.com",
            "committer.email": "ci@example.com",
        }
        self.assertEqual(
            git.identity_environment([], home),
            {
                "GIT_AUTHOR_NAME": "Grace",
                "GIT_AUTHOR_EMAIL": "grace@example.com",
                "GIT_COMMITTER_NAME": "Grace",
                "GIT_COMMITTER_EMAIL": "ci@example.com",
            },
        )
        self.assertEqual(
            git.identity_environment(["core.bare", "User.Name", "author.email"], home),
            {"GIT_COMMITTER_EMAIL": "ci@example.com"},
        )
        self.assertEqual(git.identity_environment([], {}), {})
        # A repository that names the whole identity needs nothing read.
        self.assertEqual(git.unsaid_identity(["user.name", "User.Email"]), [])
        self.assertEqual(
            git.unsaid_identity(["user.name", "author.email"]),
            [("committer", "email")],
        )

    def test_parent_segments(self) -> None:
        """``..`` as a segment is caught; dots inside a name are not."""
        self.assertTrue(git.has_parent_segment("a/../b"))
        self.assertTrue(git.has_parent_segment(".."))
        self.assertFalse(git.has_parent_segment("a..b/c"))


class GitStatusTests(DaemonTestCase):
    """GET /git/status on repositories below the base dir."""

    skip = NO_GIT
    policy = {"groups": {"dev_tools": True}}

    @inlineCallbacks
    def test_every_status(self) -> Any:
        """Modified, deleted, renamed, added and untracked files are reported with the branch."""
        repo = new_repo(
            os.path.join(self.base_dir, "repo"),
            {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "d.txt": "d\n"},
        )
        write(os.path.join(repo, "a.txt"), "changed\n")
        os.remove(os.path.join(repo, "b.txt"))
        run_git(repo, "mv", "c.txt", "renamed.txt")
        write(os.path.join(repo, "new.txt"), "new\n")
        run_git(repo, "add", "new.txt")
        write(os.path.join(repo, "untracked file.txt"), "u\n")
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(
            (body["branch"], body["clean"], body["ahead"], body["behind"]),
            ("main", False, 0, 0),
        )
        self.assertEqual(
            sorted((f["path"], f["status"]) for f in body["files"]),
            [
                ("a.txt", "modified"),
                ("b.txt", "deleted"),
                ("new.txt", "added"),
                ("renamed.txt", "renamed"),
                ("untracked file.txt", "untracked"),
            ],
        )

    @inlineCallbacks
    def test_clean_ahead_behind(self) -> Any:
        """A clone reports clean, then ahead and behind its upstream."""
        origin = new_repo(os.path.join(self.base_dir, "origin"), {"a.txt": "a\n"})
        clone = os.path.join(self.base_dir, "clone")
        run_git(self.base_dir, "clone", "-q", origin, clone)
        reply = yield self.request("GET", "/git/status?path=clone")
        self.assertEqual(
            reply.json(),
            {
                "branch": "main",
                "clean": True,
                "ahead": 0,
                "behind": 0,
                "files": [],
                "upstream": "origin/main",
            },
        )
        for n in range(2):
            write(os.path.join(origin, f"o{n}.txt"), "o\n")
            run_git(origin, "add", "-A")
            run_git(origin, "commit", "-q", "-m", f"origin {n}")
        write(os.path.join(clone, "c.txt"), "c\n")
        run_git(clone, "add", "-A")
        run_git(clone, "commit", "-q", "-m", "clone")
        run_git(clone, "fetch", "-q")
        reply = yield self.request("GET", "/git/status?path=clone")
        body = reply.json()
        self.assertEqual((body["ahead"], body["behind"], body["clean"]), (1, 2, True))

    @inlineCallbacks
    def test_unmerged(self) -> Any:
        """
        A merge conflict shows as unmerged, and the merge (or a rebase
        stopped on it) as ``in_progress``.
        """
        repo = new_repo(os.path.join(self.base_dir, "repo"), {"a.txt": "base\n"})
        run_git(repo, "checkout", "-q", "-b", "other")
        write(os.path.join(repo, "a.txt"), "other\n")
        run_git(repo, "commit", "-q", "-am", "other")
        run_git(repo, "checkout", "-q", "main")
        write(os.path.join(repo, "a.txt"), "main\n")
        run_git(repo, "commit", "-q", "-am", "main")
        subprocess.run(
            ["git", "merge", "-q", "other"],
            cwd=repo,
            env=_TEST_ENV,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(
            reply.json()["files"],
            [{"path": "a.txt", "status": "unmerged", "staged": False}],
        )
        self.assertEqual(reply.json()["in_progress"], "merge")
        run_git(repo, "merge", "--abort")
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertNotIn("in_progress", reply.json())
        # A rebase stopped on the same conflict, from a terminal.
        subprocess.run(
            ["git", "rebase", "other"],
            cwd=repo,
            env=_TEST_ENV,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(reply.json()["in_progress"], "rebase")

    @inlineCallbacks
    def test_refusals(self) -> Any:
        """``..`` is 400, outside the boundary 403, a plain directory 400 GitError, git missing 500."""
        os.mkdir(os.path.join(self.base_dir, "plain"))
        reply = yield self.request("GET", "/git/status?path=plain/../plain")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", "/git/status?path=/etc")
        self.assertEqual(reply.status, 403)
        # The base dir sits inside this project's own checkout: discovery
        # must stop at the boundary rather than find that repository.
        reply = yield self.request("GET", "/git/status?path=plain")
        self.assertEqual(reply.status, 400, reply.body)
        self.assertEqual(reply.json()["type"], "GitError")
        self.patch(devtools, "BOOT_ENVIRON", {"PATH": "/nonexistent"})
        reply = yield self.request("GET", "/git/status?path=plain")
        self.assertEqual(reply.status, 500)
        self.assertEqual(reply.json()["type"], "FileNotFoundError")

    @inlineCallbacks
    def test_answer_waits_for_every_git(self) -> Any:
        """
        A refusal from one of the two git runs a call starts side by side
        is answered once the other has ended too: nothing of the call is
        left running behind its answer.
        """
        os.mkdir(os.path.join(self.base_dir, "plain"))
        tools = os.path.realpath(self.mktemp())
        os.mkdir(tools)
        ended = os.path.join(tools, "config-ended")
        # A git whose `rev-parse` fails at once and whose `config` takes a
        # second, then leaves a mark.
        fake = os.path.join(tools, "git")
        with open(fake, "w") as f:
            f.write(
                "#!/bin/sh\n"
                'for a; do case "$a" in\n'
                '  rev-parse) echo "fatal: not a git repository" >&2; exit 128;;\n'
                f"  config) sleep 1; : > {ended}; exit 0;;\n"
                "esac; done\n"
                "exit 1\n"
            )
        os.chmod(fake, 0o755)
        self.patch(devtools, "BOOT_ENVIRON", {"PATH": f"{tools}:/usr/bin:/bin"})
        for target in ("/git/status?path=plain", "/git/diff?path=plain"):
            reply = yield self.request("GET", target)
            self.assertEqual(reply.status, 400, reply.body)
            self.assertTrue(
                os.path.exists(ended), f"{target} answered before git ended"
            )
            os.unlink(ended)

    @inlineCallbacks
    def test_repository_elsewhere_refused(self) -> Any:
        """A ``.git`` file pointing outside the boundary is refused by the guard."""
        outside = new_repo(os.path.realpath(self.mktemp()), {"a.txt": "a\n"})
        inside = os.path.join(self.base_dir, "linked")
        os.mkdir(inside)
        write(os.path.join(inside, ".git"), f"gitdir: {outside}/.git\n")
        reply = yield self.request("GET", "/git/status?path=linked")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "path_not_allowed")

    @inlineCallbacks
    def test_common_dir_or_alternates_elsewhere_refused(self) -> Any:
        """
        A git dir whose ``commondir`` or ``objects/info/alternates`` names a
        repository outside the boundary is refused as a ``.git`` file
        naming one is, and nothing of that repository is shown.
        """
        outside = new_repo(os.path.realpath(self.mktemp()), {"a.txt": "away\n"})
        inside = new_repo(os.path.join(self.base_dir, "here"), {"a.txt": "a\n"})
        git_dir = os.path.join(inside, ".git")
        for name, text in (
            ("commondir", f"{outside}/.git\n"),
            ("objects/info/alternates", f"{outside}/.git/objects\n"),
        ):
            write(os.path.join(git_dir, name), text)
            for target in ("/git/status?path=here", "/git/diff?path=here"):
                reply = yield self.request("GET", target)
                self.assertEqual(reply.status, 403, (name, target, reply.body))
                self.assertEqual(reply.json()["code"], "path_not_allowed")
            os.unlink(os.path.join(git_dir, name))
        reply = yield self.request("GET", "/git/status?path=here")
        self.assertEqual(reply.status, 200, reply.body)


class GitTimeoutTests(DaemonTestCase):
    """git runs within ``limits.timeout_seconds``."""

    skip = NO_GIT
    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {"git_status": {"limits": {"timeout_seconds": 0.3}}},
    }

    @inlineCallbacks
    def test_timeout(self) -> Any:
        """A git call past its limit is 408 TimeoutError."""
        repo = os.path.join(self.base_dir, "repo")
        new_repo(repo, {"a.txt": "a\n"})
        # An index that is a FIFO with no writer: git blocks opening it, so
        # the call outlasts its limit however fast the machine is.
        index = os.path.join(repo, ".git", "index")
        os.unlink(index)
        os.mkfifo(index)
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(reply.status, 408, reply.body)
        self.assertEqual(reply.json()["type"], "TimeoutError")


class HostileRepositoryTests(DaemonTestCase):
    """A repository's configured commands never run on status or diff."""

    skip = NO_GIT
    policy = {"groups": {"dev_tools": True}}

    def hostile_repo(self) -> tuple[str, str]:
        """A repository whose fsmonitor, filter, textconv and external diff touch a marker."""
        repo = new_repo(
            os.path.join(self.base_dir, "evil"), {"a.txt": "one\n", "b.dat": "x\n"}
        )
        marker = os.path.join(self.base_dir, "PWNED")
        script = os.path.join(self.base_dir, "evil.sh")
        write(script, f"#!/bin/sh\ntouch {marker}\ncat\n")
        os.chmod(script, 0o755)
        write(
            os.path.join(repo, ".gitattributes"), "*.txt diff=evil\n*.dat filter=evil\n"
        )
        for key, value in [
            ("core.fsmonitor", script),
            ("diff.evil.textconv", script),
            ("diff.evil.command", script),
            ("diff.external", script),
            ("filter.evil.clean", script),
            ("filter.evil.smudge", script),
            ("filter.evil.required", "true"),
            ("core.pager", script),
            ("core.hooksPath", os.path.dirname(script)),
        ]:
            run_git(repo, "config", key, value)
        write(os.path.join(repo, "a.txt"), "two\n")
        write(os.path.join(repo, "b.dat"), "y\n")
        return repo, marker

    def test_marker_works(self) -> None:
        """Control: a plain ``git diff`` in this repository does run the repository's command."""
        repo, marker = self.hostile_repo()
        subprocess.run(
            ["git", "diff"],
            cwd=repo,
            env=_TEST_ENV,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        self.assertTrue(os.path.exists(marker))

    @inlineCallbacks
    def test_status_and_diff_run_nothing(self) -> Any:
        """status and diff (plain, staged, one file) answer and leave no marker."""
        # (The test's own setup git below switches the hooks off by hand.)
        repo, marker = self.hostile_repo()
        reply = yield self.request("GET", "/git/status?path=evil")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            sorted((f["path"], f["status"]) for f in reply.json()["files"]),
            [
                (".gitattributes", "untracked"),
                ("a.txt", "modified"),
                ("b.dat", "modified"),
            ],
        )
        reply = yield self.request("GET", "/git/diff?path=evil")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertIn("-one\n+two\n", body["diff"])
        self.assertEqual(
            body["stats"], {"files_changed": 2, "insertions": 2, "deletions": 2}
        )
        run_git(
            repo,
            "-c",
            "filter.evil.clean=cat",
            "-c",
            "filter.evil.required=false",
            "-c",
            "core.fsmonitor=false",
            "add",
            "a.txt",
        )
        reply = yield self.request("GET", "/git/diff?path=evil&staged=true")
        self.assertEqual(
            reply.json()["stats"], {"files_changed": 1, "insertions": 1, "deletions": 1}
        )
        reply = yield self.request("GET", "/git/diff?path=evil&file=b.dat")
        self.assertEqual(reply.json()["stats"]["files_changed"], 1)
        self.assertIn("b.dat", reply.json()["diff"])
        self.assertFalse(os.path.exists(marker), "a repository-configured command ran")


class GitDiffTests(DaemonTestCase):
    """GET /git/diff output and its cap."""

    skip = NO_GIT
    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {"git_diff": {"limits": {"max_output_bytes": 2000}}},
    }

    @inlineCallbacks
    def test_truncated(self) -> Any:
        """A diff over ``max_output_bytes`` is cut with the marker; the stats stay whole."""
        repo = new_repo(
            os.path.join(self.base_dir, "repo"),
            {"big.txt": "".join(f"{i}\n" for i in range(2000))},
        )
        write(
            os.path.join(repo, "big.txt"),
            "".join(f"{i} changed\n" for i in range(2000)),
        )
        reply = yield self.request("GET", "/git/diff?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertTrue(body["diff"].endswith("\n... (truncated at 2KB)"))
        self.assertTrue(body["diff"].startswith("diff --git a/big.txt b/big.txt\n"))
        self.assertLessEqual(len(body["diff"]), 2000 + 30)
        self.assertTrue(body["truncated"])
        self.assertEqual(
            body["stats"], {"files_changed": 1, "insertions": 2000, "deletions": 2000}
        )

    @inlineCallbacks
    def test_bad_params(self) -> Any:
        """``staged`` must be a boolean; ``..`` in ``file`` is 400."""
        new_repo(os.path.join(self.base_dir, "repo"), {"a.txt": "a\n"})
        reply = yield self.request("GET", "/git/diff?path=repo&staged=maybe")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", "/git/diff?path=repo&file=../x")
        self.assertEqual(reply.status, 400)
        reply = yield self.request("GET", "/git/diff?path=repo")
        self.assertEqual(
            reply.json(),
            {
                "diff": "",
                "stats": {"files_changed": 0, "insertions": 0, "deletions": 0},
            },
        )


class GitDiffDenyTests(DaemonTestCase):
    """A diff may not show the changes of files paths.deny refuses."""

    skip = NO_GIT
    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {"git_diff": {"paths": {"deny": ["**/secret/**"]}}},
    }

    @inlineCallbacks
    def test_whole_tree_needs_a_file(self) -> Any:
        """
        Without ``file`` it is 403 path_denied and nothing is shown; a denied
        file is 403; an allowed file's diff is served.
        """
        repo = new_repo(
            os.path.join(self.base_dir, "repo"),
            {"a.txt": "a\n", "secret/s.txt": "old\n"},
        )
        write(os.path.join(repo, "secret", "s.txt"), "top-secret\n")
        write(os.path.join(repo, "a.txt"), "b\n")
        reply = yield self.request("GET", "/git/diff?path=repo")
        self.assertEqual((reply.status, reply.json()["code"]), (403, "path_denied"))
        self.assertNotIn(b"top-secret", reply.body)
        reply = yield self.request("GET", "/git/diff?path=repo&file=secret/s.txt")
        self.assertEqual(reply.status, 403)
        self.assertNotIn(b"top-secret", reply.body)
        reply = yield self.request("GET", "/git/diff?path=repo&file=a.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("+b", reply.json()["diff"])

    @inlineCallbacks
    def test_a_directory_holding_denied_changes_is_refused(self) -> Any:
        """
        ``file`` naming a directory is a diff of every file below it: ``.``,
        ``./`` and ``conf`` (whose ``secret/`` changed, or was deleted, or
        its deletion staged) are 403 path_denied with nothing of the
        denied file shown, while ``docs``, whose changes are all allowed,
        is served.
        """
        repo = new_repo(
            os.path.join(self.base_dir, "repo"),
            {
                "secret/keys.env": "KEY=old\n",
                "conf/secret/db.ini": "pw=old\n",
                "conf/app.ini": "a=1\n",
                "docs/readme.md": "hi\n",
            },
        )
        write(os.path.join(repo, "secret", "keys.env"), "KEY=sk-new-secret\n")
        write(os.path.join(repo, "conf", "secret", "db.ini"), "pw=secret-pw\n")
        write(os.path.join(repo, "conf", "app.ini"), "a=2\n")
        write(os.path.join(repo, "docs", "readme.md"), "hello\n")
        for file in (".", "./", "conf", "conf/"):
            reply = yield self.request("GET", f"/git/diff?path=repo&file={file}")
            self.assertEqual(reply.status, 403, (file, reply.body))
            self.assertEqual(reply.json()["code"], "path_denied")
            self.assertIn("rule", reply.json())
            self.assertNotIn(b"secret", reply.body.replace(b"**/secret/**", b""))
        reply = yield self.request("GET", "/git/diff?path=repo&file=docs")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("+hello", reply.json()["diff"])
        self.assertEqual(reply.json()["stats"]["files_changed"], 1)
        # Deleted from the work tree, then the deletion staged: the same.
        shutil.rmtree(os.path.join(repo, "conf", "secret"))
        reply = yield self.request("GET", "/git/diff?path=repo&file=conf")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertNotIn(b"pw=", reply.body)
        run_git(repo, "add", "-A", "conf")
        reply = yield self.request("GET", "/git/diff?path=repo&file=conf&staged=true")
        self.assertEqual(reply.status, 403, reply.body)
        self.assertNotIn(b"pw=", reply.body)


class GitStatusDenyTests(DaemonTestCase):
    """git_status does not name the files paths.deny refuses, as files_list does not."""

    skip = NO_GIT
    policy = {
        "groups": {"dev_tools": True},
        "endpoints": {"git_status": {"paths": {"deny": ["**/secret/**"]}}},
    }

    @inlineCallbacks
    def test_denied_names_are_left_out(self) -> Any:
        """
        A changed denied file is left out and counted in ``hidden``; a file
        renamed out of a denied directory is listed without its old name.
        """
        repo = new_repo(
            os.path.join(self.base_dir, "repo"),
            {"secret/keys.env": "K=1\n", "secret/moved.txt": "m\n", "a.txt": "a\n"},
        )
        write(os.path.join(repo, "secret", "keys.env"), "K=2\n")
        write(os.path.join(repo, "a.txt"), "b\n")
        run_git(repo, "mv", "secret/moved.txt", "moved.txt")
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertNotIn(b"secret", reply.body)
        self.assertEqual(
            sorted((f["path"], f["status"]) for f in body["files"]),
            [("a.txt", "modified"), ("moved.txt", "renamed")],
        )
        self.assertNotIn("orig_path", body["files"][-1])
        self.assertEqual((body["hidden"], body["clean"]), (1, False))


class GitNamesTests(DaemonTestCase):
    """Names that are not UTF-8, as git_status shows them and git_diff takes them."""

    skip = NO_GIT
    policy = {"groups": {"dev_tools": True}}

    @inlineCallbacks
    def test_name_not_utf8_round_trips(self) -> Any:
        """
        A name holding the byte 0xE9 is listed as ``lat\\xe9.txt`` (as
        files_list shows it), and its bytes percent-encoded give its diff.
        """
        repo = new_repo(os.path.join(self.base_dir, "repo"), {"a.txt": "a\n"})
        name = os.path.join(os.fsencode(repo), b"lat\xe9.txt")
        with open(name, "wb") as f:
            f.write(b"old\n")
        run_git(repo, "add", "-A")
        run_git(repo, "commit", "-q", "-m", "second")
        with open(name, "wb") as f:
            f.write(b"new\n")
        with open(os.path.join(os.fsencode(repo), b"un\xe9tracked.txt"), "wb") as f:
            f.write(b"u\n")
        reply = yield self.request("GET", "/git/status?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            sorted(f["path"] for f in reply.json()["files"]),
            ["lat\\xe9.txt", "un\\xe9tracked.txt"],
        )
        listed = yield self.request("GET", "/files/list?path=repo")
        self.assertIn(
            "lat\\xe9.txt", [e["name"] for e in listed.json().get("entries", [])]
        )
        reply = yield self.request("GET", "/git/diff?path=repo&file=lat%E9.txt")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("+new", reply.json()["diff"])
