# -*- test-case-name: tests.git.test_remote_jobs -*-
"""
Remote git calls as jobs (SPEC §24): clone, fetch, pull and push run in
the background with their progress in a SPEC §9 event log, so a client
that waits gets the result and one that does not gets a job id to follow,
and no proxy's 60 s read timeout ends a long clone.

The table bounds the jobs running at once (``limits.max_jobs``) and keeps
the last finished ones for :func:`git_job_get`.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger

from sandboxd.access.auth import Identity
from sandboxd.errors import ApiError, internal, not_found
from sandboxd.eventlog import EventLog
from sandboxd.git.outcomes import ProgressLines, parse_progress, redact
from sandboxd.policy.defaults import GIT_JOB_LOG_BYTES, GIT_JOBS_KEPT
from sandboxd.waiters import Waiters

log = Logger(namespace="sandboxd.git")


class GitJob:
    """One remote operation, running or finished."""

    def __init__(self, op: str, path: str, owner: str, credential: str | None) -> None:
        self.job_id = "gj_" + secrets.token_hex(8)
        self.op = op
        self.path = path
        self.owner = owner
        self.credential = credential
        self.state = "running"
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.progress: dict[str, Any] = {
            "phase": "starting",
            "percent": None,
            "objects": None,
            "bytes": None,
        }
        self.result: dict[str, Any] | None = None
        self.error: ApiError | None = None
        self.log = EventLog(GIT_JOB_LOG_BYTES)
        self.call: Any = None
        self.hidden: tuple[str, ...] = ()
        self.deferred: Deferred[Any] | None = None
        self._finished: Waiters[None] = Waiters()
        self._lines = ProgressLines()
        self._last: tuple[Any, Any, Any] = (None, None, None)

    @property
    def running(self) -> bool:
        """Whether the job has not ended yet."""
        return self.state == "running"

    def visible_to(self, identity: Identity) -> bool:
        """
        Whether ``identity`` may see, follow or cancel this job: the one
        that started it, a link it minted, or an identity holding ``*``,
        as for a terminal or a code context.  A job names a path, maybe a
        credential, and its progress lines; another caller is told it is
        not there.
        """
        return identity.acts_for(self.owner)

    def observe(self, fd: int, data: bytes) -> None:
        """
        git's stderr as it comes: progress events, and other lines as
        ``line``. Once the job has ended (a cancel ends it while git is
        still being stopped) its log is closed and what git still writes
        is dropped.
        """
        if fd != 2 or not self.running:
            return
        for line in self._lines.feed(data):
            progress = parse_progress(line)
            if progress is None:
                self.log.append("line", {"data": redact(line, self.hidden)})
                continue
            # git redraws a line at the same percent once it knows the
            # bytes (its last line of a phase is "100% (3/3), 28.62 MiB |
            # …, done."): a new byte count is news too.
            key = (progress["phase"], progress["percent"], progress["bytes"])
            if key == self._last and progress["percent"] is not None:
                continue
            self._last = key
            self.progress = {
                k: progress[k] for k in ("phase", "percent", "objects", "bytes")
            }
            self.log.append("progress", progress)

    def finish(
        self, result: dict[str, Any] | None, error: ApiError | None, state: str
    ) -> None:
        """Record the outcome, end the log with ``exit``, wake the waiters."""
        if not self.running:
            return
        self.state = state
        self.result = result
        self.error = error
        self.ended_at = time.time()
        self.hidden = ()
        data: dict[str, Any] = {"state": state}
        if result is not None:
            data["result"] = result
        if error is not None:
            data["error"] = error.body()
        self.log.append("exit", data)
        self.log.close()
        self._finished.fire(None)

    def ended(self) -> Deferred[None]:
        """Fires once the job has finished (at once if it has)."""
        if not self.running:
            done: Deferred[None] = Deferred()
            done.callback(None)
            return done
        return self._finished.wait()

    def wait(self, seconds: float, clock: Any) -> Deferred[None]:
        """Fires when the job ends or after ``seconds``, whichever is first."""
        d = self._finished.wait() if self.running else Deferred()
        if not self.running:
            d.callback(None)
            return d

        def expire() -> None:
            if not d.called:
                d.callback(None)

        call = clock.callLater(seconds, expire)

        def stop_timer(result: Any) -> Any:
            if call.active():
                call.cancel()
            return result

        d.addBoth(stop_timer)
        return d

    def describe(self) -> dict[str, Any]:
        """The job object of SPEC §24."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "op": self.op,
            "state": self.state,
            "path": self.path,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "progress": self.progress,
            "events_url": f"/git/jobs/{self.job_id}/events",
        }
        if self.credential:
            out["credential"] = self.credential
        child = getattr(self.call, "child", None)
        if child is not None and child.pid:
            out["process"] = {"pid": child.pid}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            body = self.error.body()
            out["error"] = {
                "code": body.get("code"),
                "kind": body.get("kind"),
                "message": body.get("error"),
                "status": self.error.status,
            }
        return out


class GitJobTable:
    """The daemon's git jobs: running ones bounded, finished ones kept a while."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.jobs: OrderedDict[str, GitJob] = OrderedDict()

    def running(self) -> int:
        """How many jobs run now."""
        return sum(1 for job in self.jobs.values() if job.running)

    def get(self, job_id: str, identity: Identity) -> GitJob:
        """The job, or 404 when there is none ``identity`` may see."""
        job = self.jobs.get(job_id)
        if job is None or not job.visible_to(identity):
            raise not_found(f"no git job {job_id!r}")
        return job

    def visible(self, identity: Identity) -> list[GitJob]:
        """The jobs ``identity`` may see, oldest first."""
        return [job for job in self.jobs.values() if job.visible_to(identity)]

    def start(
        self, job: GitJob, work: Callable[[GitJob], Awaitable[dict[str, Any]]]
    ) -> GitJob:
        """Run ``work`` as ``job``; its outcome is recorded whatever it is."""
        self.jobs[job.job_id] = job
        self._prune()

        async def run() -> None:
            try:
                result = await work(job)
            except CancelledError:
                job.finish(None, None, "cancelled")
            except ApiError as e:
                job.finish(None, e, "error")
            except Exception as e:  # a bug: the job must still end
                # The answer names only the exception's type: the operator
                # needs the traceback to find the bug.
                log.failure(
                    "git job {job_id} ({op} of {path}) failed",
                    job_id=job.job_id,
                    op=job.op,
                    path=job.path,
                )
                job.finish(
                    None, internal(f"git job failed: {type(e).__name__}"), "error"
                )
            else:
                job.finish(result, None, "done")
            finally:
                # The job is kept to be described; the directories its git
                # ran in need not stay open for that.
                release = getattr(job.call, "release", None)
                if release is not None:
                    release()

        job.deferred = Deferred.fromCoroutine(run())
        return job

    async def cancel(self, job: GitJob) -> None:
        """End a running job's whole tree and wait until it is gone."""
        if not job.running or job.deferred is None:
            return
        child = getattr(job.call, "child", None)
        ended = job.ended()
        job.deferred.cancel()
        if child is not None and child.killing is not None:
            await child.killing
        elif child is not None and not child.has_ended:
            await child.kill("cancelled")
        # The job's own clean-up (a partial clone) runs before it ends.
        await ended

    def _prune(self) -> None:
        finished = [j for j in self.jobs.values() if not j.running]
        for job in finished[: max(0, len(finished) - GIT_JOBS_KEPT)]:
            del self.jobs[job.job_id]

    def stop(self) -> None:
        """At shutdown: cancel what runs (the process table ends the trees)."""
        for job in list(self.jobs.values()):
            if job.running and job.deferred is not None:
                job.deferred.cancel()
