"""What the endpoints of the developer tools take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema
from sandboxd.api.fragments import CHILD, GUARD

SCHEMAS: dict[str, Schema] = {
    "code_run": Schema(
        body=(
            F(
                "language",
                doc="in any case",
                enum=("python", "node", "bash"),
                default="python",
                example="python",
            ),
            F("code", required=True, example="print(6 * 7)"),
            F("timeout", "number", "seconds", default=30),
            *CHILD,
        ),
        response=(
            F("stdout"),
            F("stderr"),
            F("exit_code", "integer"),
            F("language"),
            F("execution_time_ms", "number"),
        ),
        errors=(
            E(400, "invalid_param", "bad language, code, cwd, env or timeout"),
            E(403, "language_not_allowed", "language outside params.languages"),
            *GUARD[1:],
            E(
                408,
                "timeout",
                "past timeout: the group was killed (body: stdout and stderr "
                "printed until then)",
                "TimeoutError",
            ),
            E(
                408,
                "idle_timeout",
                "no output for idle_timeout seconds: the group was killed (body: "
                "stdout and stderr printed until then)",
                "TimeoutError",
            ),
            E(
                413,
                "payload_too_large",
                "code over 131071 bytes, 128 KiB less one: the most one argument "
                "of a program holds, its NUL counted (upload a file, use /shell)",
            ),
            E(500, "internal", "the runtime is missing", "FileNotFoundError"),
        ),
    ),
    "git_status": Schema(
        query=(F("path", doc="the repository", default=".", example="."),),
        response=(
            F("branch"),
            F("clean", "boolean"),
            F("ahead", "integer"),
            F("behind", "integer"),
            F(
                "files",
                "array",
                "[{path, status: modified|added|deleted|renamed|untracked|"
                "copied|unmerged}]; a name that is not UTF-8 shows each such "
                "byte as \\xNN, as files_list does",
                items="object",
            ),
            F(
                "hidden",
                "integer",
                "changed files paths.deny refuses, left out of files (absent when none)",
            ),
            F(
                "in_progress",
                "string",
                "merge|rebase|cherry_pick|revert|bisect: an operation stopped "
                "half way (on a conflict), which the next commit concludes or "
                "continues (absent when none)",
            ),
        ),
        errors=(
            *GUARD,
            E(400, "invalid_path", ".. or NUL in path or file"),
            E(400, "git_error", "git failed (not a repository ...)", "GitError"),
            E(408, "timeout", "git ran past its limit", "TimeoutError"),
            E(500, "internal", "git is not installed", "FileNotFoundError"),
        ),
        notes="git runs with repository-configured commands disabled (fsmonitor, "
        "external diff, textconv, hooks).",
    ),
    "git_diff": Schema(
        query=(
            F("path", doc="the repository", default=".", example="."),
            F("staged", "boolean", default=False),
            F(
                "file",
                doc="limit the diff to one file, or a directory (required while "
                "paths.deny rules apply; a directory holding a changed denied "
                "file is then refused); a name that is not UTF-8 by its bytes "
                "percent-encoded (%E9)",
            ),
        ),
        response=(
            F("diff", doc='truncated at 1 MB with "... (truncated at 1MB)"'),
            F("stats", "object", "{files_changed, insertions, deletions}"),
        ),
        errors=(
            *GUARD,
            E(400, "invalid_path", ".. or NUL in path or file"),
            E(
                403,
                "path_denied",
                "while paths.deny rules apply: no file, or a file whose diff "
                "shows the changes of a denied file (a directory holding one)",
            ),
            E(400, "git_error", "git failed (not a repository ...)", "GitError"),
            E(408, "timeout", "git ran past its limit", "TimeoutError"),
            E(500, "internal", "git is not installed", "FileNotFoundError"),
        ),
    ),
}
