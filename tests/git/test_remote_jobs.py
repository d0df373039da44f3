"""
The ``git`` group's remote calls (SPEC §24) against a real daemon and a
loopback ``git http-backend`` over TLS with a test CA: clones, fetches,
pulls and pushes as jobs with parsed, resumable progress; a named
credential that no process, file or audit line ever shows; a wrong
password; refused remote forms; non-fast-forward and protected pushes;
a cancel that leaves no ``git-remote-https`` behind.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import time
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd import processes
from sandboxd.git import runner
from sandboxd.git.askpass import descends_from
from sandboxd.git.jobs import GitJob
from tests.git.remote import LoopbackRemote, missing, run, serve_remote
from tests.helpers import DaemonTestCase

SKIP = missing()


def remote_policy(
    remote: LoopbackRemote,
    token_file: str | None = None,
    limits: dict[str, Any] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """A policy with the git group on, the test CA, and loopback allowed explicitly."""
    git: dict[str, Any] = {
        "ca_file": remote.ca,
        "author": {"name": "Ada", "email": "ada@example.com"},
    }
    if token_file:
        git["credentials"] = {
            "test": {
                "token_file": token_file,
                "username": remote.username,
                "url_prefix": remote.url(""),
            },
            "elsewhere": {
                "token_file": token_file,
                "username": "x",
                "url_prefix": "https://example.com/org/",
            },
        }
    return {
        "groups": {"git": True},
        "git": git,
        "endpoints": {
            "group:git": {
                "audit": "all",
                "params": {"block_private_networks": False, **params},
                "limits": limits or {},
            }
        },
    }


def scan_for(secret: bytes, stop: list[bool]) -> list[str]:
    """Read every process's cmdline and environ until told to stop; where the secret was seen."""
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while not stop[0] and time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            for name in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as f:
                        if secret in f.read():
                            seen.append(f"/proc/{pid}/{name}")
                except OSError:
                    pass
        time.sleep(0.01)
    return seen


def files_holding(root: str, secret: bytes) -> list[str]:
    """Every file under ``root`` whose bytes hold the secret."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    if secret in f.read():
                        found.append(path)
            except OSError:
                pass
    return found


def remote_helpers(root_pid: int) -> list[int]:
    """Live ``git-remote-http*`` processes below ``root_pid``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.startswith("git-remote-http") and descends_from(int(pid), root_pid):
            out.append(int(pid))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class RemoteCase(DaemonTestCase):
    """A daemon started after its loopback remote exists."""

    autostart = False
    timeout = 60
    password: str | None = None
    params: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    skip = SKIP

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        self.remote = serve_remote(self, self.password)
        self.token_file = os.path.join(self.remote.directory, "token")
        with open(self.token_file, "w") as f:
            f.write((self.password or "unused") + "\n")
        self.policy = remote_policy(
            self.remote, self.token_file, self.limits, **self.params
        )
        if self.paths:
            self.policy["endpoints"]["group:git"]["paths"] = self.paths
        yield self.start()

    @inlineCallbacks
    def job_done(self, job_id: str) -> Any:
        """Poll the job until it ends; its description."""
        for _ in range(600):
            reply = yield self.request("GET", f"/git/jobs/{job_id}")
            body = reply.json()
            if body["state"] != "running":
                return body
            yield deferLater(reactor, 0.05, lambda: None)
        self.fail("the job did not end")


class OpenRemoteTests(RemoteCase):
    """Clone, commit and push against a remote that needs no password."""

    params = {"protected_branches": ["release/*"]}

    @inlineCallbacks
    def clone(self) -> Any:
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "work", "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        return reply.json()

    @inlineCallbacks
    def test_clone_waits_for_the_result(self) -> Any:
        """A clone within wait answers 200 with the head; the files are there and .git/config has the plain URL."""
        body = yield self.clone()
        self.assertEqual(body["state"], "done")
        self.assertEqual(body["head"]["branch"], "main")
        with open(os.path.join(self.base_dir, "work", "README")) as f:
            self.assertEqual(f.read(), "hello\n")
        reply = yield self.request("GET", "/git/remotes?path=work")
        self.assertEqual(reply.json()["remotes"][0]["fetch_url"], self.remote.url())

    @inlineCallbacks
    def test_bad_wait_or_timeout_starts_no_job(self) -> Any:
        """
        A clone, fetch, pull or push whose ``wait`` or ``timeout`` is not a
        number is 400 before any job starts (a bad ``wait`` used to be
        refused after the job had started, found by the endpoint sweep).
        """
        yield self.clone()
        cases = [
            ("/git/clone", {"url": self.remote.url(), "path": "w3"}),
            ("/git/fetch", {"path": "work"}),
            ("/git/pull", {"path": "work"}),
            ("/git/push", {"path": "work"}),
        ]
        for route, body in cases:
            for bad in ({"wait": "soon"}, {"timeout": "never"}):
                reply = yield self.request("POST", route, {**body, **bad})
                self.assertEqual(
                    (reply.status, reply.json()["code"]),
                    (400, "invalid_param"),
                    (route, bad, reply.body),
                )
        jobs = yield self.request("GET", "/git/jobs")
        self.assertEqual([j["op"] for j in jobs.json()["jobs"]], ["clone"])
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "w3")))

    @inlineCallbacks
    def test_clone_job_progress_resumes(self) -> Any:
        """Without wait a clone is 202; its events hold parsed progress and end with exit, and resume after an id."""
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "w2"}
        )
        self.assertEqual(reply.status, 202, reply.body)
        job_id = reply.json()["job_id"]
        done = yield self.job_done(job_id)
        self.assertEqual(done["state"], "done", done)
        reply = yield self.request("GET", f"/git/jobs/{job_id}/events")
        frames = [f for f in reply.body.decode().split("\n\n") if f.startswith("id:")]
        events = [(int(f.split("\n")[0][3:]), f.split("\n")[1][7:]) for f in frames]
        self.assertIn("progress", [name for _, name in events])
        self.assertEqual(events[-1][1], "exit")
        second = events[1][0]
        reply = yield self.request(
            "GET", f"/git/jobs/{job_id}/events", headers={"Last-Event-ID": str(second)}
        )
        again = [f for f in reply.body.decode().split("\n\n") if f.startswith("id:")]
        self.assertEqual(len(again), len(events) - 2)
        listed = yield self.request("GET", "/git/jobs")
        self.assertIn(job_id, [j["job_id"] for j in listed.json()["jobs"]])

    @inlineCallbacks
    def test_push_then_non_fast_forward(self) -> Any:
        """A push reports each ref and reads it back; after the remote moves on, a push is 409 non_fast_forward."""
        yield self.clone()
        with open(os.path.join(self.base_dir, "work", "new.txt"), "w") as f:
            f.write("new\n")
        yield self.request("POST", "/git/add", {"path": "work", "all": True})
        reply = yield self.request(
            "POST", "/git/commit", {"path": "work", "message": "mine"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("POST", "/git/push", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        body = reply.json()
        self.assertEqual(body["updated"][0]["ref"], "refs/heads/main")
        self.assertEqual(body["updated"][0]["status"], "ok")
        # Both commits in full: the remote's before, and the one pushed.
        work = os.path.join(self.base_dir, "work")
        self.assertEqual(
            (body["updated"][0]["old"], body["updated"][0]["new"]),
            (
                run(work, "rev-parse", "HEAD~1").strip(),
                run(work, "rev-parse", "HEAD").strip(),
            ),
        )
        self.assertTrue(body["remote_verified"])
        # Someone else pushes first.
        seed = os.path.join(self.remote.directory, "seed-repo.git")
        run(seed, "commit", "-q", "--allow-empty", "-m", "theirs")
        run(
            seed, "push", "-q", "-f", os.path.join(self.remote.root, "repo.git"), "main"
        )
        reply = yield self.request(
            "POST",
            "/git/commit",
            {"path": "work", "message": "again", "allow_empty": True},
        )
        reply = yield self.request("POST", "/git/push", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "non_fast_forward")
        self.assertEqual(reply.json()["updated"][0]["status"], "rejected")
        self.assertEqual(
            reply.json()["updated"][0]["new"], run(work, "rev-parse", "HEAD").strip()
        )
        # ... and the remote's commit it was refused over, not null (which
        # would say the branch is new there).
        self.assertEqual(
            reply.json()["updated"][0]["old"], run(seed, "rev-parse", "HEAD").strip()
        )
        # git's reason in words, not porcelain's last line ("Done").
        self.assertIn(
            "refs/heads/main was rejected (fetch first)", reply.json()["error"]
        )
        self.assertIn("pull first", reply.json()["error"])
        reply = yield self.request(
            "POST", "/git/push", {"path": "work", "force": True, "wait": 30}
        )
        self.assertEqual(reply.status, 403, reply.body)
        # fetch and a fast-forward-only pull that cannot fast-forward
        reply = yield self.request("POST", "/git/fetch", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("POST", "/git/pull", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "non_fast_forward")

    def remote_commits(self, files: dict[str, str], message: str) -> None:
        """Someone else pushes a commit writing ``files`` to the remote's main."""
        seed = os.path.join(self.remote.directory, "seed-repo.git")
        for name, text in files.items():
            with open(os.path.join(seed, name), "w") as f:
                f.write(text)
        run(seed, "add", "-A")
        run(seed, "commit", "-q", "-m", message)
        run(seed, "push", "-q", os.path.join(self.remote.root, "repo.git"), "main")

    @inlineCallbacks
    def local_commit(self, files: dict[str, str], message: str) -> Any:
        for name, text in files.items():
            with open(os.path.join(self.base_dir, "work", name), "w") as f:
                f.write(text)
        yield self.request("POST", "/git/add", {"path": "work", "all": True})
        reply = yield self.request(
            "POST", "/git/commit", {"path": "work", "message": message}
        )
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_clone_branch_and_depth(self) -> Any:
        """
        ``branch``, ``depth`` and ``single_branch`` reach git: the clone is
        on that branch, shallow, and knows no other branch.
        """
        self.remote_commits({"two.txt": "two\n"}, "two")
        seed = os.path.join(self.remote.directory, "seed-repo.git")
        run(seed, "checkout", "-q", "-b", "feature")
        self.remote_commits({"feature.txt": "f\n"}, "feature")
        run(seed, "push", "-q", os.path.join(self.remote.root, "repo.git"), "feature")
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "shallow",
                "branch": "feature",
                "depth": 1,
                "single_branch": True,
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["head"]["branch"], "feature")
        work = os.path.join(self.base_dir, "shallow")
        self.assertEqual(run(work, "rev-parse", "--is-shallow-repository"), "true\n")
        self.assertEqual(run(work, "log", "--format=%s"), "feature\n")
        self.assertEqual(
            run(work, "branch", "-r", "--format=%(refname:short)"), "origin/feature\n"
        )

    @inlineCallbacks
    def test_pull_merge_and_rebase(self) -> Any:
        """
        A pull that merges makes its merge commit as the policy's author;
        one that rebases replays the local commit on the remote's, as that
        author too.
        """
        yield self.clone()
        work = os.path.join(self.base_dir, "work")
        self.remote_commits({"theirs.txt": "theirs\n"}, "theirs")
        yield self.local_commit({"mine.txt": "mine\n"}, "mine")
        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "ff_only": False, "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        parents, author, committer = (
            run(work, "log", "-1", "--format=%P|%an|%cn").strip().split("|")
        )
        self.assertEqual(len(parents.split()), 2)
        self.assertEqual((author, committer), ("Ada", "Ada"))
        self.remote_commits({"theirs2.txt": "theirs\n"}, "theirs 2")
        yield self.local_commit({"mine2.txt": "mine\n"}, "mine 2")
        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "rebase": True, "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        # Both local commits replayed (the merge flattened) on the remote's.
        self.assertEqual(
            run(work, "log", "-3", "--format=%s|%cn").splitlines(),
            ["mine 2|Ada", "mine|Ada", "theirs 2|T"],
        )

    @inlineCallbacks
    def test_pull_conflicts(self) -> Any:
        """
        A rebase that stops at a conflict is aborted (no endpoint could go
        on with it): 409 ``merge_conflict``, the branch and its files as
        they were.  A merge that stops at one is left to resolve, as git
        does: the markers in the file, and a commit concludes it.
        """
        yield self.clone()
        work = os.path.join(self.base_dir, "work")
        self.remote_commits({"README": "theirs\n"}, "theirs")
        yield self.local_commit({"README": "ours\n"}, "ours")
        head = run(work, "rev-parse", "HEAD")

        def readme() -> str:
            with open(os.path.join(work, "README")) as f:
                return f.read()

        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "rebase": True, "wait": 30}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "merge_conflict")
        self.assertIn("the rebase was aborted", reply.json()["error"])
        # git's hints name commands for a rebase that is no more.
        self.assertNotIn("--continue", reply.json()["error"])
        self.assertEqual(run(work, "rev-parse", "HEAD"), head)
        self.assertEqual(run(work, "status", "--porcelain"), "")
        git_dir = os.path.join(work, ".git")
        self.assertFalse(os.path.exists(os.path.join(git_dir, "rebase-merge")))
        self.assertEqual(readme(), "ours\n")
        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "ff_only": False, "wait": 30}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "merge_conflict")
        self.assertIn("<<<<<<<", readme())
        # Abandoned with a merge reset; merged again, and concluded.
        reply = yield self.request(
            "POST", "/git/reset", {"path": "work", "mode": "merge"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(os.path.exists(os.path.join(git_dir, "MERGE_HEAD")))
        self.assertEqual(readme(), "ours\n")
        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "ff_only": False, "wait": 30}
        )
        self.assertEqual(reply.status, 409, reply.body)
        yield self.local_commit({"README": "both\n"}, "merged")
        self.assertEqual(run(work, "log", "-1", "--format=%P").count(" "), 1)

    @inlineCallbacks
    def test_push_new_branch_upstream_and_tags(self) -> Any:
        """
        A new branch pushed with ``set_upstream`` tracks the remote's (the
        branch list shows its upstream, nothing ahead); ``tags`` pushes the
        annotated tag on it, not a lightweight one.
        """
        yield self.clone()
        work = os.path.join(self.base_dir, "work")
        reply = yield self.request(
            "POST", "/git/checkout", {"path": "work", "ref": "feat", "create": True}
        )
        self.assertEqual(reply.status, 200, reply.body)
        yield self.local_commit({"feat.txt": "feat\n"}, "feat")
        run(work, "tag", "-a", "v1", "-m", "v1")
        run(work, "tag", "light")
        reply = yield self.request(
            "POST",
            "/git/push",
            {
                "path": "work",
                "branch": "feat",
                "set_upstream": True,
                "tags": True,
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        # The new branch's entry names the commit pushed, in full.
        pushed = [u for u in reply.json()["updated"] if u["ref"] == "refs/heads/feat"]
        self.assertEqual(
            [(u["old"], u["new"], u["status"]) for u in pushed],
            [(None, run(work, "rev-parse", "feat").strip(), "ok")],
        )
        tags = [u for u in reply.json()["updated"] if u["ref"] == "refs/tags/v1"]
        self.assertEqual(
            [(u["old"], u["new"]) for u in tags],
            [(None, run(work, "rev-parse", "refs/tags/v1").strip())],
        )
        # Pushed again: up to date, the remote's commit before is the same.
        reply = yield self.request(
            "POST", "/git/push", {"path": "work", "branch": "feat", "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(
            [(u["old"], u["new"], u["status"]) for u in reply.json()["updated"]],
            [(pushed[0]["new"], pushed[0]["new"], "up_to_date")],
        )
        refs = run(os.path.join(self.remote.root, "repo.git"), "show-ref")
        self.assertIn("refs/heads/feat", refs)
        self.assertIn("refs/tags/v1", refs)
        self.assertNotIn("refs/tags/light", refs)
        reply = yield self.request("GET", "/git/branches?path=work")
        self.assertEqual(reply.status, 200, reply.body)
        feat = [b for b in reply.json()["branches"] if b["name"] == "feat"]
        self.assertEqual(len(feat), 1, reply.json())
        self.assertEqual(feat[0].get("upstream"), "origin/feat", feat)
        self.assertEqual(feat[0].get("ahead"), 0, feat)

    @inlineCallbacks
    def test_push_progress_has_bytes(self) -> Any:
        """
        A push's progress tells how many bytes it wrote: the job's last
        progress and a ``writing_objects`` event carry them (git prints
        them only on its last redraw of a phase, at a percent already
        shown).
        """
        yield self.clone()
        with open(os.path.join(self.base_dir, "work", "big.bin"), "wb") as f:
            f.write(os.urandom(2 * 1024 * 1024))
        yield self.request("POST", "/git/add", {"path": "work", "all": True})
        reply = yield self.request(
            "POST", "/git/commit", {"path": "work", "message": "big"}
        )
        self.assertEqual(reply.status, 200, reply.body)
        reply = yield self.request("POST", "/git/push", {"path": "work"})
        job = yield self.job_done(reply.json()["job_id"])
        self.assertEqual(job["state"], "done", job)
        self.assertGreater(job["progress"]["bytes"] or 0, 2 * 1000 * 1000, job)
        reply = yield self.request("GET", f"/git/jobs/{job['job_id']}/events")
        writes = [
            json.loads(frame.split("data: ", 1)[1])
            for frame in reply.body.decode().split("\n\n")
            if "event: progress" in frame and "writing_objects" in frame
        ]
        self.assertTrue([w for w in writes if w["bytes"]], writes)

    @inlineCallbacks
    def test_push_refused_by_a_hook(self) -> Any:
        """
        A push the remote's hook refuses is 502 ``rejected`` whose message
        ends with git's line for the ref, not with porcelain's ``Done``,
        with the hook's words in ``remote_message`` and the refs in
        ``updated``.
        """
        yield self.clone()
        hook = os.path.join(self.remote.root, "repo.git", "hooks", "pre-receive")
        with open(hook, "w") as f:
            f.write("#!/bin/sh\necho 'no pushes today' >&2\nexit 1\n")
        os.chmod(hook, 0o755)
        yield self.local_commit({"new.txt": "new\n"}, "mine")
        reply = yield self.request("POST", "/git/push", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(reply.json()["kind"], "rejected")
        message = reply.json()["error"]
        self.assertIn("no pushes today", message)
        self.assertTrue(message.endswith("(pre-receive hook declined)"), message)
        # The remote's own words apart, the ref's outcome, no progress lines.
        self.assertEqual(reply.json()["remote_message"], "no pushes today")
        self.assertNotIn("Writing objects", message)
        self.assertEqual(
            [(u["ref"], u["status"]) for u in reply.json()["updated"]],
            [("refs/heads/main", "rejected")],
        )

    @inlineCallbacks
    def test_protected_branch_push(self) -> Any:
        """A push of a protected branch is 403 protected_branch before git runs."""
        yield self.clone()
        yield self.request(
            "POST", "/git/branches", {"path": "work", "name": "release/1"}
        )
        reply = yield self.request(
            "POST", "/git/push", {"path": "work", "branch": "release/1", "wait": 30}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "protected_branch")

    @inlineCallbacks
    def test_refused_remote_forms(self) -> Any:
        """file://, ext:: and ssh are 403 url_not_allowed; a redirect is never followed (502 rejected)."""
        for url in (
            "file:///srv/repo.git",
            "ext::sh -c id",
            "ssh://127.0.0.1/repo.git",
            "git@127.0.0.1:repo.git",
        ):
            reply = yield self.request(
                "POST", "/git/clone", {"url": url, "path": "x", "wait": 30}
            )
            self.assertEqual(reply.status, 403, (url, reply.body))
            self.assertEqual(reply.json()["code"], "url_not_allowed")
        before = self.remote.requests
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": f"https://127.0.0.1:{self.remote.port}/redirect/repo.git",
                "path": "y",
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(reply.json()["code"], "remote_error")
        self.assertEqual(reply.json()["kind"], "rejected")
        self.assertEqual(self.remote.requests, before + 1)

    @inlineCallbacks
    def test_credential_in_the_query_refused(self) -> Any:
        """
        A token in a remote URL's query is refused as userinfo is, by
        ``POST /git/remotes`` and by a clone, before anything is written;
        a remote that already holds one (written by hand) is refused by a
        fetch; no answer shows the token.
        """
        yield self.clone()
        work = os.path.join(self.base_dir, "work")
        url = self.remote.url() + "?access_token=QS3CRET"
        reply = yield self.request(
            "POST", "/git/remotes", {"path": "work", "name": "tok", "url": url}
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertIn("access_token=", reply.json()["error"])
        with open(os.path.join(work, ".git", "config")) as f:
            self.assertNotIn("QS3CRET", f.read())
        reply = yield self.request(
            "POST", "/git/clone", {"url": url, "path": "tok", "wait": 30}
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertNotIn(b"QS3CRET", reply.body)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "tok")))
        run(work, "remote", "add", "tok", url)
        reply = yield self.request(
            "POST", "/git/fetch", {"path": "work", "remote": "tok", "wait": 30}
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertNotIn(b"QS3CRET", reply.body)
        reply = yield self.request("GET", "/git/remotes?path=work")
        self.assertNotIn(b"QS3CRET", reply.body)
        self.assertIn("access_token=***", reply.body.decode())

    @inlineCallbacks
    def test_clone_into_non_empty_directory(self) -> Any:
        """A clone target that holds files is 409 file_exists."""
        os.makedirs(os.path.join(self.base_dir, "full"))
        with open(os.path.join(self.base_dir, "full", "x"), "w") as f:
            f.write("x")
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "full"}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "file_exists")

    @inlineCallbacks
    def test_ipv6_literal_remote(self) -> Any:
        """
        A remote named by an IPv6 literal is tried (here nothing listens:
        502 ``remote_error`` ``kind: network``), not refused by git over
        the daemon's own address pin.
        """
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": "https://[::1]:9/none.git", "path": "v6", "wait": 30},
        )
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(
            (reply.json()["code"], reply.json()["kind"]), ("remote_error", "network")
        )
        self.assertFalse(os.path.lexists(os.path.join(self.base_dir, "v6")))

    @inlineCallbacks
    def test_finished_job_holds_no_directory(self) -> Any:
        """
        A finished job, kept to be described, no longer holds open the
        directories its git ran in.
        """
        yield self.clone()
        work = os.path.join(self.base_dir, "work")
        reply = yield self.request("POST", "/git/fetch", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        held = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target == work or target.startswith(work + "/"):
                held.append(target)
        self.assertEqual(held, [])

    def when_git_clones(self, act: Any) -> None:
        """Run ``act`` once, just before the clone's git starts."""
        real = processes.run_collect

        def act_then_run(clock: Any, argv: list[str], **kwargs: Any) -> Any:
            if "clone" in argv:
                act()
            return real(clock, argv, **kwargs)

        self.patch(processes, "run_collect", act_then_run)

    def leftovers(self) -> list[str]:
        """The clone's own working directories still in the base dir."""
        return [n for n in os.listdir(self.base_dir) if ".clone-" in n]

    @inlineCallbacks
    def test_clone_target_swapped_for_a_link(self) -> Any:
        """
        A link to an empty directory outside the base put at the clone's
        target after the check, before git starts: nothing is written
        outside; the clone is 409 ``file_exists`` and leaves nothing.
        """
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        target = os.path.join(self.base_dir, "tgt")
        self.when_git_clones(lambda: os.symlink(outside, target))
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "tgt", "wait": 30}
        )
        self.assertEqual(os.listdir(outside), [])
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "file_exists")
        self.assertTrue(os.path.islink(target))
        self.assertEqual(self.leftovers(), [])

    @inlineCallbacks
    def test_clone_never_removes_what_another_made(self) -> Any:
        """
        A directory another call makes at the target while the clone runs
        is kept with its files (the clone is 409 ``file_exists``), and of
        two clones into one new path one wins and the other leaves it be.
        """
        notes = os.path.join(self.base_dir, "proj", "notes.txt")

        def write_notes() -> None:
            if not os.path.exists(notes):
                os.makedirs(os.path.dirname(notes), exist_ok=True)
                with open(notes, "w") as f:
                    f.write("mine\n")

        self.when_git_clones(write_notes)
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "proj", "wait": 30}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "file_exists")
        with open(notes) as f:
            self.assertEqual(f.read(), "mine\n")
        self.assertEqual(self.leftovers(), [])
        # The same into an empty directory that was there: a file written
        # into it while the clone runs stays.
        os.remove(notes)
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "proj", "wait": 30}
        )
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["code"], "file_exists")
        self.assertEqual(os.listdir(os.path.dirname(notes)), ["notes.txt"])
        self.assertEqual(self.leftovers(), [])
        self.patch(processes, "run_collect", processes.run.run_collect)
        body = {"url": self.remote.url(), "path": "twice", "wait": 30}
        replies = yield DeferredList(
            [self.request("POST", "/git/clone", body) for _ in range(2)]
        )
        statuses = sorted(r.status for _, r in replies)
        self.assertEqual(statuses, [200, 409], [r.body for _, r in replies])
        with open(os.path.join(self.base_dir, "twice", "README")) as f:
            self.assertEqual(f.read(), "hello\n")
        self.assertEqual(self.leftovers(), [])

    @inlineCallbacks
    def test_clone_of_a_commit_it_cannot_check_out(self) -> Any:
        """
        A clone whose ``commit`` cannot be checked out is an error that
        leaves no directory behind, so the retry with a good one works;
        ``commit`` takes a revision as ``git_checkout`` does.
        """
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": self.remote.url(), "path": "cm", "commit": "de" * 20, "wait": 30},
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertFalse(os.path.lexists(os.path.join(self.base_dir, "cm")))
        self.assertEqual(self.leftovers(), [])
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": self.remote.url(), "path": "cm", "commit": "HEAD~0", "wait": 30},
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.assertIsNone(reply.json()["head"]["branch"])
        # Into an empty directory that was there: it stays, empty.
        os.mkdir(os.path.join(self.base_dir, "cm2"))
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": self.remote.url(), "path": "cm2", "commit": "de" * 20, "wait": 30},
        )
        self.assertEqual(reply.status, 400, reply.body)
        self.assertEqual(os.listdir(os.path.join(self.base_dir, "cm2")), [])
        self.assertEqual(self.leftovers(), [])
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "cm2", "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)


class HostileRemoteConfigTests(RemoteCase):
    """
    Programs a clone's configuration names for git to run on a fetch,
    pull or push (merge drivers, signature checkers, remote helpers,
    credential helpers, an alternate's ref lister) never run, and no
    cookie jar is written where it says: each points at a script that
    leaves a marker.
    """

    @inlineCallbacks
    def setUp(self) -> Any:
        yield super().setUp()
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "work", "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        self.work = os.path.join(self.base_dir, "work")
        self.tools = os.path.realpath(self.mktemp())
        os.makedirs(self.tools)
        self.marker = os.path.join(self.tools, "PWNED")
        self.script = os.path.join(self.tools, "evil.sh")
        with open(self.script, "w") as f:
            f.write(f'#!/bin/sh\necho "$0 $*" >> {self.marker}\n')
        os.chmod(self.script, 0o755)

    def assert_nothing_ran(self) -> None:
        ran = ""
        if os.path.exists(self.marker):
            with open(self.marker) as f:
                ran = f.read()
        self.assertEqual(ran, "", "a repository's program ran")

    def remote_commit(self, text: str, signed: bool = False) -> None:
        """A commit writing README on the remote's main, with a signature header if ``signed``."""
        seed = os.path.join(self.remote.directory, "seed-repo.git")
        with open(os.path.join(seed, "README"), "w") as f:
            f.write(text)
        run(seed, "add", "-A")
        run(seed, "commit", "-q", "-m", "theirs")
        if signed:
            tree = run(seed, "rev-parse", "HEAD^{tree}").strip()
            parent = run(seed, "rev-parse", "HEAD~1").strip()
            body = os.path.join(self.tools, "commit.txt")
            with open(body, "w") as f:
                f.write(
                    f"tree {tree}\nparent {parent}\n"
                    "author T <t@example.com> 1 +0000\n"
                    "committer T <t@example.com> 1 +0000\n"
                    "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQ\n"
                    " -----END PGP SIGNATURE-----\n\nsigned\n"
                )
            sha = run(seed, "hash-object", "-t", "commit", "-w", body).strip()
            run(seed, "update-ref", "HEAD", sha)
        run(
            seed, "push", "-q", "-f", os.path.join(self.remote.root, "repo.git"), "main"
        )

    @inlineCallbacks
    def test_merge_driver_on_pull(self) -> Any:
        """
        A pull that merges does not run the clone's ``merge.NAME.driver``:
        git's own text merge leaves the conflict (409, markers in the file).
        """
        run(self.work, "config", "merge.evil.driver", f"{self.script} %O %A %B")
        with open(os.path.join(self.work, ".git", "info", "attributes"), "w") as f:
            f.write("README merge=evil\n")
        self.remote_commit("theirs\n")
        with open(os.path.join(self.work, "README"), "w") as f:
            f.write("ours\n")
        run(self.work, "commit", "-q", "-am", "ours")
        reply = yield self.request(
            "POST", "/git/pull", {"path": "work", "ff_only": False, "wait": 30}
        )
        # 409 although the fetch printed its progress before the merge spoke.
        self.assertEqual(reply.status, 409, reply.body)
        self.assertEqual(reply.json()["kind"], "merge_conflict")
        self.assertIn("Merge conflict in README", reply.json()["error"])
        with open(os.path.join(self.work, "README")) as f:
            self.assertIn("<<<<<<<", f.read())
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_signature_check_on_pull(self) -> Any:
        """
        ``merge.verifySignatures`` with a ``gpg.program`` runs no program
        on a pull of a signed commit; the pull is made.
        """
        run(self.work, "config", "merge.verifySignatures", "true")
        run(self.work, "config", "gpg.program", self.script)
        self.remote_commit("theirs\n", signed=True)
        reply = yield self.request("POST", "/git/pull", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(run(self.work, "log", "-1", "--format=%s"), "signed\n")
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_remote_helper_allowed_by_name(self) -> Any:
        """
        A remote helper the clone names for its remote (``remote.NAME.vcs``)
        and allows by name (``protocol.NAME.allow=always``) is not run:
        the fetch fails, as an unknown transport.
        """
        helper = os.path.join(self.tools, "git-remote-evil")
        os.symlink(self.script, helper)
        path = f"{self.tools}:{runner.BOOT_ENVIRON.get('PATH', '/usr/bin:/bin')}"
        self.patch(runner, "BOOT_ENVIRON", {**runner.BOOT_ENVIRON, "PATH": path})
        run(self.work, "config", "remote.origin.vcs", "evil")
        run(self.work, "config", "protocol.evil.allow", "always")
        reply = yield self.request("POST", "/git/fetch", {"path": "work", "wait": 30})
        self.assertNotEqual(reply.status, 200, reply.body)
        self.assert_nothing_ran()

    @inlineCallbacks
    def test_helpers_and_cookies_on_fetch(self) -> Any:
        """
        A credential helper for the remote's URL, an alternate's ref lister
        (``core.alternateRefsCommand``) and a cookie jar outside the base
        dir (``http.cookieFile`` with ``saveCookies``): the fetch works, and
        runs and writes none of them.
        """
        shared = os.path.join(self.base_dir, "shared")
        run(self.base_dir, "clone", "-q", "--shared", self.work, shared)
        run(shared, "remote", "set-url", "origin", self.remote.url())
        jar = os.path.join(self.tools, "jar")
        for key, value in (
            (f"credential.{self.remote.url('')}.helper", f"!{self.script}"),
            ("core.alternateRefsCommand", self.script),
            ("http.cookieFile", jar),
            ("http.saveCookies", "true"),
        ):
            run(shared, "config", key, value)
        self.remote_commit("theirs\n")
        reply = yield self.request("POST", "/git/fetch", {"path": "shared", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        self.assertFalse(os.path.exists(jar), "a cookie jar was written")
        self.assert_nothing_ran()


class DeniedPushTests(RemoteCase):
    """A push never sends a commit that changes a file ``paths.deny`` refuses."""

    paths = {"deny": ["**/secret/**"]}

    @inlineCallbacks
    def test_push_of_a_denied_change_refused(self) -> Any:
        """
        A branch whose unpushed commits (made outside the API) change a
        denied file is 403 ``path_denied`` naming it, and the remote is as
        it was; commits that do not are pushed.
        """
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "work", "wait": 30}
        )
        self.assertEqual(reply.status, 200, reply.body)
        work = os.path.join(self.base_dir, "work")
        bare = os.path.join(self.remote.root, "repo.git")
        with open(os.path.join(work, "open.txt"), "w") as f:
            f.write("open\n")
        run(work, "add", "open.txt")
        run(work, "commit", "-q", "-m", "open")
        reply = yield self.request("POST", "/git/push", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 200, reply.body)
        pushed = run(bare, "rev-parse", "main")
        os.makedirs(os.path.join(work, "secret"))
        with open(os.path.join(work, "secret", "key.txt"), "w") as f:
            f.write("TOPSECRET\n")
        run(work, "add", "-A")
        run(work, "commit", "-q", "-m", "secret")
        run(work, "commit", "-q", "--allow-empty", "-m", "after")
        reply = yield self.request("POST", "/git/push", {"path": "work", "wait": 30})
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "path_denied")
        self.assertIn("secret/key.txt", reply.json()["error"])
        self.assertEqual(run(bare, "rev-parse", "main"), pushed)


class JobBugTests(RemoteCase):
    """A bug in a job's own code is a 500, and a traceback in the daemon's log."""

    @inlineCallbacks
    def test_unexpected_exception_is_logged(self) -> Any:
        """
        An exception no handler expected ends the job with 500 ``internal``
        naming only its type, as before, and the daemon's log has the
        failure with its traceback, the job and its operation.
        """
        from twisted.logger import globalLogPublisher

        from sandboxd.routes import git as routes

        async def broken(call: Any) -> str | None:
            raise AttributeError("no attribute 'frobnicate'")

        self.patch(routes, "_current_branch", broken)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "w", "wait": 30}
        )
        self.assertEqual(reply.status, 500, reply.body)
        self.assertEqual(
            (reply.json()["code"], reply.json()["error"]),
            ("internal", "git job failed: AttributeError"),
        )
        failures = [e for e in events if "log_failure" in e]
        self.assertEqual(len(failures), 1, events)
        self.assertEqual(failures[0]["op"], "clone")
        self.assertEqual(failures[0]["path"], os.path.join(self.base_dir, "w"))
        trace = failures[0]["log_failure"].getTraceback()
        self.assertIn("no attribute 'frobnicate'", trace)
        self.assertIn("in broken", trace)
        self.assertEqual(len(self.flushLoggedErrors(AttributeError)), 1)


class URLCredentialTests(RemoteCase):
    """With ``allow_url_credentials``, a query token is used and never shown."""

    params = {"allow_url_credentials": True}
    audit = True

    @inlineCallbacks
    def test_query_token_never_echoed(self) -> Any:
        """
        A clone whose URL holds a query token is started; what git says
        about the URL (here, that the repository is not found) reaches the
        answer, the job's stored error and its events with the token
        masked, as in the audit line.
        """
        url = self.remote.url() + "?access_token=QS3CRET"
        reply = yield self.request(
            "POST", "/git/clone", {"url": url, "path": "tok", "wait": 30}
        )
        self.assertEqual(reply.status, 502, reply.body)
        self.assertIn("access_token=***", reply.json()["error"])
        self.assertNotIn(b"QS3CRET", reply.body)
        jobs = yield self.request("GET", "/git/jobs")
        job = jobs.json()["jobs"][0]
        self.assertIn("access_token=***", job["error"]["message"])
        self.assertNotIn(b"QS3CRET", jobs.body)
        events = yield self.request("GET", f"/git/jobs/{job['job_id']}/events")
        self.assertNotIn(b"QS3CRET", events.body)
        self.assertNotIn("QS3CRET", json.dumps(self.audit_lines()))


class PrivateRemoteTests(RemoteCase):
    """A remote behind Basic auth; the secret never shows anywhere."""

    password = "pw-" + secrets.token_hex(12)
    audit = True

    @inlineCallbacks
    def test_named_credential_never_leaks(self) -> Any:
        """
        A clone with a policy-held credential succeeds while no process's
        cmdline or environ, no file under the base dir or the state dir,
        and no audit line holds the secret.
        """
        self.remote.delay = 0.3
        secret = self.password.encode()
        stop = [False]
        scan = deferToThread(scan_for, secret, stop)
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "private",
                "auth": {"credential": "test"},
            },
        )
        self.assertEqual(reply.status, 202, reply.body)
        done = yield self.job_done(reply.json()["job_id"])
        stop[0] = True
        seen = yield scan
        self.assertEqual(done["state"], "done", done)
        self.assertEqual(done["credential"], "test")
        self.assertEqual(seen, [])
        self.assertTrue(
            os.path.exists(os.path.join(self.base_dir, "private", "README"))
        )
        self.assertEqual(files_holding(self.base_dir, secret), [])
        with open(os.path.join(self.base_dir, "private", ".git", "config")) as f:
            self.assertNotIn("@", f.read())
        lines = self.audit_lines()
        clone = [line for line in lines if line.get("endpoint") == "git_clone"]
        self.assertEqual(clone[0]["credential"], "test")
        self.assertEqual(clone[0]["remote"], self.remote.url())
        self.assertEqual(clone[0]["repo"], os.path.join(self.base_dir, "private"))
        self.assertNotIn(self.password, json.dumps(lines))

    @inlineCallbacks
    def test_wrong_password(self) -> Any:
        """A wrong inline password is 502 remote_error kind auth (never 401), and the body does not echo it."""
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "nope",
                "auth": {"username": "agent", "password": "wrong-pass-123"},
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(reply.json()["kind"], "auth")
        self.assertNotIn(b"wrong-pass-123", reply.body)

    @inlineCallbacks
    def test_inline_password(self) -> Any:
        """The right inline username and password clone the private repository."""
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "ok",
                "auth": {"username": "agent", "password": self.password},
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 200, reply.body)

    @inlineCallbacks
    def test_no_credential_and_foreign_prefix(self) -> Any:
        """Without auth git cannot log in (502 auth); a credential for another prefix is 403."""
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "a", "wait": 30}
        )
        self.assertEqual(reply.status, 502, reply.body)
        self.assertEqual(reply.json()["kind"], "auth")
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "b",
                "auth": {"credential": "elsewhere"},
            },
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "url_not_allowed")

    @inlineCallbacks
    def test_dot_segments_never_pass_a_prefix(self) -> Any:
        """
        A URL whose path holds ``..`` (or ``%2e%2e``) is not under a
        credential's prefix by its text: git would remove the segment
        before connecting.  403 ``url_not_allowed`` up front, nothing cloned.
        """
        for dots in ("x/../", "x/%2e%2e/", "./"):
            url = self.remote.url("").rstrip("/") + "/" + dots + "repo.git"
            reply = yield self.request(
                "POST",
                "/git/clone",
                {"url": url, "path": "d", "auth": {"credential": "test"}, "wait": 30},
            )
            self.assertEqual(reply.status, 403, (dots, reply.body))
            self.assertEqual(reply.json()["code"], "url_not_allowed")
            self.assertIn("'..' segments", reply.json()["error"])
            self.assertFalse(os.path.lexists(os.path.join(self.base_dir, "d")))


class CancelTests(RemoteCase):
    """A cancel ends git's whole tree; max_jobs bounds what runs."""

    limits = {"max_jobs": 1}

    @inlineCallbacks
    def test_cancel_kills_git_remote_https(self) -> Any:
        """After DELETE answers, no git-remote-https of the job is alive, the job is cancelled and the partial clone is gone."""
        self.remote.delay = 20
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "slow"}
        )
        self.assertEqual(reply.status, 202, reply.body)
        job_id = reply.json()["job_id"]
        helpers: list[int] = []
        for _ in range(200):
            job = (yield self.request("GET", f"/git/jobs/{job_id}")).json()
            pid = job.get("process", {}).get("pid")
            if pid:
                helpers = remote_helpers(pid)
                if helpers:
                    break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertTrue(helpers, "git-remote-https never started")
        reply = yield self.request("DELETE", f"/git/jobs/{job_id}")
        self.assertEqual(reply.status, 200, reply.body)
        self.assertEqual(reply.json()["state"], "cancelled")
        self.assertEqual([p for p in helpers if alive(p)], [])
        for _ in range(100):
            if not os.path.exists(os.path.join(self.base_dir, "slow")):
                break
            yield deferLater(reactor, 0.05, lambda: None)
        self.assertFalse(os.path.exists(os.path.join(self.base_dir, "slow")))

    @inlineCallbacks
    def test_max_jobs(self) -> Any:
        """With max_jobs 1, a second remote call while one runs is 429 too_many_jobs."""
        self.remote.delay = 20
        reply = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "one"}
        )
        self.assertEqual(reply.status, 202, reply.body)
        second = yield self.request(
            "POST", "/git/clone", {"url": self.remote.url(), "path": "two"}
        )
        self.assertEqual(second.status, 429, second.body)
        self.assertEqual(second.json()["code"], "too_many_jobs")
        yield self.request("DELETE", f"/git/jobs/{reply.json()['job_id']}")


class LateOutputTests(SynchronousTestCase):
    """What git writes after its job has ended is dropped, not an error."""

    def test_stderr_after_cancel(self) -> None:
        """A cancelled job's log ends with its exit event; git's last lines do not raise."""
        job = GitJob("clone", "one", "legacy", None)
        job.observe(2, b"Cloning into 'one'...\n")
        job.finish(None, None, "cancelled")
        job.observe(2, b"Receiving objects:  50% (1/2)\rerror: killed\n")
        _gap, kept = job.log.since(0)
        events = [event.event for event in kept]
        self.assertEqual(events, ["line", "exit"])
        self.assertEqual(job.state, "cancelled")


class ProgressEventTests(SynchronousTestCase):
    """Progress events from git's stderr as git writes it."""

    def test_bytes_on_the_last_redraw(self) -> None:
        """
        git redraws ``100% (3/3)`` with the byte count once it knows it,
        and writes ``509 bytes`` below 1 KiB: both reach the job's
        progress and its events, and an unchanged redraw is still dropped.
        """
        job = GitJob("push", "w", "legacy", None)
        job.observe(
            2,
            b"Writing objects:  33% (1/3)\rWriting objects:  33% (1/3)\r"
            b"Writing objects: 100% (3/3)\r"
            b"Writing objects: 100% (3/3), 28.62 MiB | 15.71 MiB/s, done.\n",
        )
        self.assertEqual(job.progress["bytes"], int(28.62 * 1024 * 1024))
        _gap, kept = job.log.since(0)
        shown = [(e.data["percent"], e.data["bytes"]) for e in kept]
        self.assertEqual(
            shown, [(33, None), (100, None), (100, int(28.62 * 1024 * 1024))]
        )
        small = GitJob("push", "w", "legacy", None)
        small.observe(
            2,
            b"Writing objects: 100% (6/6)\r"
            b"Writing objects: 100% (6/6), 509 bytes | 254.00 KiB/s, done.\n",
        )
        self.assertEqual(small.progress["bytes"], 509)


class RunAsUserTests(RemoteCase):
    """A clone as another user: git, its askpass helper and the files are that user's."""

    password = "pw-" + secrets.token_hex(12)

    @inlineCallbacks
    def setUp(self) -> Any:
        if os.geteuid() != 0:
            raise SkipTest("switching users needs a root daemon")
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            raise SkipTest("no user 'nobody'") from None
        yield super().setUp()
        # mktemp's directories are the test's own: let nobody reach the
        # base dir (to write the clone) and the CA file (to trust the remote).
        for path in (self.base_dir, self.remote.directory):
            os.chmod(path, 0o777 if path == self.base_dir else 0o755)
            os.chmod(os.path.dirname(path), 0o755)

    @inlineCallbacks
    def test_private_clone_as_nobody(self) -> Any:
        """The named credential reaches git running as nobody; the clone belongs to nobody."""
        reply = yield self.request(
            "POST",
            "/git/clone",
            {
                "url": self.remote.url(),
                "path": "mine",
                "auth": {"credential": "test"},
                "user": "nobody",
                "wait": 30,
            },
        )
        self.assertEqual(reply.status, 200, reply.body)
        nobody = pwd.getpwnam("nobody").pw_uid
        st = os.stat(os.path.join(self.base_dir, "mine", "README"))
        self.assertEqual(st.st_uid, nobody)
        # The directory the daemon made for the clone is theirs too.
        self.assertEqual(os.stat(os.path.join(self.base_dir, "mine")).st_uid, nobody)


class PrivateNetworkTests(DaemonTestCase):
    """Without an explicit policy, git refuses private addresses."""

    policy = {"groups": {"git": True}}

    @inlineCallbacks
    def test_loopback_refused_by_default(self) -> Any:
        """A loopback remote is 403 url_not_allowed unless the policy allows private networks."""
        reply = yield self.request(
            "POST", "/git/clone", {"url": "https://127.0.0.1:1/r.git", "path": "x"}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertEqual(reply.json()["code"], "url_not_allowed")

    @inlineCallbacks
    def test_name_resolving_private_refused(self) -> Any:
        """A name that resolves to 10.x is refused (the resolver is stubbed)."""
        from sandboxd.git import remotes

        self.patch(remotes, "system_resolve", lambda host, port: ["10.1.2.3"])
        reply = yield self.request(
            "POST", "/git/clone", {"url": "https://git.example.com/r.git", "path": "x"}
        )
        self.assertEqual(reply.status, 403, reply.body)
        self.assertIn("10.1.2.3", reply.json()["error"])


class OwnerTests(RemoteCase):
    """A git job is its starter's: another identity neither lists nor reaches it."""

    @inlineCallbacks
    def setUp(self) -> Any:
        self.environ = {
            "ALICE_TOKEN": "alice-token",
            "BOB_TOKEN": "bob-token",
            "ADMIN_TOKEN": "admin-token",
        }
        yield super().setUp()

    @inlineCallbacks
    def start(self, stop_at_end: bool = True, **kwargs: Any) -> Any:
        """The remote policy with three tokens: two git users and one holding ``*``."""
        git_scopes = ["git:read", "git:write", "git:remote", "files:read"]
        self.policy = dict(
            self.policy,
            auth={
                "tokens": [
                    {"id": "alice", "token_env": "ALICE_TOKEN", "scopes": git_scopes},
                    {"id": "bob", "token_env": "BOB_TOKEN", "scopes": git_scopes},
                    {"id": "admin", "token_env": "ADMIN_TOKEN", "scopes": ["*"]},
                ]
            },
        )
        daemon = yield super().start(stop_at_end, **kwargs)
        return daemon

    @inlineCallbacks
    def test_jobs_filtered_by_owner(self) -> Any:
        """
        alice's clone job is listed, read, followed and cancellable by alice
        and by a ``*`` identity; bob's list leaves it out and each of its
        routes answers bob 404 not_found, as for a job that does not exist.
        """
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": self.remote.url(), "path": "mine", "wait": 30},
            token="alice-token",
        )
        self.assertEqual(reply.status, 200, reply.body)
        job_id = reply.json()["job_id"]
        reply = yield self.request(
            "POST",
            "/git/clone",
            {"url": self.remote.url(), "path": "bobs", "wait": 30},
            token="bob-token",
        )
        self.assertEqual(reply.status, 200, reply.body)
        bobs = reply.json()["job_id"]

        def listed(token: str) -> Any:
            d = self.request("GET", "/git/jobs", token=token)
            return d.addCallback(lambda r: [j["job_id"] for j in r.json()["jobs"]])

        self.assertEqual((yield listed("alice-token")), [job_id])
        self.assertEqual((yield listed("bob-token")), [bobs])
        self.assertEqual((yield listed("admin-token")), [job_id, bobs])
        for method, path in (
            ("GET", f"/git/jobs/{job_id}"),
            ("GET", f"/git/jobs/{job_id}/events"),
            ("DELETE", f"/git/jobs/{job_id}"),
        ):
            reply = yield self.request(method, path, token="bob-token")
            self.assertEqual(
                (reply.status, reply.json()["code"]), (404, "not_found"), path
            )
            self.assertNotIn("mine", reply.body.decode())
            for owner in ("alice-token", "admin-token"):
                if method == "GET":
                    reply = yield self.request(method, path, token=owner)
                    self.assertEqual(reply.status, 200, (path, owner))
        reply = yield self.request("DELETE", f"/git/jobs/{job_id}", token="alice-token")
        self.assertEqual((reply.status, reply.json()["state"]), (200, "done"))


class SilentRemoteTests(RemoteCase):
    """A remote that accepts the connection and never says a word."""

    limits = {"idle_timeout_seconds": 2}

    @inlineCallbacks
    def test_silent_remote_ends_at_the_idle_bound(self) -> Any:
        """
        A clone from a remote that accepts and says nothing ends within a
        few seconds of ``idle_timeout_seconds`` with ``idle_timeout``, and
        no ``git-remote-https`` is left behind.
        """
        from twisted.internet.protocol import Factory, Protocol

        port = reactor.listenTCP(
            0, Factory.forProtocol(Protocol), interface="127.0.0.1"
        )
        self.addCleanup(port.stopListening)
        url = f"https://127.0.0.1:{port.getHost().port}/repo.git"
        started = time.monotonic()
        reply = yield self.request(
            "POST", "/git/clone", {"url": url, "path": "silent", "wait": 30}
        )
        elapsed = time.monotonic() - started
        self.assertEqual(reply.status, 408, reply.body)
        self.assertEqual(reply.json()["code"], "idle_timeout", reply.body)
        self.assertLess(elapsed, 10)
        self.assertEqual(remote_helpers(os.getpid()), [])
