"""
The ``git`` group's local calls (SPEC §24) against a real daemon and real
repositories in a temporary base dir: init, add, commit, log, show,
branches, checkout, reset, restore, stash, remotes and config, with the
policy's protected branches, hard-reset switch and config keys, and no
repository hook ever run.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, cast

from twisted.internet.defer import Deferred, DeferredList, DeferredLock, inlineCallbacks
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd import processes
from sandboxd.git import runner
from sandboxd.processes.run import RunResult
from sandboxd.routes.git import _ListCut, _listed
from tests.git.remote import run as git
from tests.helpers import DaemonTestCase

GIT = {
    "groups": {"git": True},
    "git": {"author": {"name": "Ada", "email": "ada@example.com"}},
}
NO_GIT = shutil.which("git") is None


class GitLocalTests(DaemonTestCase):
    """A repository made, changed and read through the group's endpoints."""

    policy = {
        **GIT,
        "endpoints": {"group:git": {"params": {"protected_branches": ["release/*"]}}},
    }
    skip = "git is not installed" if NO_GIT else None

    def write(self, name: str, text: str) -> None:
        path = os.path.join(self.base_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    @inlineCallbacks
    def init_repo(self) -> Any:
        reply = yield self.request("POST", "/git/init", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        self.write("repo/a.txt", "one\n")
        reply = yield self.request(
            "POST", "/git/add", {"path": "repo", "files": ["a.txt"]}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["staged"], ["a.txt"])
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "first"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def test_init_add_commit_log_show(self) -> Any:
        """A commit made through the API is in git's log with the policy's author and its diff."""
        first = yield self.init_repo()
        self.assertEqual(first["branch"], "main")
        self.assertEqual(first["summary"]["files_changed"], 1)
        self.assertEqual(
            git(os.path.join(self.base_dir, "repo"), "rev-parse", "HEAD").strip(),
            first["commit"],
        )
        reply = yield self.request("GET", "/git/log?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        commits = reply.json()["commits"]
        self.assertEqual([c["subject"] for c in commits], ["first"])
        self.assertEqual(commits[0]["author"]["name"], "Ada")
        reply = yield self.request("GET", "/git/show?path=repo&rev=HEAD")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("+one", reply.json()["diff"])

    @inlineCallbacks
    def test_log_of_messages_holding_separators(self) -> Any:
        """
        A commit message holding the ASCII record and unit separators (and a
        line separator) is one commit in the log and in show, its subject and
        body whole, and the commits around it keep theirs.
        """
        yield self.init_repo()
        message = "sub\x1eject\x1fx\u2028y\n\nbody\x1e\x1fend\x1e"
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "repo", "message": message, "allow_empty": True},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "repo", "message": "third", "allow_empty": True},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("GET", "/git/log?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        commits = reply.json()["commits"]
        self.assertEqual(
            [(c["subject"], c["body"]) for c in commits],
            [
                ("third", ""),
                ("sub\x1eject\x1fx\u2028y", "body\x1e\x1fend\x1e"),
                ("first", ""),
            ],
        )
        self.assertEqual([c["author"]["name"] for c in commits], ["Ada", "Ada", "Ada"])
        self.assertEqual(commits[1]["parents"], [commits[2]["commit"]])
        reply = yield self.request(
            "GET", f"/git/show?path=repo&rev={commits[1]['commit']}"
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["subject"], "sub\x1eject\x1fx\u2028y")
        self.assertEqual(reply.json()["body"], "body\x1e\x1fend\x1e")

    @inlineCallbacks
    def test_branches_checkout_conflicts(self) -> Any:
        """Branches are created and listed; a dirty checkout and an existing name are 409 with kind."""
        yield self.init_repo()
        reply = yield self.request(
            "POST", "/git/branches", {"path": "repo", "name": "feature"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/git/branches", {"path": "repo", "name": "feature"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "git_conflict")
        self.assertEqual(reply.json()["kind"], "branch_exists")
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "feature"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["branch"], "feature")
        self.write("repo/a.txt", "two\n")
        yield self.request("POST", "/git/add", {"path": "repo", "all": True})
        yield self.request("POST", "/git/commit", {"path": "repo", "message": "second"})
        self.write("repo/a.txt", "dirty\n")
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "main"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "dirty_tree")
        reply = yield self.request("GET", "/git/branches?path=repo")
        body = reply.json()
        self.assertEqual(body["current"], "feature")
        self.assertEqual(
            sorted(b["name"] for b in body["branches"]), ["feature", "main"]
        )

    @inlineCallbacks
    def test_checkout_names_commits_left_behind(self) -> Any:
        """
        A checkout away from a detached HEAD names the commits made there
        that no ref holds (git's warning), newest first; none otherwise.
        """
        first = yield self.init_repo()
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": first["commit"]}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotIn("left_behind", reply.json())
        made = []
        for n in range(2):
            reply = yield self.request(
                "POST",
                "/git/commit",
                {"path": "repo", "message": f"adrift {n}", "allow_empty": True},
            )
            self.assertEqual(reply.json()["branch"], None)
            made.append(reply.json()["commit"])
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "main"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["left_behind"], made[::-1])
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "main"}
        )
        self.assertNotIn("left_behind", reply.json())

    @inlineCallbacks
    def test_protected_branch(self) -> Any:
        """A commit on a protected branch is 403 protected_branch, and nothing is committed."""
        yield self.init_repo()
        reply = yield self.request(
            "POST",
            "/git/branches",
            {"path": "repo", "name": "release/1", "checkout": True},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "x", "allow_empty": True}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "protected_branch")
        self.assertEqual(
            len(git(os.path.join(self.base_dir, "repo"), "log", "--format=%H").split()),
            1,
        )

    @inlineCallbacks
    def test_hostile_hooks_never_run(self) -> Any:
        """A repository's hooks (in .git/hooks or a core.hooksPath it names) never run."""
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        marker = os.path.join(self.base_dir, "pwned")
        for hooks in (os.path.join(repo, ".git", "hooks"), os.path.join(repo, "evil")):
            os.makedirs(hooks, exist_ok=True)
            for name in ("pre-commit", "commit-msg", "post-commit", "post-checkout"):
                path = os.path.join(hooks, name)
                with open(path, "w") as f:
                    f.write(f"#!/bin/sh\ntouch {marker}\n")
                os.chmod(path, 0o755)
        git(repo, "config", "core.hooksPath", os.path.join(repo, "evil"))
        git(repo, "config", "core.fsmonitor", f"touch {marker}")
        self.write("repo/b.txt", "b\n")
        yield self.request("POST", "/git/add", {"path": "repo", "all": True})
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "hooks?"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "other", "create": True}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(os.path.exists(marker))

    @inlineCallbacks
    def test_reset_restore_stash(self) -> Any:
        """restore, stash push/list/pop and a soft reset do what git does."""
        yield self.init_repo()
        self.write("repo/a.txt", "changed\n")
        reply = yield self.request(
            "POST", "/git/restore", {"path": "repo", "files": ["a.txt"]}
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "repo", "a.txt")) as f:
            self.assertEqual(f.read(), "one\n")
        self.write("repo/a.txt", "stashed\n")
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "push", "message": "wip"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(len(reply.json()["stashes"]), 1)
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stashes"], [])
        with open(os.path.join(self.base_dir, "repo", "a.txt")) as f:
            self.assertEqual(f.read(), "stashed\n")
        reply = yield self.request(
            "POST", "/git/reset", {"path": "repo", "mode": "mixed"}
        )
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_stash_takes_untracked_files(self) -> Any:
        """
        A stash takes the untracked files with the changes, as its
        ``--include-untracked`` says: the work tree is clean after the
        push (git's own status), and the pop brings both back.
        """
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        self.write("repo/a.txt", "changed\n")
        self.write("repo/new/u.txt", "untracked\n")
        self.write("repo/[x]*.txt", "a name with glob characters\n")
        reply = yield self.request("POST", "/git/stash", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            git(repo, "status", "--porcelain", "--untracked-files=all"), ""
        )
        self.assertFalse(os.path.exists(os.path.join(repo, "new")))
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["stashes"], [])
        for name, text in [
            ("a.txt", "changed\n"),
            ("new/u.txt", "untracked\n"),
            ("[x]*.txt", "a name with glob characters\n"),
        ]:
            with open(os.path.join(repo, name)) as f:
                self.assertEqual(f.read(), text, name)

    @inlineCallbacks
    def test_refused_pop_leaves_nothing(self) -> Any:
        """
        A pop git refuses (a local change to a file the stash changes) is
        409 and leaves the work tree as it was: git restores the stash's
        untracked files before it refuses, and those are removed again, so
        the pop works once the local change is out of the way.
        """
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        self.write("repo/a.txt", "stashed\n")
        self.write("repo/new/u.txt", "untracked\n")
        reply = yield self.request("POST", "/git/stash", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        self.write("repo/a.txt", "a local change\n")
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "git_conflict")
        self.assertFalse(os.path.exists(os.path.join(repo, "new")))
        self.assertEqual(git(repo, "status", "--porcelain"), " M a.txt\n")
        self.assertEqual(len(git(repo, "stash", "list").splitlines()), 1)
        self.write("repo/a.txt", "one\n")
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(repo, "new", "u.txt")) as f:
            self.assertEqual(f.read(), "untracked\n")

    @inlineCallbacks
    def test_conflicted_pop_left_to_resolve(self) -> Any:
        """
        A pop that stops in a conflict is 409 and leaves the conflict for
        the caller to resolve, as git does: the markers in the file, the
        path unmerged, the stash kept.
        """
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        self.write("repo/a.txt", "stashed\n")
        reply = yield self.request("POST", "/git/stash", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        self.write("repo/a.txt", "committed\n")
        git(repo, "commit", "-qam", "second")
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        with open(os.path.join(repo, "a.txt")) as f:
            self.assertIn("<<<<<<<", f.read())
        self.assertEqual(git(repo, "status", "--porcelain"), "UU a.txt\n")
        self.assertEqual(len(git(repo, "stash", "list").splitlines()), 1)
        # Switching away first is a conflict to resolve, not a git error.
        git(repo, "branch", "other")
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "repo", "ref": "other"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "merge_conflict")

    @inlineCallbacks
    def test_calls_at_once_on_one_repository(self) -> Any:
        """
        Calls that write sent at once to one repository (an agent's tool
        calls in parallel) each succeed: the daemon runs them one after
        another rather than let git refuse all but one over its lock.
        """
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        for i in range(12):
            self.write(f"repo/f{i}.txt", f"{i}\n")
        replies = yield DeferredList(
            [
                self.request(
                    "POST", "/git/add", {"path": "repo", "files": [f"f{i}.txt"]}
                )
                for i in range(12)
            ]
            + [self.request("GET", "/git/log?path=repo") for _ in range(4)],
            consumeErrors=True,
        )
        for ok, reply in replies:
            self.assertTrue(ok, reply)
            self.assertEqual(reply.status, 200, reply.body)
        staged = git(repo, "diff", "--cached", "--name-only").split()
        self.assertEqual(sorted(staged), sorted(f"f{i}.txt" for i in range(12)))

    @inlineCallbacks
    def test_locked_by_another_git(self) -> Any:
        """
        A repository another git process holds (its index lock there) is
        409 ``git_conflict`` with ``kind: locked``, saying to try again.
        """
        yield self.init_repo()
        repo = os.path.join(self.base_dir, "repo")
        self.write("repo/b.txt", "b\n")
        with open(os.path.join(repo, ".git", "index.lock"), "w"):
            pass
        reply = yield self.request(
            "POST", "/git/add", {"path": "repo", "files": ["b.txt"]}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "locked")
        self.assertIn("try again", reply.json()["error"])

    @inlineCallbacks
    def test_config_keys(self) -> Any:
        """Allowed keys are set and read; a key that can run code is 403 param_not_allowed."""
        yield self.init_repo()
        reply = yield self.request(
            "POST", "/git/config", {"path": "repo", "key": "user.name", "value": "Bo"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("GET", "/git/config?path=repo&key=user.name")
        self.assertEqual(reply.json()["values"], {"user.name": "Bo"})
        reply = yield self.request(
            "POST",
            "/git/config",
            {"path": "repo", "key": "core.sshCommand", "value": "sh"},
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "param_not_allowed")

    @inlineCallbacks
    def test_not_a_repository(self) -> Any:
        """A directory that is no repository, or no directory at all, is 404."""
        os.mkdir(os.path.join(self.base_dir, "plain"))
        reply = yield self.request("GET", "/git/log?path=plain")
        self.assertEqual(reply.status, 404, reply.body)
        reply = yield self.request("GET", "/git/branches?path=missing")
        self.assertEqual(reply.status, 404, reply.body)
        self.assertIn("no such directory", reply.json()["error"])

    @inlineCallbacks
    def test_init_answers_the_real_branch(self) -> Any:
        """
        ``git_init`` answers the branch the repository has: the one asked
        for in a new repository; an existing one's own (git keeps it and
        ignores ``initial_branch``), null when its HEAD is detached.
        """
        reply = yield self.request(
            "POST", "/git/init", {"path": "new", "initial_branch": "dev"}
        )
        self.assertEqual(reply.json()["initial_branch"], "dev", reply.body)
        old = os.path.join(self.base_dir, "old")
        os.mkdir(old)
        git(old, "init", "-q", "-b", "trunk")
        reply = yield self.request("POST", "/git/init", {"path": "old"})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["initial_branch"], "trunk")
        self.assertEqual(git(old, "symbolic-ref", "--short", "HEAD"), "trunk\n")
        git(old, "commit", "-q", "--allow-empty", "-m", "one")
        git(old, "checkout", "-q", "--detach")
        reply = yield self.request(
            "POST", "/git/init", {"path": "old", "initial_branch": "main"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIsNone(reply.json()["initial_branch"])

    @inlineCallbacks
    def test_file_named_as_the_repository(self) -> Any:
        """
        A file of a repository named as its ``path`` is 404 saying it is a
        file, not that there is no such directory.
        """
        yield self.init_repo()
        reply = yield self.request("GET", "/git/log?path=repo/a.txt")
        self.assertEqual(reply.status, 404, reply.body)
        message = reply.json()["error"]
        self.assertIn("repo/a.txt is a file, not a directory", message)
        self.assertNotIn("no such directory", message)

    @inlineCallbacks
    def test_remote_forms_refused(self) -> Any:
        """file://, ext::, local paths and git:// remotes are 403 url_not_allowed; userinfo is 400."""
        yield self.init_repo()
        for url in (
            "file:///etc",
            "ext::sh -c touch% /tmp/x",
            "/srv/repo",
            "git://example.com/r",
            "ssh://h/r",
        ):
            reply = yield self.request(
                "POST", "/git/remotes", {"path": "repo", "name": "x", "url": url}
            )
            self.assertEqual(reply.status, 403, (url, reply.body))
            self.assertEqual(reply.json()["code"], "url_not_allowed")
        reply = yield self.request(
            "POST",
            "/git/remotes",
            {"path": "repo", "name": "x", "url": "https://u:p@example.com/r"},
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertNotIn("u:p", reply.body.decode())
        reply = yield self.request(
            "POST",
            "/git/remotes",
            {"path": "repo", "name": "origin", "url": "https://example.com/r.git"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("GET", "/git/remotes?path=repo")
        self.assertEqual(
            reply.json()["remotes"][0]["fetch_url"], "https://example.com/r.git"
        )


class HardResetPolicyTests(DaemonTestCase):
    """``params.allow_hard_reset: false`` refuses a hard reset."""

    policy = {
        **GIT,
        "endpoints": {"git_reset": {"params": {"allow_hard_reset": False}}},
    }
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_hard_reset_refused(self) -> Any:
        """mode hard is 403 param_not_allowed naming the rule."""
        repo = os.path.join(self.base_dir, "r")
        os.mkdir(repo)
        git(repo, "init", "-q")
        reply = yield self.request("POST", "/git/reset", {"path": "r", "mode": "hard"})
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["rule"], "policy:endpoints.git_reset")


class GitOffByDefaultTests(DaemonTestCase):
    """The group is opt-in."""

    @inlineCallbacks
    def test_off(self) -> Any:
        """Without groups.git the endpoints are 404 endpoint_disabled."""
        reply = yield self.request("POST", "/git/init", {"path": "x"})
        self.assertEqual(reply.status, 404, reply.body)
        self.assertEqual(reply.json()["code"], "endpoint_disabled")


class HardenedPresetTests(DaemonTestCase):
    """Under ``hardened`` (its deny list on the file endpoints) git still works."""

    preset = "hardened"
    policy = GIT
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_commit_and_no_hard_reset(self) -> Any:
        """init, add and commit succeed; a hard reset is refused."""
        reply = yield self.request("POST", "/git/init", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(self.base_dir, "repo", "a.txt"), "w") as f:
            f.write("a\n")
        reply = yield self.request("POST", "/git/add", {"path": "repo", "all": True})
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "m"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST", "/git/reset", {"path": "repo", "mode": "hard"}
        )
        self.assertEqual(reply.status, 403, reply.body)


class HooksAllowedTests(DaemonTestCase):
    """``params.git_hooks: true`` runs the repository's own hooks (pre-commit users expect them)."""

    policy = {**GIT, "endpoints": {"group:git": {"params": {"git_hooks": True}}}}
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_pre_commit_runs(self) -> Any:
        """The repository's pre-commit hook runs, and one that fails stops the commit."""
        repo = os.path.join(self.base_dir, "r")
        os.mkdir(repo)
        git(repo, "init", "-q")
        marker = os.path.join(self.base_dir, "ran")
        hook = os.path.join(repo, ".git", "hooks", "pre-commit")
        with open(hook, "w") as f:
            f.write(f"#!/bin/sh\ntouch {marker}\n")
        os.chmod(hook, 0o755)
        reply = yield self.request(
            "POST", "/git/commit", {"path": "r", "message": "m", "allow_empty": True}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertTrue(os.path.exists(marker))
        with open(hook, "w") as f:
            f.write("#!/bin/sh\necho refused by hook >&2\nexit 1\n")
        reply = yield self.request(
            "POST", "/git/commit", {"path": "r", "message": "m2", "allow_empty": True}
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertIn("refused by hook", reply.json()["error"])


class HostileRemoteConfigTests(DaemonTestCase):
    """A repository's own remote settings cannot take git past the remote policy."""

    policy = GIT
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_rewritten_and_local_remotes_refused(self) -> Any:
        """
        fetch and push check the URL git would use after insteadOf rewriting:
        an ext:: rewrite and a file:// remote are 403 url_not_allowed, and
        nothing runs.
        """
        repo = os.path.join(self.base_dir, "r")
        os.mkdir(repo)
        git(repo, "init", "-q")
        git(repo, "commit", "-q", "--allow-empty", "-m", "x")
        marker = os.path.join(self.base_dir, "pwned")
        git(repo, "remote", "add", "origin", "https://example.com/r.git")
        git(
            repo,
            "config",
            f"url.ext::sh -c touch% {marker}% #.insteadOf",
            "https://example.com/",
        )
        git(repo, "remote", "add", "local", "file:///srv/r.git")
        for body in (
            {"path": "r"},
            {"path": "r", "remote": "local"},
        ):
            for route in ("/git/fetch", "/git/push"):
                reply = yield self.request("POST", route, {**body, "wait": 10})
                self.assertEqual(reply.status, 403, (route, body, reply.body))
                self.assertEqual(reply.json()["code"], "url_not_allowed")
                expected = "file://" if body.get("remote") else "ext::"
                self.assertIn(expected, reply.json()["error"])
        self.assertFalse(os.path.exists(marker))
        # A second push URL would be pushed to as well: refused, checked first.
        git(repo, "remote", "add", "two", "https://example.org/a.git")
        git(
            repo,
            "remote",
            "set-url",
            "--add",
            "--push",
            "two",
            "https://example.org/a.git",
        )
        git(repo, "remote", "set-url", "--add", "--push", "two", "file:///srv/b.git")
        reply = yield self.request("POST", "/git/push", {"path": "r", "remote": "two"})
        self.assertEqual(reply.status, 403, reply.body)
        git(repo, "remote", "set-url", "--delete", "--push", "two", "file:///srv/b.git")
        git(
            repo,
            "remote",
            "set-url",
            "--add",
            "--push",
            "two",
            "https://example.org/c.git",
        )
        reply = yield self.request("POST", "/git/push", {"path": "r", "remote": "two"})
        self.assertEqual(reply.status, 400, reply.body)
        self.assertIn("2 URLs", reply.json()["error"])


class RunAsUserTests(DaemonTestCase):
    """Local calls run git as the request's ``user``: what it writes is that user's."""

    policy = GIT
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_init_and_commit_as_nobody(self) -> Any:
        """init and commit with user nobody leave the repository and its objects owned by nobody."""
        import pwd

        if os.geteuid() != 0:
            raise SkipTest("switching users needs a root daemon")
        nobody = pwd.getpwnam("nobody").pw_uid
        os.chmod(self.base_dir, 0o777)
        os.chmod(os.path.dirname(self.base_dir), 0o755)
        reply = yield self.request("POST", "/git/init", {"path": "n", "user": "nobody"})
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "n", "message": "m", "allow_empty": True, "user": "nobody"},
        )
        self.assertEqual(reply.status, 200, reply.body)
        head = os.path.join(self.base_dir, "n", ".git", "refs", "heads", "main")
        self.assertEqual(os.stat(head).st_uid, nobody)
        reply = yield self.request("GET", "/git/log?path=n&user=nobody")
        self.assertEqual(len(reply.json()["commits"]), 1)


class HomeIdentityTests(DaemonTestCase):
    """
    With no author in the call or the policy, a commit is made as the
    repository's ``user.*``, completed from its user's ``~/.gitconfig``;
    nothing else of that file reaches git.
    """

    policy = {"groups": {"git": True}}
    skip = "git is not installed" if NO_GIT else None

    def home(self, config: str | None) -> str:
        """A home directory for git's user, with ``config`` as its ``.gitconfig``."""
        home = os.path.realpath(self.mktemp())
        os.makedirs(home)
        if config is not None:
            with open(os.path.join(home, ".gitconfig"), "w") as f:
                f.write(config)
        self.patch(runner, "BOOT_ENVIRON", {**runner.BOOT_ENVIRON, "HOME": home})
        return home

    @inlineCallbacks
    def commit(self, **fields: Any) -> Any:
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "repo", "message": "m", "allow_empty": True, **fields},
        )
        return reply

    @inlineCallbacks
    def last_author(self) -> Any:
        reply = yield self.request("GET", "/git/log?path=repo&max=1")
        self.assertEqual(reply.status, 200, reply.body)
        commit = reply.json()["commits"][0]
        return commit["author"]["name"], commit["author"]["email"]

    @inlineCallbacks
    def test_global_identity(self) -> Any:
        """
        ``git config --global user.*`` names the commit; the repository's own
        ``user.name`` wins over it; the call's ``author`` over both; a hook
        path and an fsmonitor in the same file never run.
        """
        marker = os.path.join(self.base_dir, "ran")
        hooks = os.path.join(self.base_dir, "hooks")
        os.makedirs(hooks)
        for name in ("pre-commit", "fsmonitor"):
            script = os.path.join(hooks, name)
            with open(script, "w") as f:
                f.write(f"#!/bin/sh\necho {name} >> {marker}\nexit 1\n")
            os.chmod(script, 0o755)
        self.home(
            "[user]\n\tname = Grace Hopper\n\temail = grace@example.com\n"
            f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = {hooks}/fsmonitor\n"
        )
        reply = yield self.request("POST", "/git/init", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.commit()
        self.assertEqual(reply.status, 200, reply.body)
        author = yield self.last_author()
        self.assertEqual(author, ("Grace Hopper", "grace@example.com"))
        self.assertFalse(os.path.exists(marker))

        reply = yield self.request(
            "POST", "/git/config", {"path": "repo", "key": "user.name", "value": "Bo"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.commit()
        self.assertEqual(reply.status, 200, reply.body)
        author = yield self.last_author()
        self.assertEqual(author, ("Bo", "grace@example.com"))

        reply = yield self.commit(author={"name": "Ada", "email": "ada@example.com"})
        self.assertEqual(reply.status, 200, reply.body)
        author = yield self.last_author()
        self.assertEqual(author, ("Ada", "ada@example.com"))
        self.assertFalse(os.path.exists(marker))

    @inlineCallbacks
    def test_no_identity_anywhere(self) -> Any:
        """With none anywhere the commit is 400 ``git_error`` saying where to give one."""
        self.home("[core]\n\tquotePath = false\n")
        reply = yield self.request("POST", "/git/init", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.commit()
        self.assertEqual(reply.status, 400, reply.body)
        self.assertEqual(reply.json()["code"], "git_error")
        self.assertIn("global git configuration", reply.json()["error"])


class GitDeniedPathTests(DaemonTestCase):
    """
    The policy's denied paths hold for the files a git call names, where
    git takes them: relative to the directory the call names, which may be
    below the repository's top.
    """

    policy = {
        **GIT,
        "endpoints": {"group:git": {"paths": {"deny": ["repo/sub/secret/**"]}}},
    }
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_top_swapped_for_a_link(self) -> Any:
        """
        A call named below the repository's top lists the top's files in
        the top it opened: with the repository renamed away and a link to
        a clean one put in its place just before that listing, ``git_add``
        of everything still finds the denied file and stages nothing.
        """
        repo = os.path.join(self.base_dir, "repo")
        os.makedirs(os.path.join(repo, "sub", "secret"))
        git(repo, "init", "-q", "-b", "main")
        with open(os.path.join(repo, "sub", "secret", "key"), "w") as f:
            f.write("key\n")
        clean = os.path.realpath(self.mktemp())
        os.makedirs(os.path.join(clean, "sub"))
        git(clean, "init", "-q", "-b", "main")
        real = processes.run_collect

        def swap_then_run(reactor: Any, argv: list[str], **kwargs: Any) -> Any:
            if "ls-files" in argv and not os.path.islink(repo):
                os.rename(repo, repo + ".moved")
                os.symlink(clean, repo)
            return real(reactor, argv, **kwargs)

        self.patch(processes, "run_collect", swap_then_run)
        reply = yield self.request(
            "POST", "/git/add", {"path": "repo/sub", "all": True}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "path_denied")
        self.assertEqual(git(repo + ".moved", "diff", "--cached", "--name-only"), "")

    @inlineCallbacks
    def test_files_named_from_below_the_top(self) -> Any:
        """
        Restore, add, commit, reset and log naming ``secret/k.txt`` from
        ``repo/sub`` are 403 ``path_denied``, and the file keeps its edit;
        the same call on an allowed file works.
        """
        repo = os.path.join(self.base_dir, "repo")
        for name in ("sub/secret/k.txt", "sub/open.txt", "secret/k.txt"):
            os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
            with open(os.path.join(repo, name), "w") as f:
                f.write("committed\n")
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "one")
        for name in ("sub/secret/k.txt", "sub/open.txt"):
            with open(os.path.join(repo, name), "w") as f:
                f.write("an edit\n")
        sub = "repo/sub"
        calls = [
            ("POST", "/git/restore", {"path": sub, "files": ["secret/k.txt"]}),
            ("POST", "/git/add", {"path": sub, "files": ["secret/k.txt"]}),
            (
                "POST",
                "/git/commit",
                {"path": sub, "message": "m", "files": ["secret/k.txt"]},
            ),
            ("POST", "/git/reset", {"path": sub, "files": ["secret/k.txt"]}),
            ("GET", "/git/log?path=repo/sub&file=secret/k.txt", None),
        ]
        for method, route, body in calls:
            reply = yield self.request(method, route, body)
            self.assertEqual(reply.status, 403, (route, reply.body))
            self.assertEqual(reply.json()["code"], "path_denied", route)
        with open(os.path.join(repo, "sub/secret/k.txt")) as f:
            self.assertEqual(f.read(), "an edit\n")
        self.assertEqual(git(repo, "log", "--format=%s"), "one\n")
        reply = yield self.request(
            "POST", "/git/restore", {"path": sub, "files": ["open.txt"]}
        )
        self.assertEqual(reply.status, 200, reply.body)
        with open(os.path.join(repo, "sub/open.txt")) as f:
            self.assertEqual(f.read(), "committed\n")


class GitDeniedParentTests(DaemonTestCase):
    """
    A denied file never takes part in a call that names a parent of it
    (``files: ["."]``, ``all``): no stage, no commit, no diff of it shown.
    """

    policy = {
        **GIT,
        "endpoints": {"group:git": {"paths": {"deny": ["**/secret/**"]}}},
    }
    skip = "git is not installed" if NO_GIT else None

    def setUp(self) -> Any:
        started = super().setUp()
        self.repo = os.path.join(self.base_dir, "repo")
        self.write("secret/key.txt", "FIRST-SECRET\n")
        self.write("open.txt", "committed\n")
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "one")
        return started

    def write(self, name: str, text: str) -> None:
        path = os.path.join(self.repo, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def staged(self) -> str:
        return git(self.repo, "diff", "--cached", "--name-only")

    @inlineCallbacks
    def test_add_and_commit_of_a_parent(self) -> Any:
        """
        ``git_add`` of ``.`` or ``all`` while a denied file has changes (or
        is new) is 403 ``path_denied`` naming it, and nothing is staged; a
        commit of ``.`` likewise; naming the allowed file works.
        """
        self.write("secret/key.txt", "TOPSECRET\n")
        self.write("secret/new.txt", "NEW-SECRET\n")
        self.write("open.txt", "open edit\n")
        calls = [
            ("/git/add", {"path": "repo", "files": ["."]}),
            ("/git/add", {"path": "repo", "all": True}),
            ("/git/add", {"path": "repo/secret", "files": ["."]}),
            ("/git/commit", {"path": "repo", "message": "m", "files": ["."]}),
        ]
        for route, body in calls:
            reply = yield self.request("POST", route, body)
            self.assertNotIn(b"TOPSECRET", reply.body)
            self.assertEqual(reply.status, 403, (body, reply.body))
            self.assertEqual(reply.json()["code"], "path_denied", body)
            self.assertIn("secret", reply.json()["error"])
            self.assertEqual(self.staged(), "")
        self.assertEqual(git(self.repo, "log", "--format=%s"), "one\n")
        reply = yield self.request(
            "POST", "/git/add", {"path": "repo", "files": ["open.txt"]}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["staged"], ["open.txt"])
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "two"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        # Staged by someone else: the commit refuses to take it.
        git(self.repo, "add", "secret/key.txt")
        reply = yield self.request(
            "POST", "/git/commit", {"path": "repo", "message": "three"}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "path_denied")
        self.assertEqual(git(self.repo, "log", "--format=%s"), "two\none\n")

    @inlineCallbacks
    def test_show_withholds_denied_changes(self) -> Any:
        """
        ``git_show`` of a commit that changed a denied file (made outside
        the API) shows the other changes and names the withheld file,
        never its content.
        """
        self.write("secret/key.txt", "TOPSECRET\n")
        self.write("open.txt", "open edit\n")
        git(self.repo, "commit", "-q", "-am", "both")
        reply = yield self.request("GET", "/git/show?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotIn(b"TOPSECRET", reply.body)
        self.assertIn("+open edit", reply.json()["diff"])
        self.assertEqual(reply.json()["withheld"], ["secret/key.txt"])
        reply = yield self.request("GET", "/git/show?path=repo&rev=HEAD~1")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertNotIn(b"FIRST-SECRET", reply.body)
        self.assertIn("+committed", reply.json()["diff"])


class RepositoryElsewhereTests(DaemonTestCase):
    """
    A repository in the base dir whose git dir sends git to another
    directory (``commondir``, ``objects/info/alternates``, a linked object
    directory) is refused when that directory lies outside, as a ``.git``
    file naming one is: 403 ``path_not_allowed``, and the other repository
    is left as it was.
    """

    policy = GIT
    skip = "git is not installed" if NO_GIT else None

    def setUp(self) -> Any:
        started = super().setUp()
        self.outside = os.path.realpath(self.mktemp())
        os.makedirs(self.outside)
        git(self.outside, "init", "-q", "-b", "main")
        git(self.outside, "commit", "-q", "--allow-empty", "-m", "outside")
        self.repo = os.path.join(self.base_dir, "repo")
        os.makedirs(self.repo)
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "commit", "-q", "--allow-empty", "-m", "inside")
        return started

    def outside_refs(self) -> str:
        return git(self.outside, "for-each-ref", "--format=%(refname) %(objectname)")

    @inlineCallbacks
    def assert_refused(self) -> Any:
        refs = self.outside_refs()
        calls = [
            ("GET", "/git/log?path=repo", None),
            ("GET", "/git/branches?path=repo", None),
            ("POST", "/git/branches", {"path": "repo", "name": "pwned"}),
            (
                "POST",
                "/git/commit",
                {"path": "repo", "message": "m", "allow_empty": True},
            ),
            ("DELETE", "/git/branches?path=repo&name=main&force=true", None),
        ]
        for method, route, body in calls:
            reply = yield self.request(method, route, body)
            self.assertEqual(reply.status, 403, (route, reply.body))
            self.assertEqual(reply.json()["code"], "path_not_allowed", route)
            self.assertEqual(reply.json()["rule"], "guard:base_dir", route)
        self.assertEqual(self.outside_refs(), refs)

    @inlineCallbacks
    def test_commondir_outside(self) -> Any:
        """``.git/commondir`` naming a repository outside: every call is refused."""
        with open(os.path.join(self.repo, ".git", "commondir"), "w") as f:
            f.write(os.path.join(self.outside, ".git") + "\n")
        os.unlink(os.path.join(self.repo, ".git", "index"))
        yield self.assert_refused()

    @inlineCallbacks
    def test_objects_linked_outside(self) -> Any:
        """``.git/objects`` as a link to another repository's objects is refused."""
        objects = os.path.join(self.repo, ".git", "objects")
        shutil.rmtree(objects)
        os.symlink(os.path.join(self.outside, ".git", "objects"), objects)
        yield self.assert_refused()

    @inlineCallbacks
    def test_alternates_outside(self) -> Any:
        """
        ``objects/info/alternates`` naming another repository's objects (by
        a relative path too) is refused, so no commit of it can be shown;
        an alternate inside the base dir is used.
        """
        alternates = os.path.join(self.repo, ".git", "objects", "info", "alternates")
        theirs = git(self.outside, "rev-parse", "HEAD").strip()
        target = os.path.join(self.outside, ".git", "objects")
        # A relative alternate is taken from the object directory.
        objects = os.path.join(self.repo, ".git", "objects")
        for named in (target, os.path.relpath(target, objects)):
            with open(alternates, "w") as f:
                f.write(named + "\n")
            reply = yield self.request("GET", f"/git/show?path=repo&rev={theirs}")
            self.assertEqual(reply.status, 403, reply.body)
            self.assertEqual(reply.json()["code"], "path_not_allowed")
            yield self.assert_refused()
        mine = os.path.join(self.base_dir, "mine")
        git(self.base_dir, "clone", "-q", "--shared", self.repo, mine)
        os.unlink(alternates)
        reply = yield self.request("GET", "/git/log?path=mine")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual([c["subject"] for c in reply.json()["commits"]], ["inside"])

    @inlineCallbacks
    def test_repository_swapped_for_a_link(self) -> Any:
        """
        The repository's directory renamed away and a link to another
        repository put in its place after the call checked it, just before
        git starts: the commit still lands in the directory that was
        checked (under its new name), never in the other repository.
        """
        refs = self.outside_refs()
        real = processes.run_collect
        swapped: list[bool] = []

        def swap_then_run(reactor: Any, argv: list[str], **kwargs: Any) -> Any:
            if "commit" in argv and not swapped:
                swapped.append(True)
                os.rename(self.repo, self.repo + ".moved")
                os.symlink(self.outside, self.repo)
            return real(reactor, argv, **kwargs)

        self.patch(processes, "run_collect", swap_then_run)
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "repo", "message": "written inside", "allow_empty": True},
        )
        self.assertTrue(swapped)
        self.assertEqual(self.outside_refs(), refs)
        self.assertEqual(reply.status, 200, reply.body)
        subjects = git(self.repo + ".moved", "log", "--format=%s").split()
        self.assertEqual(subjects[0], "written")

    @inlineCallbacks
    def test_init_target_swapped_for_a_link(self) -> Any:
        """
        A link to an empty directory outside put at a new repository's
        path after the check, just before git starts: nothing is made
        outside; the call is 409 ``file_exists`` and leaves nothing.
        """
        empty = os.path.realpath(self.mktemp())
        os.makedirs(empty)
        target = os.path.join(self.base_dir, "fresh")
        real = processes.run_collect

        def swap_then_run(reactor: Any, argv: list[str], **kwargs: Any) -> Any:
            if "init" in argv and not os.path.lexists(target):
                os.symlink(empty, target)
            return real(reactor, argv, **kwargs)

        self.patch(processes, "run_collect", swap_then_run)
        reply = yield self.request("POST", "/git/init", {"path": "fresh"})
        self.assertEqual(os.listdir(empty), [])
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "file_exists")
        self.assertEqual(sorted(os.listdir(self.base_dir)), ["fresh", "repo"])


class HostileConfigTests(DaemonTestCase):
    """
    Programs a repository's configuration names for git to run on the
    group's local calls (diff drivers, merge drivers, signature checkers)
    never run: each points at a script that leaves a marker.
    """

    policy = GIT
    skip = "git is not installed" if NO_GIT else None

    def setUp(self) -> Any:
        started = super().setUp()
        self.repo = os.path.join(self.base_dir, "repo")
        os.makedirs(self.repo)
        git(self.repo, "init", "-q", "-b", "main")
        self.marker = os.path.join(self.base_dir, "PWNED")
        self.script = os.path.join(self.base_dir, "evil.sh")
        with open(self.script, "w") as f:
            f.write(f'#!/bin/sh\necho "$0 $*" >> {self.marker}\ncat "$1"\n')
        os.chmod(self.script, 0o755)
        return started

    def write(self, name: str, text: str) -> None:
        with open(os.path.join(self.repo, name), "w") as f:
            f.write(text)

    def commit_all(self, message: str) -> None:
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", message)

    def assert_nothing_ran(self) -> None:
        self.assertFalse(os.path.exists(self.marker), "a repository's program ran")

    def test_script_leaves_a_marker(self) -> None:
        """The script does leave its marker when run (so its absence means something)."""
        git(self.repo, "config", "diff.evil.textconv", self.script)
        self.write(".gitattributes", "*.txt diff=evil\n")
        self.write("a.txt", "one\n")
        self.commit_all("one")
        git(self.repo, "show", "HEAD")
        self.assertTrue(os.path.exists(self.marker))

    @inlineCallbacks
    def test_diff_drivers(self) -> Any:
        """
        ``diff.NAME.textconv``, ``diff.NAME.command`` and ``diff.external``
        run on neither ``git_show`` nor ``git_commit``; the diff shown is
        git's own.
        """
        for key in ("diff.evil.textconv", "diff.evil.command", "diff.external"):
            git(self.repo, "config", key, self.script)
        self.write(".gitattributes", "*.txt diff=evil\n")
        self.write("a.txt", "one\n")
        self.commit_all("one")
        self.write("a.txt", "two\n")
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "repo", "message": "two", "files": ["a.txt"]},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["summary"]["insertions"], 1)
        for rev in ("HEAD", "HEAD~1"):
            reply = yield self.request("GET", f"/git/show?path=repo&rev={rev}")
            self.assertEqual(reply.status, 200, reply.body)
        self.assertIn("+one", reply.json()["diff"])
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_merge_driver(self) -> Any:
        """
        A ``merge.NAME.driver`` is not run by a merge (a stash pop here):
        git's own text merge takes its place and leaves the conflict.
        """
        git(self.repo, "config", "merge.evil.driver", f"{self.script} %O %A %B")
        self.write(".gitattributes", "c.txt merge=evil\n")
        self.write("c.txt", "1\n2\n3\n")
        self.commit_all("base")
        self.write("c.txt", "1\nSTASHED\n3\n")
        reply = yield self.request("POST", "/git/stash", {"path": "repo"})
        self.assertEqual(reply.status, 200, reply.body)
        self.write("c.txt", "1\nCOMMITTED\n3\n")
        self.commit_all("ours")
        reply = yield self.request(
            "POST", "/git/stash", {"path": "repo", "action": "pop"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "merge_conflict")
        with open(os.path.join(self.repo, "c.txt")) as f:
            merged = f.read()
        self.assertIn("<<<<<<<", merged)
        self.assertIn("STASHED", merged)
        self.assertIn("COMMITTED", merged)
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_signature_programs(self) -> Any:
        """
        With ``log.showSignature`` and a ``gpg.program`` (of each format),
        a signed commit is logged and shown without running a program.
        """
        self.write("a.txt", "one\n")
        self.commit_all("one")
        tree = git(self.repo, "rev-parse", "HEAD^{tree}").strip()
        parent = git(self.repo, "rev-parse", "HEAD").strip()
        signed = (
            f"tree {tree}\nparent {parent}\n"
            "author A <a@example.com> 1 +0000\ncommitter A <a@example.com> 1 +0000\n"
            "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQ\n -----END PGP SIGNATURE-----\n"
            "\nsigned\n"
        )
        path = os.path.join(self.base_dir, "commit.txt")
        with open(path, "w") as f:
            f.write(signed)
        sha = git(self.repo, "hash-object", "-t", "commit", "-w", path).strip()
        git(self.repo, "update-ref", "HEAD", sha)
        git(self.repo, "config", "log.showSignature", "true")
        for key in ("gpg.program", "gpg.openpgp.program", "gpg.x509.program"):
            git(self.repo, "config", key, self.script)
        reply = yield self.request("GET", "/git/log?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["commits"][0]["subject"], "signed")
        reply = yield self.request("GET", "/git/show?path=repo")
        self.assertEqual(reply.status, 200, reply.body)
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_driver_name_with_equals(self) -> Any:
        """
        A driver whose name holds ``=`` (which git's command line cannot
        name to switch it off) makes the call 400 ``git_error`` naming the
        setting, before any git that could run it.
        """
        self.write("a.txt", "one\n")
        self.commit_all("one")
        git(self.repo, "config", "merge.a=b.driver", self.script)
        reply = yield self.request("GET", "/git/log?path=repo")
        self.assertEqual(reply.status, 400, reply.body)
        self.assertEqual(reply.json()["code"], "git_error")
        self.assertIn("merge.a=b.driver", reply.json()["error"])


class GitLockWaitTests(DaemonTestCase):
    """A writing call waits for the repository's lock no longer than its timeout."""

    policy = {**GIT, "endpoints": {"group:git": {"limits": {"timeout_seconds": 1}}}}
    skip = "git is not installed" if NO_GIT else None

    @inlineCallbacks
    def test_wait_bounded(self) -> Any:
        """
        While another call holds the repository, a writing call is 409
        ``locked`` after its timeout and has done nothing; a read answers
        at once.
        """
        repo = os.path.join(self.base_dir, "repo")
        git(self.base_dir, "init", "-q", repo)
        with open(os.path.join(repo, "a.txt"), "w") as f:
            f.write("a\n")
        git_dir = os.path.join(repo, ".git")
        # Held as another writing call would hold it.
        lock = self.daemon.context.git_locks.setdefault(git_dir, DeferredLock())
        yield lock.acquire()
        try:
            started = time.monotonic()
            reply = yield self.request(
                "POST", "/git/add", {"path": "repo", "files": ["a.txt"]}
            )
            self.assertEqual(reply.status, 409, reply.body)
            self.assertEqual(reply.json()["kind"], "locked")
            self.assertGreaterEqual(time.monotonic() - started, 1)
            self.assertEqual(git(repo, "diff", "--cached", "--name-only"), "")
            reply = yield self.request("GET", "/git/log?path=repo")
            self.assertEqual(reply.status, 200, reply.body)
        finally:
            lock.release()
        reply = yield self.request(
            "POST", "/git/add", {"path": "repo", "files": ["a.txt"]}
        )
        self.assertEqual(reply.status, 200, reply.body)


class ListingTests(SynchronousTestCase):
    """The file listings a put-back relies on, read from git's output."""

    def listed(self, result: RunResult) -> Any:
        class Call:
            async def run(self, args: list[str], check: bool = True) -> RunResult:
                return result

        return Deferred.fromCoroutine(
            _listed(cast(Any, Call()), ["ls-files", "-o", "-z"])
        )

    def test_cut_listing_is_not_the_whole_list(self) -> None:
        """
        A listing cut at the call's output bound raises rather than pass for
        the whole list (a path missing from it would be taken as untouched,
        and its last name is cut short); a refused one is None; a whole one
        is its paths.
        """

        def result(stdout: bytes, code: int = 0, cut: bool = False) -> RunResult:
            return RunResult(stdout, b"", code, False, False, cut, 0, 1.0)

        self.failureResultOf(self.listed(result(b"a.txt\0b/c.t", cut=True)), _ListCut)
        self.assertIsNone(self.successResultOf(self.listed(result(b"", 128))))
        self.assertEqual(
            self.successResultOf(self.listed(result(b"a.txt\0b/c.txt\0"))),
            [b"a.txt", b"b/c.txt"],
        )
