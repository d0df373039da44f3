# -*- test-case-name: tests.git.test_outcomes -*-
"""
What git's output means to a caller (SPEC §24), as pure functions of its
bytes: the error a failure becomes (409 ``git_conflict`` with ``kind``,
502 ``remote_error`` with ``kind``, 404, 400 ``git_error``), the parsed
``--progress`` lines, ``log``, ``branch`` and ``push --porcelain``, and
the redaction every message goes through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sandboxd.access.audit import redact_url_secrets
from sandboxd.errors import (
    ApiError,
    file_exists,
    git_conflict,
    git_error,
    insufficient_storage,
    not_found,
    remote_error,
)


def redact(text: str, hidden: Iterable[str]) -> str:
    """
    ``text`` with each hidden value, every URL's userinfo and every
    token-like query value (``?access_token=``) as ``***``: what git
    says quotes the URL it was given, and an answer, a job's stored error
    and its events must not show what the audit hides.
    """
    for value in sorted((v for v in hidden if v), key=len, reverse=True):
        text = text.replace(value, "***")
    return redact_url_secrets(text)


def _last_lines(text: str, count: int = 6) -> str:
    # Lines end at LF (and CR, git's progress rewrites): not at NEL, U+2028
    # or U+2029, which a branch name or a path in the message may hold.
    lines = [line for line in text.replace("\r", "\n").split("\n") if line.strip()]
    return "\n".join(lines[-count:])[-2000:]


#: (kind, phrases) for failures that talk about the remote, first match wins.
_REMOTE_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "tls",
        (
            "ssl certificate",
            "server certificate verification failed",
            "ssl_connect",
            "certificate problem",
            "gnutls",
            "tls handshake",
        ),
    ),
    (
        "auth",
        (
            "authentication failed",
            "could not read username",
            "could not read password",
            "terminal prompts disabled",
            "requested url returned error: 401",
            "requested url returned error: 403",
            "permission denied (publickey",
            "invalid username or password",
        ),
    ),
    (
        "not_found",
        (
            "repository not found",
            "requested url returned error: 404",
            "does not appear to be a git repository",
            "couldn't find remote ref",
            "not found",
        ),
    ),
    (
        "network",
        (
            "could not resolve host",
            "failed to connect",
            "couldn't connect",
            "connection refused",
            "connection timed out",
            "operation timed out",
            "network is unreachable",
            "no route to host",
            "connection reset",
            "empty reply from server",
            "the remote end hung up unexpectedly",
            "rpc failed",
        ),
    ),
    (
        "rejected",
        (
            "remote rejected",
            "pre-receive hook declined",
            "requested url returned error: 30",
            "[rejected]",
            "protected branch",
        ),
    ),
)

#: (kind, phrases) for local conflicts a caller can act on.
_CONFLICT_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "non_fast_forward",
        (
            "non-fast-forward",
            "[rejected]",
            "updates were rejected",
            "not possible to fast-forward",
            "fetch first",
            "stale info",
        ),
    ),
    (
        "merge_conflict",
        (
            "conflict (",
            "automatic merge failed",
            "could not apply",
            # A checkout or a switch while a merge is left to resolve.
            "resolve your current index first",
            "is unmerged",
            # A pull (or a commit, a cherry-pick) while one is.
            "you have unmerged files",
        ),
    ),
    (
        "dirty_tree",
        (
            "would be overwritten",
            "please commit your changes or stash them",
            "your local changes",
            "untracked working tree files would be",
        ),
    ),
    ("branch_exists", ("already exists",)),
    ("not_merged", ("is not fully merged",)),
    ("nothing_to_commit", ("nothing to commit", "no changes added to commit")),
    ("current_branch", ("cannot delete branch", "checked out at")),
    ("no_stash", ("no stash entries found", "no local changes to save")),
)


#: How git says a write failed for want of space (its strerror of ENOSPC
#: and EDQUOT, in its messages, and what it says when its index or another
#: checksummed file cannot be written).
_NO_SPACE = ("no space left on device", "disk quota exceeded", "out of diskspace")


#: What git says when it could not write a work tree file, without saying why.
UNWRITTEN = "unable to write file"


#: git's words when another git holds the repository's lock.
_LOCKED = ".lock': file exists"

#: git's words when it has no identity for a commit it must make.
_NO_IDENTITY = ("please tell me who you are", "unable to auto-detect email address")


def classify_failure(
    text: str, exit_code: int | None, remote: bool = False, no_room: bool = False
) -> ApiError:
    """
    The error a failed git call becomes: a full disk first (507, as every
    write that did not happen), then local conflicts (a rejected push is a
    conflict the caller resolves, not a remote failure), then remote
    failures, then 404 for a path that is no repository, else 400
    ``git_error`` with git's last lines.

    :param no_room: the work tree's file system has no block left, so a
        file git says it could not write (:data:`UNWRITTEN`) met a full disk.
    """
    lowered = text.lower()
    tail = _last_lines(text) or f"git exited with {exit_code}"
    if any(p in lowered for p in _NO_SPACE) or (no_room and UNWRITTEN in lowered):
        return insufficient_storage(tail)
    if _LOCKED in lowered:
        # git's line naming the lock file: a pull's or a fetch's first line
        # is another ("From https://…").
        said = next(
            line.strip()
            for line in text.replace("\r", "\n").split("\n")
            if _LOCKED in line.lower()
        )
        return git_conflict(
            "another git process is working in this repository (git found its "
            "lock file); try again once it is done: " + said,
            "locked",
        )
    if "destination path" in lowered and "already exists" in lowered:
        # A clone whose target was made meanwhile: no branch involved.
        return file_exists(tail)
    for kind, phrases in _CONFLICT_KINDS:
        if any(p in lowered for p in phrases):
            if kind == "non_fast_forward" and "remote rejected" in lowered:
                break
            return git_conflict(tail, kind)
    if remote or "fatal: unable to access" in lowered:
        for kind, phrases in _REMOTE_KINDS:
            if any(p in lowered for p in phrases):
                if kind == "rejected" and "returned error: 30" in lowered:
                    tail = (
                        "the remote answered with a redirect, which is never followed"
                    )
                return remote_error(tail, kind)
    if "not a git repository" in lowered:
        return not_found(tail)
    if any(p in lowered for p in _NO_IDENTITY):
        return git_error(
            "git has no name and email to make the commit with: give the call an "
            "'author' {name, email} where it takes one, set git.author in the "
            "policy, or set user.name and user.email with git_config_set (or in "
            "the global git configuration of the user git runs as)"
        )
    return git_error(tail)


# -- progress ------------------------------------------------------------------

_PROGRESS = re.compile(
    r"^(?:remote:\s*)?(?P<phase>[A-Za-z][A-Za-z ]*?):\s+(?P<percent>\d{1,3})%"
    r"\s+\((?P<done>\d+)/(?P<total>\d+)\)"
    r"(?:,\s*(?P<bytes>[\d.]+\s*(?:[KMGT]i?B|bytes?)))?"
)
_COUNT = re.compile(
    r"^(?:remote:\s*)?(?P<phase>[A-Za-z][A-Za-z ]*?):\s+(?P<done>\d+)(?:,|$)"
)
_UNITS = {
    "B": 1,
    "byte": 1,
    "bytes": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


def _size(text: str | None) -> int | None:
    if not text:
        return None
    number, _, unit = text.replace(" ", "\0", 1).partition("\0")
    unit = unit.strip() or "B"
    try:
        return int(float(number) * _UNITS.get(unit, 1))
    except ValueError:
        return None


def parse_progress(line: str) -> dict[str, Any] | None:
    """
    ``{phase, percent, objects, total, bytes}`` from one ``--progress``
    line (``Receiving objects:  45% (450/1000), 1.20 MiB | 2.40 MiB/s``),
    or None for any other line.
    """
    line = line.strip()
    match = _PROGRESS.match(line)
    if match:
        return {
            "phase": match.group("phase").strip().lower().replace(" ", "_"),
            "percent": min(100, int(match.group("percent"))),
            "objects": int(match.group("done")),
            "total": int(match.group("total")),
            "bytes": _size(match.group("bytes")),
        }
    match = _COUNT.match(line)
    if match and match.group("phase").lower().endswith("objects"):
        return {
            "phase": match.group("phase").strip().lower().replace(" ", "_"),
            "percent": None,
            "objects": int(match.group("done")),
            "total": None,
            "bytes": None,
        }
    return None


class ProgressLines:
    """
    Splits git's stderr into lines at ``\\r`` and ``\\n`` (progress redraws
    end in ``\\r``), keeping a partial line for the next chunk.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.partial = b""
        self.limit = limit

    def feed(self, data: bytes) -> list[str]:
        """The complete lines in ``partial + data``."""
        data = self.partial + data
        parts = re.split(rb"[\r\n]", data)
        self.partial = parts.pop()[-self.limit :]
        return [p.decode("utf-8", "replace") for p in parts if p.strip()]


# -- log, branches, push ---------------------------------------------------------


def _lines(output: bytes) -> list[str]:
    """
    git's output in lines, ended by LF only: a branch or remote name may
    hold NEL, U+2028 or U+2029, where ``str.splitlines`` would end a line
    too and the name would be lost or cut.
    """
    return output.decode("utf-8", "replace").split("\n")


#: ``git log`` format, fields ended by NUL; with ``-z`` (:data:`LOG_ARGS`) a
#: commit ends with one too.  NUL is the one byte a commit message cannot
#: hold (git refuses it, and cuts a crafted object's message there), where
#: a message may hold any other separator.
LOG_FORMAT = "%H%x00%P%x00%an%x00%ae%x00%at%x00%cn%x00%ce%x00%ct%x00%s%x00%b"

#: The arguments that make ``git log`` write :func:`parse_log`'s input.
LOG_ARGS = ("-z", f"--format={LOG_FORMAT}")

#: Fields per commit in :data:`LOG_FORMAT`.
_LOG_FIELDS = 10


def parse_log(output: bytes) -> list[dict[str, Any]]:
    """
    The commits of ``git log`` with :data:`LOG_ARGS`: each is ten fields
    and its terminator, so a commit cut short by the output's cap is left
    out rather than read with a field missing.
    """
    fields = output.decode("utf-8", "replace").split("\x00")
    commits: list[dict[str, Any]] = []
    # A whole commit is followed by at least its terminator's empty field.
    for start in range(0, len(fields) - _LOG_FIELDS, _LOG_FIELDS):
        record = fields[start : start + _LOG_FIELDS]
        sha, parents, an, ae, at, cn, ce, ct, subject, body = record
        commits.append(
            {
                "commit": sha,
                "parents": parents.split(),
                "author": {"name": an, "email": ae, "time": int(at or 0)},
                "committer": {"name": cn, "email": ce, "time": int(ct or 0)},
                "subject": subject,
                "body": body.strip("\n"),
            }
        )
    return commits


#: ``git for-each-ref`` format for branches.
BRANCH_FORMAT = "%(refname)%1f%(objectname)%1f%(upstream:short)%1f%(upstream:track,nobracket)%1f%(HEAD)"


def parse_branches(output: bytes) -> list[dict[str, Any]]:
    """Branches from ``git for-each-ref --format=BRANCH_FORMAT refs/heads refs/remotes``."""
    out: list[dict[str, Any]] = []
    for line in _lines(output):
        fields = line.split("\x1f")
        if len(fields) < 5:
            continue
        ref, sha, upstream, track, head = fields[:5]
        remote = ref.startswith("refs/remotes/")
        name = ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")
        if remote and name.endswith("/HEAD"):
            continue
        ahead = behind = 0
        for part in track.split(","):
            word, _, number = part.strip().partition(" ")
            if word == "ahead" and number.isdigit():
                ahead = int(number)
            elif word == "behind" and number.isdigit():
                behind = int(number)
        out.append(
            {
                "name": name,
                "commit": sha,
                "upstream": upstream or None,
                "ahead": ahead,
                "behind": behind,
                "remote": remote,
                "current": head == "*",
            }
        )
    return out


_PUSH_STATUS = {
    " ": "ok",
    "+": "ok",
    "-": "ok",
    "*": "ok",
    "=": "up_to_date",
    "!": "rejected",
}


def parse_push(output: bytes) -> list[dict[str, Any]]:
    """
    Per-ref results of ``git push --porcelain``: ``FLAG\\tFROM:TO\\tSUMMARY
    (REASON)`` lines between ``To URL`` and ``Done``.
    """
    out: list[dict[str, Any]] = []
    for line in _lines(output):
        if len(line) < 3 or line[1] != "\t" or line[0] not in _PUSH_STATUS:
            continue
        flag, refs, summary = [*line.split("\t"), "", ""][:3]
        _, _, dst = refs.partition(":")
        reason = None
        if "(" in summary and summary.endswith(")"):
            summary, _, reason = summary[:-1].partition("(")
            summary = summary.strip()
        old = new = None
        for sep in ("...", ".."):
            if sep in summary:
                old, _, new = summary.partition(sep)
                break
        entry: dict[str, Any] = {
            "ref": dst or refs,
            "old": old,
            "new": new,
            "status": _PUSH_STATUS[flag],
            "forced": flag == "+",
            "summary": summary,
        }
        if reason:
            entry["reason"] = reason
        out.append(entry)
    return out


#: What git's reason for refusing a pushed ref means, and what to do
#: about it (the reasons of git-push(1), "OUTPUT").
_REJECTED_BECAUSE = {
    "fetch first": "the remote has commits this branch does not have; "
    "pull first, then push again",
    "non-fast-forward": "the branch is behind the remote's; pull first, then push again",
    "stale info": "the remote's branch moved since it was last fetched; "
    "pull first, then push again",
    "already exists": "the remote already has it, and a push does not replace it",
}


def push_rejection(updated: list[dict[str, Any]]) -> str:
    """
    The message of a push git refused without asking the remote (its
    branch moved on): each rejected ref of :func:`parse_push` with git's
    reason put into words.  git's own last line is ``Done`` (stdout of
    ``--porcelain``) or a hint cut mid-sentence, neither of which tells an
    agent to pull.
    """
    parts = []
    for entry in updated:
        if entry["status"] != "rejected" or "remote rejected" in entry["summary"]:
            continue
        reason = entry.get("reason") or "rejected"
        meaning = _REJECTED_BECAUSE.get(reason, "pull first, then push again")
        parts.append(f"the push of {entry['ref']} was rejected ({reason}): {meaning}")
    return "; ".join(parts) or "the push was rejected: pull first, then push again"


def without_progress(text: str) -> str:
    """
    ``text`` without git's progress lines (``Writing objects: 100% ...``,
    ``Total 3 (delta 0) ...``), which otherwise fill the head of an error
    message whose words are the remote's and git's.
    """
    kept = [
        line
        for line in text.replace("\r", "\n").split("\n")
        if line.strip()
        and parse_progress(line) is None
        and not line.startswith(("Total ", "remote: Total "))
        and not re.match(r"^(remote: )?[A-Za-z ]+: +\d+% \(", line)
    ]
    return "\n".join(kept)


def remote_message(text: str) -> str | None:
    """
    What the remote itself said (its ``remote:`` lines, as a hook that
    refuses a push prints them), without git's prefix and progress; None
    when it said nothing.
    """
    said = [
        line[len("remote:") :].strip()
        for line in without_progress(text).split("\n")
        if line.startswith("remote:")
    ]
    said = [line for line in said if line]
    return "\n".join(said)[-2000:] or None


def push_report(output: bytes) -> str:
    """
    ``push --porcelain``'s stdout for an error message: without the
    ``Done`` it always ends with, which would otherwise be the message's
    last line.
    """
    text = output.decode("utf-8", "replace")
    return text.removesuffix("Done\n").removesuffix("Done")


def parse_remotes(output: bytes) -> list[dict[str, Any]]:
    """``{name, fetch_url, push_url}`` from ``git remote -v`` (userinfo redacted)."""
    remotes: dict[str, dict[str, Any]] = {}
    for line in _lines(output):
        name, _, rest = line.partition("\t")
        url, _, kind = rest.rpartition(" ")
        if not name or not url:
            continue
        entry = remotes.setdefault(
            name, {"name": name, "fetch_url": None, "push_url": None}
        )
        key = "push_url" if kind == "(push)" else "fetch_url"
        entry[key] = redact(url, ())
    return list(remotes.values())
