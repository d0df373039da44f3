"""What the endpoints of git repositories and remote jobs take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, Event, F, Schema
from sandboxd.api.fragments import (
    GAP,
    GIT_LOCAL_ERRORS,
    GIT_URL_ERRORS,
    LAST_EVENT_ID,
    QUERY_TOKEN,
    RESUME,
)

#: git (SPEC §24): the repository field and the errors every call can give.
_GIT_PATH = F("path", doc="the repository (guarded)", default=".", example="repo")


_GIT_USER = F(
    "user",
    "any",
    "run git as this user (name or uid) when the daemon is root"
    " (default params.default_user; must be allowed by params.users)",
)


_GIT_REMOTE_FIELDS = (
    F(
        "auth",
        "object",
        '{"credential": NAME} (policy git.credentials) or {"username", "password"} for this call',
    ),
    F(
        "wait",
        "number",
        "seconds to wait for the result before answering 202",
        default=0,
        minimum=0,
    ),
    F("timeout", "number", "seconds (cut to limits.timeout_seconds, 600)"),
)


_GIT_REMOTE_ERRORS = (
    *GIT_LOCAL_ERRORS,
    *GIT_URL_ERRORS,
    E(429, "too_many_jobs", "limits.max_jobs git jobs are running"),
    E(
        408,
        "idle_timeout",
        "git printed nothing for limits.idle_timeout_seconds and was stopped"
        ' (the message starts with "IdleTimeout:")',
        "TimeoutError",
    ),
    E(
        502,
        "remote_error",
        "the remote refused (body: kind auth|not_found|network|tls|rejected)",
        "GitError",
    ),
    E(503, "unavailable", "a named credential has no secret"),
)


_GIT_JOB_ANSWER = (
    F("job_id"),
    F("state", enum=("running", "done")),
    F("events_url", doc="with 202: the job's SSE stream"),
)


_GIT_JOB_NOTES = (
    "A job: 202 {job_id, state: running, events_url} unless it ends within "
    "`wait` seconds (then 200 with the result, or its error). Credentials reach "
    "git only through an askpass socket; they are never in argv, the "
    "environment, the URL, .git/config or the output."
)


SCHEMAS: dict[str, Schema] = {
    "git_clone": Schema(
        body=(
            F(
                "url",
                required=True,
                doc="https (ssh when params.git_protocols lists it), without credentials"
                " (pass auth)",
                example="https://github.com/octocat/Hello-World.git",
            ),
            F(
                "path",
                required=True,
                doc="the new directory (guarded; absent or empty)",
                example="hello",
            ),
            F("branch", doc="the branch to check out"),
            F("commit", doc="check this commit out (detached) after the clone"),
            F("depth", "integer", "a shallow clone of this many commits", minimum=1),
            F("single_branch", "boolean", default=False),
            F("filter", doc="a partial clone", enum=("blob:none", "tree:0")),
            F(
                "recurse_submodules",
                "boolean",
                "refused when true: submodule URLs escape the remote policy",
                default=False,
            ),
            *_GIT_REMOTE_FIELDS,
            F(
                "user",
                "any",
                "run git as this user (name or uid) when the daemon is root",
            ),
        ),
        response=(*_GIT_JOB_ANSWER, F("path"), F("head", "object", "{branch, commit}")),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(409, "file_exists", "path exists and is not an empty directory"),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_fetch": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", doc="the remote's name", default="origin"),
            F("refspec", doc="what to fetch (no leading '-' or '+')"),
            F("prune", "boolean", default=False),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(*_GIT_JOB_ANSWER, F("remote")),
        errors=_GIT_REMOTE_ERRORS,
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_pull": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", default="origin"),
            F("branch", doc="the remote branch (default: the upstream)"),
            F(
                "ff_only",
                "boolean",
                "refuse anything but a fast-forward (409 non_fast_forward)",
                default=True,
            ),
            F("rebase", "boolean", default=False),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(*_GIT_JOB_ANSWER, F("branch"), F("old"), F("new")),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(409, "git_conflict", "kind non_fast_forward or merge_conflict"),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_push": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("remote", default="origin"),
            F("branch", doc="the branch to push (default: the current one)"),
            F("set_upstream", "boolean", default=False),
            F(
                "force",
                "boolean",
                "--force-with-lease, only when params.allow_force_push",
                default=False,
            ),
            F(
                "tags",
                "boolean",
                "push annotated tags that point into the branch",
                default=False,
            ),
            *_GIT_REMOTE_FIELDS,
        ),
        response=(
            *_GIT_JOB_ANSWER,
            F(
                "updated",
                "array",
                "[{ref, old, new, status: ok|rejected|up_to_date, reason?}]",
                items="object",
            ),
            F(
                "remote_verified",
                "boolean",
                "the remote's ref was read back and is the pushed commit",
            ),
        ),
        errors=(
            *_GIT_REMOTE_ERRORS,
            E(403, "protected_branch", "the branch matches params.protected_branches"),
            E(403, "param_not_allowed", "force without params.allow_force_push"),
            E(409, "git_conflict", "kind non_fast_forward (with updated)"),
            E(
                502,
                "remote_error",
                "kind rejected: the remote refused (a hook); with updated, and "
                "remote_message holding what the remote said",
                "GitError",
            ),
        ),
        status=202,
        notes=_GIT_JOB_NOTES,
    ),
    "git_jobs_list": Schema(
        response=(F("jobs", "array", "job objects, see git_job_get", items="object"),)
    ),
    "git_job_get": Schema(
        response=(
            F("job_id"),
            F("op", enum=("clone", "fetch", "pull", "push")),
            F("state", enum=("running", "done", "error", "cancelled")),
            F("path"),
            F("started_at", "number"),
            F("ended_at", "number", nullable=True),
            F("progress", "object", "{phase, percent, objects, bytes}"),
            F("events_url"),
            F("credential", doc="the named credential used, or inline"),
            F("process", "object", "{pid} of git"),
            F("result", "object", "the call's result once done"),
            F("error", "object", "{code, kind, message, status} once failed"),
        ),
        errors=(E(404, "not_found", "no such job (finished jobs are kept a while)"),),
    ),
    "git_job_cancel": Schema(
        response=(F("job_id"), F("state", enum=("cancelled", "done", "error"))),
        errors=(E(404, "not_found", "no such job"),),
        notes="Answers once git and its helpers (git-remote-https) are gone.",
    ),
    "git_job_events": Schema(
        query=(*RESUME, QUERY_TOKEN),
        headers=(LAST_EVENT_ID,),
        produces="sse",
        events=(
            GAP,
            Event(
                "progress",
                "{phase, percent, objects, total, bytes} parsed from --progress",
            ),
            Event("line", "{data}: another line of git's stderr (secrets redacted)"),
            Event("exit", "{state, result?|error?}: always last"),
        ),
        errors=(E(404, "not_found", "no such job"),),
    ),
    "git_init": Schema(
        body=(
            F(
                "path",
                required=True,
                doc="the repository directory (created)",
                example="repo",
            ),
            _GIT_USER,
            F("initial_branch", default="main"),
            F("bare", "boolean", default=False),
        ),
        response=(
            F("path"),
            F(
                "initial_branch",
                doc="the repository's branch: an existing repository keeps its own"
                " (null when its HEAD is detached)",
            ),
            F("bare", "boolean"),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_add": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F(
                "files",
                "array",
                "paths in the work tree (literal, guarded)",
                items="string",
            ),
            F(
                "all",
                "boolean",
                "stage every change (git add -A); 403 path_denied, staging"
                " nothing, when a change (as for a directory in files) is under"
                " paths.deny",
                default=False,
            ),
        ),
        response=(F("staged", "array", items="string"),),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_commit": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("message", required=True, min_length=1, example="Fix the parser"),
            F(
                "author",
                "object",
                "{name, email} (default: policy git.author, then the repo's, then its user's git config)",
            ),
            F("allow_empty", "boolean", default=False),
            F("amend", "boolean", default=False),
            F("files", "array", "commit only these paths", items="string"),
            F("signoff", "boolean", default=False),
        ),
        response=(
            F("commit"),
            F("branch", nullable=True),
            F("summary", "object", "{files_changed, insertions, deletions}"),
        ),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(403, "protected_branch", "HEAD is on a protected branch"),
        ),
    ),
    "git_log": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("ref", default="HEAD"),
            F("max", "integer", default=50, minimum=1, maximum=1000),
            F("file", doc="only commits touching this path"),
        ),
        response=(
            F(
                "commits",
                "array",
                "[{commit, parents, author: {name, email, time}, committer, subject, body}]",
                items="object",
            ),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_show": Schema(
        query=(_GIT_PATH, _GIT_USER, F("rev", default="HEAD")),
        response=(
            F("commit"),
            F("parents", "array", items="string"),
            F("author", "object"),
            F("committer", "object"),
            F("subject"),
            F("body"),
            F("diff", doc='truncated at 1 MB with "... (truncated at 1MB)"'),
            F("truncated", "boolean"),
            F(
                "withheld",
                "array",
                "files the commit changed that paths.deny refuses: their changes"
                " are left out of diff (present only when there are some)",
                items="string",
            ),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_branches": Schema(
        query=(_GIT_PATH, _GIT_USER),
        response=(
            F("current", nullable=True),
            F("detached", "boolean"),
            F(
                "branches",
                "array",
                "[{name, commit, upstream, ahead, behind, remote, current}]",
                items="object",
            ),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_branch_create": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="feature"),
            F("start_point", doc="a commit or branch (default HEAD)"),
            F("checkout", "boolean", default=False),
        ),
        response=(F("name"), F("commit")),
        errors=(*GIT_LOCAL_ERRORS, E(409, "git_conflict", "kind branch_exists")),
    ),
    "git_branch_delete": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="feature"),
            F("force", "boolean", "delete even if not merged", default=False),
        ),
        response=(F("name"), F("deleted", "boolean")),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(403, "protected_branch", "the branch matches params.protected_branches"),
            E(409, "git_conflict", "kind not_merged or current_branch"),
        ),
    ),
    "git_checkout": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("ref", required=True, min_length=1, example="main"),
            F(
                "create",
                "boolean",
                "create the branch ref (checkout -b)",
                default=False,
            ),
            F("force", "boolean", "throw away local changes", default=False),
        ),
        response=(
            F("branch", nullable=True),
            F("commit"),
            F("detached", "boolean"),
            F(
                "left_behind",
                "array",
                "the commits of the detached HEAD checked out from that no branch, "
                "tag or remote branch holds, newest first (at most 100; absent "
                "when none): make a branch at the first to keep them",
                items="string",
            ),
        ),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(
                409,
                "git_conflict",
                "kind dirty_tree, branch_exists, or merge_conflict (a merge is"
                " left to resolve)",
            ),
        ),
    ),
    "git_reset": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("mode", default="mixed", enum=("soft", "mixed", "hard", "merge", "keep")),
            F("target", default="HEAD"),
            F("files", "array", "unstage these paths only", items="string"),
        ),
        response=(F("mode"), F("branch", nullable=True), F("commit")),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "mode hard without params.allow_hard_reset"),
        ),
    ),
    "git_restore": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F(
                "files",
                "array",
                required=True,
                items="string",
                min_items=1,
                example=["a.txt"],
            ),
            F("staged", "boolean", default=False),
            F("worktree", "boolean", "default: true unless staged"),
            F("source", doc="restore from this commit"),
        ),
        response=(
            F("restored", "array", items="string"),
            F("staged", "boolean"),
            F("worktree", "boolean"),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_stash": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("action", default="push", enum=("push", "pop", "list", "drop")),
            F("message", doc="for push"),
            F(
                "index",
                "integer",
                "for pop and drop: stash@{index}",
                default=0,
                minimum=0,
            ),
        ),
        response=(
            F("action"),
            F("stashes", "array", "[{ref, commit, message}]", items="object"),
        ),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(409, "git_conflict", "kind no_local_changes, merge_conflict"),
        ),
    ),
    "git_remotes": Schema(
        query=(_GIT_PATH, _GIT_USER),
        response=(
            F(
                "remotes",
                "array",
                "[{name, fetch_url, push_url}] (userinfo and token-like query values masked)",
                items="object",
            ),
        ),
        errors=GIT_LOCAL_ERRORS,
    ),
    "git_remote_add": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("name", required=True, min_length=1, example="origin"),
            F(
                "url",
                required=True,
                doc="https (ssh when params.git_protocols lists it), without credentials",
                example="https://github.com/octocat/Hello-World.git",
            ),
        ),
        response=(F("name"), F("fetch_url")),
        errors=(*GIT_LOCAL_ERRORS, *GIT_URL_ERRORS),
    ),
    "git_config_get": Schema(
        query=(
            _GIT_PATH,
            _GIT_USER,
            F("key", doc="one of params.git_config_keys (default: all of them)"),
        ),
        response=(F("values", "object", "key: value or null"),),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "a key outside params.git_config_keys"),
        ),
    ),
    "git_config_set": Schema(
        body=(
            _GIT_PATH,
            _GIT_USER,
            F("key", required=True, min_length=1, example="user.name"),
            F("value", required=True, min_length=1, example="Ada"),
        ),
        response=(F("key"), F("value")),
        errors=(
            *GIT_LOCAL_ERRORS,
            E(403, "param_not_allowed", "a key outside params.git_config_keys"),
        ),
        notes="Local scope only; keys that can run code (core.sshCommand, *.helper, alias.*) are never allowed.",
    ),
}
