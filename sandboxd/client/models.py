"""
The shapes of the daemon's answers (SPEC §7), as typed dictionaries.

The client returns the daemon's JSON as it came: these declarations give
it types (``entry["size"]`` is an ``int`` to a type checker) without
copying it into other objects.  Fields marked ``NotRequired`` are absent
in some answers (older daemons, optional features).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

#: ``progress(done_bytes, total_bytes_or_None)`` for uploads and downloads.
Progress = Callable[[int, int | None], None]


class Entry(TypedDict):
    """One ``files_list`` entry."""

    name: str
    path: str
    type: Literal["file", "directory", "symlink", "other"]
    size: int
    modified: str


class Listing(TypedDict):
    """``GET /files/list``."""

    entries: list[Entry]
    truncated: bool


class Stat(TypedDict):
    """``GET /files/stat`` (``exists: false`` for a missing path)."""

    name: str
    path: str
    type: str
    size: int
    permissions: str
    modified: str
    exists: bool
    etag: NotRequired[str]


class Written(TypedDict):
    """What a file write answers."""

    path: str
    bytes: int
    etag: NotRequired[str]
    sha256: NotRequired[str]
    #: True from a resumable upload (``files.upload`` of a large file).
    complete: NotRequired[bool]


class SearchResult(TypedDict):
    """``POST /files/search``."""

    results: list[dict[str, str]]
    timed_out: bool
    truncated: bool


class Edited(TypedDict):
    """``POST /files/edit``."""

    path: str
    replacements: int
    edits: list[dict[str, int]]
    bytes: int
    changed: bool
    etag: str


class GrepMatch(TypedDict):
    """One match of ``files.grep``: line and column count from 1."""

    path: str
    line: int
    #: In characters.
    column: int
    #: The line without its newline, cut at 1024 characters.
    text: str
    #: Present (True) only on a line that was cut.
    cut: NotRequired[bool]
    #: With ``context``: the lines before and after the matching line.
    before: NotRequired[list[str]]
    after: NotRequired[list[str]]


class GrepResult(TypedDict):
    """``POST /files/grep``."""

    matches: list[GrepMatch]
    files_searched: int
    files_matched: int
    files_skipped: int
    truncated: bool
    timed_out: bool


class Lines(TypedDict):
    """``files.read_lines``: some lines of a file, and where they lie."""

    path: str
    #: The lines, each with its line break, decoded as UTF-8 (bytes that are
    #: not UTF-8 shown as U+FFFD).
    text: str
    #: The first line given, from 1.
    offset: int
    #: How many lines were given.
    lines: int
    #: The file's lines.
    total_lines: int
    #: Lines follow those given.
    more: bool
    etag: str


class Extracted(TypedDict):
    """``POST /files/extract``."""

    destination: str
    files: int
    bytes: int


class ProcessInfo(TypedDict):
    """``GET /process/{pid}`` and each ``process_list`` entry."""

    pid: int
    command: str
    tag: str | None
    state: Literal["running", "exited"]
    started_at: Any
    exit_code: int | None
    #: Ended by the daemon on its timeout or idle_timeout.
    timed_out: NotRequired[bool]
    stdin: NotRequired[bool]


class OutputEvent(TypedDict):
    """One chunk of a background process's output log."""

    seq: int
    stream: Literal["stdout", "stderr"]
    data: str


class OutputPage(TypedDict):
    """``GET /process/{pid}/output`` without ``follow``."""

    pid: int
    state: str
    exit_code: int | None
    timed_out: NotRequired[bool]
    events: list[OutputEvent]
    next: int
    dropped_bytes: int


class PtyCreated(TypedDict):
    """``POST /pty/sessions``."""

    session_id: str
    ws_url: str
    pid: int


class PtySessionInfo(TypedDict):
    """
    ``GET /pty/sessions/{id}`` and each listed session; ``session_id`` is
    ``id`` again, the name :meth:`Pty.create` answers with.
    """

    id: str
    session_id: str
    pid: int
    created_at: Any
    cols: int
    rows: int
    alive: bool
    clients: int
    ws_url: str


class Decision(TypedDict):
    """``POST /capabilities/check``."""

    endpoint: str
    allowed: bool
    code: NotRequired[str]
    rule: NotRequired[str]
    reason: NotRequired[str]
    paths: NotRequired[list[dict[str, Any]]]


class CodeResult(TypedDict):
    """``POST /code/run``."""

    stdout: str
    stderr: str
    exit_code: int
    language: str
    execution_time_ms: float


class GitStatus(TypedDict):
    """``GET /git/status``."""

    branch: str | None
    clean: bool
    ahead: int
    behind: int
    files: list[dict[str, str]]


class GitDiff(TypedDict):
    """``GET /git/diff``."""

    diff: str
    stats: dict[str, int]


class LspServer(TypedDict):
    """One entry of ``GET /lsp/servers``, in order of preference."""

    id: str
    languages: list[str]
    #: The argv that starts it (where it was found, when installed).
    command: list[str]
    installed: bool
    #: Allowed by the policy's ``params.lsp_servers``.
    allowed: bool
    #: How to install it.
    install: str


class LspSession(TypedDict):
    """A language server session (``POST /lsp/sessions`` and each listed)."""

    id: str
    server: str
    languages: list[str]
    #: The project directory the server was started for.
    root: str
    state: Literal["starting", "ready", "failed", "closed"]
    pid: int | None
    user: str | None
    owner: str
    created_at: float
    idle_seconds: float
    open_documents: int
    server_info: dict[str, Any] | None
    #: How the server counts a line's characters (converted both ways).
    position_encoding: Literal["utf-16", "utf-32", "utf-8"]
    #: The server's providers (``hoverProvider`` ...).
    capabilities: list[str]
    #: Why it is not running.
    failure: str | None
    #: ``GET /lsp/sessions/{id}`` only: the server's last log messages
    #: (``{type, message}``) and the end of its standard error.
    messages: NotRequired[list[dict[str, Any]]]
    stderr: NotRequired[str]


class Span(TypedDict):
    """Where something is in a file: lines and columns from 1, in characters."""

    line: int
    column: int
    end_line: int
    end_column: int


class Diagnostic(Span):
    """One problem a language server reports in a file."""

    severity: Literal["error", "warning", "information", "hint"]
    #: The checker's own code (``E225``), if it gives one.
    code: str | int | None
    #: The checker (``pyflakes``, ``pycodestyle`` ...).
    source: str | None
    message: str


class Diagnostics(TypedDict):
    """``POST /lsp/diagnostics``."""

    session_id: str
    server: str
    #: The file, resolved.
    path: str
    #: In file order.
    diagnostics: list[Diagnostic]
    #: How many of each severity.
    counts: dict[str, int]
    #: False: the server said nothing about the file's current text in
    #: time (the diagnostics are its earlier ones, if any).
    settled: bool
    #: The server reported more than the 1000 kept per file.
    truncated: bool


class Location(Span):
    """A place a language server points to."""

    path: str
    #: The line, cut at 1024 characters.
    text: str


class Locations(TypedDict):
    """``POST /lsp/definition`` and ``/lsp/references``."""

    session_id: str
    server: str
    locations: list[Location]
    #: Locations left out: in files the caller may not read.
    outside: int
    truncated: bool


class Hover(TypedDict):
    """``POST /lsp/hover``."""

    session_id: str
    server: str
    #: False: nothing to say there.
    found: bool
    #: Markdown or plain text, as the server wrote it.
    contents: str
    range: Span | None


class Symbol(Location):
    """A name a file or project defines."""

    name: str
    #: ``function``, ``class``, ``variable`` ...
    kind: str | None
    #: The name of what holds it, if anything.
    container: str | None
    #: A file's symbols only: the lines of the whole definition,
    #: ``{line, end_line}`` (``files.read_lines`` reads them).
    body: NotRequired[dict[str, int]]


class Symbols(TypedDict):
    """``POST /lsp/symbols``."""

    session_id: str
    server: str
    symbols: list[Symbol]
    #: Symbols left out: in files the caller may not read.
    outside: int
    truncated: bool


class Completion(TypedDict):
    """One completion a language server offers."""

    label: str
    kind: str | None
    detail: str | None
    documentation: str | None
    #: What to type in place of the word being completed.
    insert_text: str


class Completions(TypedDict):
    """``POST /lsp/completions``."""

    session_id: str
    server: str
    #: In the server's order.
    items: list[Completion]
    #: The server would give more as more is typed.
    is_incomplete: bool
    truncated: bool


class RenamedFile(TypedDict):
    """One file an ``lsp.rename`` changes."""

    path: str
    #: The server's text edits in it.
    edits: int
    #: A unified diff of the change, cut at 20,000 characters.
    diff: str
    diff_truncated: bool


class Renamed(TypedDict):
    """``POST /lsp/rename``."""

    session_id: str
    server: str
    files: list[RenamedFile]
    #: False for a dry run: nothing was written.
    applied: bool


@dataclass(frozen=True)
class SSEEvent:
    """
    One Server-Sent Event.

    :ivar id: its ``id:`` (the ``seq`` of resumable streams), or None.
    :ivar event: its name (``stdout``, ``exit``, ``gap``, ``created`` ...).
    :ivar data: its ``data:``, JSON-decoded.
    """

    event: str
    data: Any
    id: int | None = None


@dataclass
class CommandResult:
    """
    A finished command.

    :ivar exit_code: the child's exit code (minus the signal number when a
        signal ended it).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    truncated: bool = False
    dropped_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether it exited 0."""
        return self.exit_code == 0


@dataclass
class PtyEvent:
    """
    One frame from a terminal: ``output`` (``data``, ``offset``),
    ``started`` (``pid``) or ``exited`` (``exit_code``).
    """

    kind: Literal["output", "started", "exited"]
    data: str = ""
    offset: int | None = None
    exit_code: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)
