# -*- test-case-name: tests.client.test_git -*-
"""
``sandbox.git`` for the opt-in ``git`` group through the blocking and the
async client: local calls, a clone and a push against a loopback remote,
and the typed errors (``GitConflict.kind``, ``RemoteError.kind``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from twisted.internet.defer import inlineCallbacks

from sandboxd.client import AsyncSandbox
from sandboxd.client.errors import GitConflict, RemoteError
from tests.client.base import ClientCase
from tests.git.remote import missing, serve_remote
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
