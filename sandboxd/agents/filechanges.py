# -*- test-case-name: tests.agents.test_agents -*-
"""
The files an agent session changed (``agents_files``): named by tool-call
diffs and locations, or written through ``fs/write_text_file``, one record
per path with the pre-image kept for a diff.
"""

from __future__ import annotations

import difflib
import io
from typing import Any

import attrs

from sandboxd.agents.state import SessionState, bounded_put
from sandboxd.policy.defaults import PRE_IMAGE_BYTES


@attrs.frozen
class Written:
    """What a served ``fs/write_text_file`` did."""

    path: str
    bytes: int
    sha256: str
    created: bool
    old_text: str | None


class FileChanges:
    """Which files the agent changed, and their diffs: the session's ``files``."""

    def __init__(self, session: SessionState) -> None:
        self.session = session

    def note_changes(self, snapshot: dict[str, Any]) -> None:
        """The paths a tool call's snapshot edits, deletes or moves."""
        for item in snapshot.get("content") or []:
            if (
                isinstance(item, dict)
                and item.get("type") == "diff"
                and isinstance(item.get("path"), str)
            ):
                change = "created" if item.get("oldText") is None else "modified"
                self.record(
                    item["path"],
                    change,
                    "diff",
                    snapshot["toolCallId"],
                    diff=(item.get("oldText"), item.get("newText")),
                )
        kind = snapshot.get("kind")
        if kind in ("edit", "delete", "move"):
            change = {"edit": "modified", "delete": "deleted", "move": "moved"}[kind]
            for location in snapshot.get("locations") or []:
                if isinstance(location, dict) and isinstance(location.get("path"), str):
                    self.record(
                        location["path"], change, "location", snapshot["toolCallId"]
                    )

    def record(
        self,
        path: str,
        change: str,
        source: str,
        tool_call_id: str | None,
        diff: tuple[Any, Any] | None = None,
        written: Written | None = None,
    ) -> None:
        """Add what ``source`` says of ``path`` to its record."""
        files = self.session.files
        record = files.get(path)
        if record is None:
            record = {
                "path": path,
                "change": change,
                "sources": [],
                "tool_call_ids": [],
                "turn_ids": [],
                "sha256": None,
                "bytes": None,
                "old_text": None,
                "new_text": None,
                "had_pre_image": False,
            }
            bounded_put(files, path, record)
        elif source != "location" or record["change"] not in ("created",):
            if not (record["change"] == "created" and change == "modified"):
                record["change"] = change
        if source not in record["sources"]:
            record["sources"].append(source)
        if tool_call_id and tool_call_id not in record["tool_call_ids"]:
            record["tool_call_ids"].append(tool_call_id)
        turn_id = self.session.current_turn_id
        if turn_id and turn_id not in record["turn_ids"]:
            record["turn_ids"].append(turn_id)
        if diff is not None and not record["had_pre_image"]:
            if record["old_text"] is None:
                record["old_text"] = diff[0]
            record["new_text"] = diff[1]
        if written is not None:
            record["sha256"] = written.sha256
            record["bytes"] = written.bytes
            if not record["had_pre_image"]:
                record["old_text"] = written.old_text
                record["had_pre_image"] = True
            record["new_text"] = None

    def file_view(self, record: dict[str, Any], with_diff: bool) -> dict[str, Any]:
        """One changed file."""
        out = {
            k: record[k]
            for k in ("path", "change", "sources", "tool_call_ids", "sha256", "bytes")
        }
        if with_diff:
            new_text = record["new_text"]
            if new_text is None and "fs_write" in record["sources"]:
                try:
                    with open(record["path"], "rb") as f:
                        new_text = f.read(PRE_IMAGE_BYTES).decode("utf-8", "replace")
                except OSError:
                    new_text = ""
            out["diff"] = (
                unified_diff(record["path"], record["old_text"], new_text)
                if new_text is not None
                else None
            )
        return out


def text_lines(text: str) -> list[str]:
    """
    ``text``'s lines, each with its line end: LF, CRLF or a lone CR, the
    lines an editor numbers.  ``str.splitlines`` would also end one at a
    form feed, NEL, U+2028 and the like: a diff would then show a line cut
    in two, and a slice by line numbers other lines than the editor's.
    """
    return io.StringIO(text, newline="").readlines()


def diff_lines(text: str) -> list[str]:
    """
    ``text``'s lines as a diff holds them: ended by LF only, as git and
    ``patch`` read them (a lone CR or a U+2028 stays inside its line), the
    last one marked when it has no newline so that the next diff line does
    not run onto it.
    """
    lines = io.StringIO(text, newline="\n").readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n" + NO_FINAL_NEWLINE
    return lines


#: What ``diff`` and git write after a line the file does not end.
NO_FINAL_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(path: Any, old: Any, new: Any) -> str:
    """A unified diff of two texts (``None`` old text is a new file)."""
    old_lines = diff_lines(str(old)) if old is not None else []
    new_lines = diff_lines(str(new)) if new is not None else []
    name = str(path)
    text = "".join(
        difflib.unified_diff(
            old_lines, new_lines, "/dev/null" if old is None else f"a{name}", f"b{name}"
        )
    )
    return text[:PRE_IMAGE_BYTES]
