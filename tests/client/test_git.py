# -*- test-case-name: tests.client.test_git -*-
"""
``sandbox.git`` for the opt-in ``git`` group through the blocking and the
async client: local calls, a clone and a push against a loopback remote,
and the typed errors (``GitConflict.kind``, ``RemoteError.kind``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client import AsyncSandbox
from sandboxd.client.errors import GitConflict, RemoteError
from tests.client.base import ClientCase
from tests.git.remote import missing, run, serve_remote
from tests.git.test_remote_jobs import remote_policy


class ClientGitTests(ClientCase):
    """The git namespace against a daemon with the group on and a private remote."""

    autostart = False
    skip = missing()
    password = "client-pw-4711"

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.remote = serve_remote(self, self.password)
        self.policy = remote_policy(self.remote)
        yield self.start()

    def test_local_calls_and_conflict(self) -> Any:
        """init, add, commit, log, branches and checkout; an existing branch is GitConflict kind branch_exists."""

        def body() -> None:
            sb = self.sandbox()
            sb.git.init("repo")
            sb.files.write_text("repo/a.txt", "one\n")
            self.assertEqual(sb.git.add("repo", ["a.txt"]), ["a.txt"])
            done = sb.git.commit("repo", "first")
            self.assertEqual(done["branch"], "main")
            self.assertEqual([c["subject"] for c in sb.git.log("repo")], ["first"])
            sb.git.create_branch("repo", "feature")
            with self.assertRaises(GitConflict) as caught:
                sb.git.create_branch("repo", "feature")
            self.assertEqual(caught.exception.kind, "branch_exists")
            self.assertEqual(sb.git.checkout("repo", "feature")["branch"], "feature")
            self.assertEqual(sb.git.branches("repo")["current"], "feature")

        return self.in_thread(body)

    def test_clone_and_push_with_a_password(self) -> Any:
        """clone with {username, password}, commit, push; a wrong password is RemoteError kind auth."""
        url = self.remote.url()
        auth = {"username": self.remote.username, "password": self.password}

        def body() -> None:
            sb = self.sandbox()
            done = sb.git.clone(url, "work", auth=auth, wait=30)
            self.assertEqual((done["state"], done["head"]["branch"]), ("done", "main"))
            sb.files.write_text("work/b.txt", "b\n")
            sb.git.add("work", all=True)
            sb.git.commit("work", "second")
            pushed = sb.git.push("work", auth=auth, wait=30)
            self.assertTrue(pushed["remote_verified"])
            with self.assertRaises(RemoteError) as caught:
                sb.git.fetch(
                    "work", auth={"username": "agent", "password": "nope"}, wait=30
                )
            self.assertEqual(caught.exception.kind, "auth")

        return self.in_thread(body)

    def test_async_clone_job(self) -> Any:
        """The async client starts a clone without waiting and follows the job to its end."""
        url = self.remote.url()
        auth = {"username": self.remote.username, "password": self.password}

        async def main() -> dict[str, Any]:
            async with AsyncSandbox(self.daemon.url, token=self.daemon.token) as sb:
                started = await sb.git.clone(url, "async", auth=auth, wait=0)
                job = started
                for _ in range(300):
                    job = await sb.git.job(started["job_id"])
                    if job["state"] != "running":
                        break
                    await asyncio.sleep(0.05)
                return job

        def check(job: dict[str, Any]) -> None:
            self.assertEqual(job["state"], "done", job)
            self.assertEqual(job["credential"], "inline")

        return self.in_loop(main).addCallback(check)


class ClientGitWorkflowTests(ClientCase):
    """
    What the REST API offers, through ``sandbox.git``: a merge pull and its
    conflict resolved, a rebase pull, a forced push and tags, and the local
    calls an agent needs around them (show, reset, restore, stash, remotes,
    config, branch deletion, jobs).
    """

    autostart = False
    skip = missing()

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.remote = serve_remote(self, None)
        self.policy = remote_policy(self.remote, allow_force_push=True)
        yield self.start()

    def remote_commit(self, name: str, text: str) -> None:
        """Someone else pushes a commit writing ``name`` to the remote's main."""
        seed = os.path.join(self.remote.directory, "seed-repo.git")
        with open(os.path.join(seed, name), "w") as f:
            f.write(text)
        run(seed, "add", "-A")
        run(seed, "commit", "-q", "-m", f"theirs {name}")
        run(
            seed, "push", "-q", "-f", os.path.join(self.remote.root, "repo.git"), "main"
        )

    def test_conflict_workflow(self) -> Any:
        """
        A pull with ``ff_only=False`` that conflicts is ``GitConflict``
        ``merge_conflict``; ``reset(mode="merge")`` abandons it; merged again,
        resolved with add and commit, and pushed, the answer names the
        commit pushed; a ``rebase`` pull replays a local commit.
        """
        url = self.remote.url()

        def body() -> None:
            sb = self.sandbox()
            sb.git.clone(url, "work", wait=30)
            self.remote_commit("README", "theirs\n")
            sb.files.write_text("work/README", "ours\n")
            sb.git.add("work", ["README"])
            sb.git.commit("work", "ours")
            with self.assertRaises(GitConflict) as caught:
                sb.git.pull("work", ff_only=False, wait=30)
            self.assertEqual(caught.exception.kind, "merge_conflict")
            self.assertEqual(sb.git.reset("work", mode="merge")["mode"], "merge")
            self.assertEqual(sb.files.read_text("work/README"), "ours\n")
            with self.assertRaises(GitConflict):
                sb.git.pull("work", ff_only=False, wait=30)
            sb.files.write_text("work/README", "both\n")
            sb.git.add("work", ["README"])
            merged = sb.git.commit("work", "merged")
            pushed = sb.git.push("work", wait=30)
            self.assertEqual(pushed["updated"][0]["new"], merged["commit"])
            self.assertEqual(len(sb.git.show("work")["parents"]), 2)
            self.remote_commit("theirs.txt", "t\n")
            sb.files.write_text("work/mine.txt", "m\n")
            sb.git.add("work", ["mine.txt"])
            sb.git.commit("work", "mine")
            sb.git.pull("work", rebase=True, wait=30)
            subjects = [c["subject"] for c in sb.git.log("work", max=2)]
            self.assertEqual(subjects, ["mine", "theirs theirs.txt"])

        return self.in_thread(body)

    def test_force_push_tags_and_local_calls(self) -> Any:
        """
        ``push(force=True)`` replaces the remote's branch, ``tags=True``
        sends an annotated tag; show, amend, restore, stash, remotes,
        config, log by file, branch deletion and the job list work.
        """
        url = self.remote.url()
        bare = os.path.join(self.remote.root, "repo.git")

        def body() -> None:
            sb = self.sandbox()
            sb.git.clone(url, "work", wait=30, single_branch=True)
            work = os.path.join(self.base_dir, "work")
            sb.files.write_text("work/a.txt", "a\n")
            sb.git.add("work", ["a.txt"])
            first = sb.git.commit("work", "a")
            sb.git.push("work", wait=30)
            amended = sb.git.commit("work", "a, amended", amend=True)
            self.assertNotEqual(amended["commit"], first["commit"])
            with self.assertRaises(GitConflict):
                sb.git.push("work", wait=30)
            run(work, "tag", "-a", "v1", "-m", "v1")
            sb.git.push("work", force=True, tags=True, wait=30)
            self.assertEqual(run(bare, "rev-parse", "main").strip(), amended["commit"])
            self.assertIn("refs/tags/v1", run(bare, "show-ref"))
            self.assertIn("+a", sb.git.show("work", "HEAD")["diff"])
            self.assertEqual(
                [c["subject"] for c in sb.git.log("work", file="a.txt")], ["a, amended"]
            )
            sb.files.write_text("work/a.txt", "changed\n")
            sb.git.restore("work", ["a.txt"])
            self.assertEqual(sb.files.read_text("work/a.txt"), "a\n")
            sb.files.write_text("work/a.txt", "stashed\n")
            self.assertEqual(len(sb.git.stash("work", message="wip")["stashes"]), 1)
            self.assertEqual(sb.git.stash("work", "pop")["stashes"], [])
            self.assertEqual(sb.files.read_text("work/a.txt"), "stashed\n")
            sb.git.add_remote("work", "mirror", "https://example.com/r.git")
            self.assertEqual(
                sorted(r["name"] for r in sb.git.remotes("work")), ["mirror", "origin"]
            )
            sb.git.set_config("work", "user.name", "Bo")
            self.assertEqual(sb.git.config("work", "user.name"), {"user.name": "Bo"})
            sb.git.create_branch("work", "gone")
            self.assertTrue(sb.git.delete_branch("work", "gone")["deleted"])
            self.assertEqual(
                sorted((j["op"], j["state"]) for j in sb.git.jobs()),
                [
                    ("clone", "done"),
                    ("push", "done"),
                    ("push", "done"),
                    ("push", "error"),
                ],
            )

        return self.in_thread(body)
