# -*- test-case-name: tests.agents.test_clibridge -*-
"""
An ACP agent that runs a coding agent's own CLI once per turn, in its
headless mode (``codex exec --json``, ``qwen … --output-format
stream-json``, ``claude -p --output-format stream-json``), as
agent-sandbox-server runs them.

The daemon starts it like any ACP agent::

    python -I -m sandboxd.agents.clibridge --cli codex --access read_only \\
        --max-line-bytes=... (its bounds) /usr/bin/codex

and speaks ACP to it on stdin and stdout; each ``session/prompt`` starts
the CLI in the session's directory, in a session of its own, reads its
lines through :mod:`sandboxd.agents.cliparsers` and sends what they say as
``session/update`` notifications; a ``session/cancel`` ends the CLI's
process group.  The next turn resumes the CLI's own session, and so does
one after a daemon restart (``session/load``).

A headless CLI asks nobody before it acts, so ``--access`` (chosen by the
daemon from the policy's ``permission_mode``) is the CLI's own sandbox or
approval mode: ``read_only``, ``workspace_write`` or ``full_access``.

Only the standard library is imported: this runs as its own process for
each agent session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandboxd.agents import climcp
from sandboxd.agents.climcp import toml_string
from sandboxd.agents.cliparsers import READERS, SUBAGENT_NOTIFICATION, Outcome, Parsed

#: ``--access`` values, narrowest first.
ACCESS = ("read_only", "workspace_write", "full_access")


@dataclass(frozen=True)
class Bounds:
    """
    The bridge's bounds, given on its command line by the daemon (from
    its policy defaults, ``AGENT_CLI_*`` and ``KILL_GRACE_SECONDS``).
    """

    #: The longest line read, from the daemon or the CLI; a longer line
    #: from the CLI (a whole file read back, say) is skipped.
    max_line_bytes: int
    #: How long a cancelled CLI has between SIGTERM and SIGKILL.
    kill_grace: float
    #: How long the CLI's output is read for once it has exited.
    output_grace: float
    #: What of the CLI's stderr a failed turn's error quotes.
    error_tail_bytes: int
    #: How many sessions' CLI sessions are kept for a resume (:class:`Pointers`).
    kept_sessions: int


#: codex's reasoning efforts, and the option that sets one.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
EFFORT_OPTION = "reasoning_effort"

RESOURCE_NOT_FOUND = -32002
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


class RpcFailure(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    """One ACP session: where its CLI runs and the CLI's own session to resume."""

    session_id: str
    cwd: str
    mcp_servers: list[dict[str, Any]]
    model: str | None = None
    #: codex's reasoning effort (None: its configured one).
    effort: str | None = None
    #: The CLI's session (codex's thread), once its first turn named it.
    resume: str | None = None
    #: The running CLI: its pid, and when it exits.
    process: tuple[int, asyncio.Future[None]] | None = None
    #: A turn is running (from its prompt's arrival to its answer).
    running: bool = False
    cancelled: bool = False


@dataclass
class Turn:
    """What a turn's lines have said so far."""

    outcome: Outcome | None = None
    usage: dict[str, int] | None = None
    stderr: deque[bytes] = field(default_factory=deque)
    stderr_bytes: int = 0


def prompt_text(blocks: Any) -> str:
    """An ACP prompt as the one text a CLI takes."""
    parts: list[str] = []
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            parts.append(f"[{block.get('name') or 'file'}]({block['uri']})")
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            resource = block["resource"]
            if isinstance(resource.get("text"), str):
                parts.append(
                    f"<file uri={resource.get('uri')!r}>\n{resource['text']}\n</file>"
                )
    return "\n\n".join(parts)


_CODEX_SANDBOX = {
    "read_only": "read-only",
    "workspace_write": "workspace-write",
    "full_access": "danger-full-access",
}


def codex_argv(
    program: str, access: str, session: Session, mcp: Sequence[str] = ()
) -> list[str]:
    """
    ``codex exec [resume ID] --json …  -``: the prompt comes on stdin;
    ``mcp``: the overrides naming the session's MCP servers.
    """
    argv = [program, "exec"]
    if session.resume:
        argv += ["resume", session.resume]
    argv += ["--json", "--skip-git-repo-check"]
    if session.model:
        argv.append(f"--model={session.model}")
    argv += [
        "-c",
        f"sandbox_mode={toml_string(_CODEX_SANDBOX[access])}",
        "-c",
        'approval_policy="never"',
    ]
    if session.effort:
        argv += ["-c", f"model_reasoning_effort={toml_string(session.effort)}"]
    return [*argv, *mcp, "-"]


_QWEN_APPROVAL = {
    "read_only": ["--approval-mode", "plan"],
    "workspace_write": ["--approval-mode", "auto-edit"],
    "full_access": ["--yolo"],
}


def qwen_argv(program: str, access: str, session: Session) -> list[str]:
    """
    ``qwen --output-format stream-json …``: the prompt comes on stdin (as an
    argument, one starting with a dash would be read as an option; values
    are joined to their option with ``=`` for the same reason).
    """
    argv = [program, "--output-format", "stream-json", "--include-partial-messages"]
    if session.resume:
        argv.append(f"--resume={session.resume}")
    if session.model:
        argv.append(f"--model={session.model}")
    return argv + _QWEN_APPROVAL[access]


_CLAUDE_PERMISSIONS = {
    "read_only": "plan",
    "workspace_write": "acceptEdits",
    "full_access": "bypassPermissions",
}


def claude_argv(program: str, access: str, session: Session) -> list[str]:
    """``claude -p --output-format stream-json …``: the prompt comes on stdin."""
    argv = [
        program,
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--permission-mode",
        _CLAUDE_PERMISSIONS[access],
    ]
    if session.resume:
        argv.append(f"--resume={session.resume}")
    if session.model:
        argv.append(f"--model={session.model}")
    return argv


#: Each CLI: its line format and how it takes the prompt.
CLIS = ("codex", "qwen", "claude")
_FORMATS = {"codex": "codex", "qwen": "stream-json", "claude": "stream-json"}


@dataclass(frozen=True)
class Call:
    """One turn's run of the CLI."""

    argv: list[str]
    #: What goes on its stdin: the prompt, for every CLI.
    stdin: bytes
    #: Variables added to its environment.
    env: dict[str, str] = field(default_factory=dict)
    #: The JSON it reads through ``--mcp-config`` (the session's MCP servers).
    mcp_config: bytes | None = None


def invocation(
    cli: str, program: str, access: str, session: Session, prompt: str
) -> Call:
    """
    The CLI's run for one turn.

    :raises RpcFailure: the session's MCP servers cannot be handed to it.
    """
    try:
        servers = climcp.handover(cli, session.mcp_servers)
    except climcp.Refused as e:
        raise RpcFailure(INVALID_PARAMS, str(e)) from None
    if cli == "codex":
        argv = codex_argv(program, access, session, servers.args)
    elif cli == "qwen":
        argv = qwen_argv(program, access, session)
    else:
        argv = claude_argv(program, access, session)
    env = dict(servers.env)
    if cli == "claude" and access == "full_access" and os.geteuid() == 0:
        # Claude Code refuses its full-access mode to root unless it runs in
        # a sandbox it recognises (IS_SANDBOX=1, bubblewrap, docker); the
        # daemon's policy granted full access and is that sandbox here.
        env["IS_SANDBOX"] = "1"
    return Call(argv, prompt.encode(), env, servers.config)


def mcp_config_file(content: bytes) -> int:
    """
    A descriptor of an anonymous file holding ``content`` (not inherited):
    the MCP servers' settings, credentials included, never get a name on
    disk that a turn killed with the bridge would leave behind.
    """
    fd = os.memfd_create("sandboxd-mcp-config")
    try:
        os.write(fd, content)
    except OSError:
        os.close(fd)
        raise
    return fd


class _CLIProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """
    asyncio's protocol for a child's pipes, which also says when the child
    itself has exited: ``Process.wait`` waits for its pipes to close too,
    which a process it left behind may never do.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class Pointers:
    """
    Which CLI session each of the bridge's sessions resumes, kept as one
    small file per session in ``directory`` (under the user's home, beside
    the CLIs' own sessions), so that a bridge started after a daemon
    restart can load it.  What cannot be written is not kept: the session
    then starts afresh after a restart.
    """

    def __init__(self, directory: str, kept: int) -> None:
        self.directory = directory
        self.kept = kept

    def _path(self, session_id: Any) -> str | None:
        if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
            return None
        return os.path.join(self.directory, session_id)

    def write(self, session_id: str, resume: str) -> None:
        path = self._path(session_id)
        if path is None:
            return
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            temporary = f"{path}.{os.getpid()}"
            with open(temporary, "w", encoding="utf-8") as f:
                f.write(resume)
            os.replace(temporary, path)
            self._prune()
        except OSError as e:
            sys.stderr.write(f"sandboxd bridge: cannot keep the session: {e}\n")

    def _prune(self) -> None:
        """The oldest pointers go beyond :attr:`kept`."""
        with os.scandir(self.directory) as found:
            entries = [e for e in found if _SESSION_ID.fullmatch(e.name)]
        if len(entries) <= self.kept:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for entry in entries[: len(entries) - self.kept]:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def read(self, session_id: Any) -> str | None:
        path = self._path(session_id)
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                resume = f.read(4096).strip()
        except OSError:
            return None
        return resume or None


#: A CLI's own session id the bridge passes back to it: what codex's,
#: Qwen Code's and Claude Code's look like (UUIDs), never an option.
_NATIVE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: What the bridge's session ids look like (the pointers' file names).
_SESSION_ID = re.compile(r"cli_[0-9a-f]{32}")

#: Where :class:`Pointers` keeps them, below the user's home.
POINTERS = os.path.join(".cache", "sandboxd", "cli-sessions")


class Bridge:
    """The ACP side: requests from the daemon, updates back."""

    def __init__(
        self,
        cli: str,
        program: str,
        access: str,
        bounds: Bounds,
        write: Callable[[bytes], None],
    ) -> None:
        self.cli = cli
        self.program = program
        self.access = access
        self.bounds = bounds
        self.write = write
        self.sessions: dict[str, Session] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.pointers = Pointers(
            os.path.join(os.path.expanduser("~"), POINTERS), bounds.kept_sessions
        )

    # -- the wire --------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    def notify(self, session_id: str, update: dict[str, Any]) -> None:
        self.send(
            {
                "method": "session/update",
                "params": {"sessionId": session_id, "update": update},
            }
        )

    def received(self, line: bytes) -> None:
        """One line from the daemon: a request runs as a task of its own."""
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return  # an answer to a request of ours: the bridge makes none
        task = asyncio.ensure_future(self._answer(message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        handler = getattr(self, "do_" + message["method"].replace("/", "_"), None)
        try:
            if handler is None:
                raise RpcFailure(METHOD_NOT_FOUND, f"no method {message['method']!r}")
            result = await handler(params)
        except RpcFailure as e:
            if "id" in message:
                self.send(
                    {
                        "id": message["id"],
                        "error": {"code": e.code, "message": e.message},
                    }
                )
            return
        if "id" in message:
            self.send({"id": message["id"], "result": result})

    # -- methods ---------------------------------------------------------------

    async def do_initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {
                    "image": False,
                    "audio": False,
                    "embeddedContext": True,
                },
            },
            "agentInfo": {
                "name": f"{self.cli} (headless)",
                "title": f"{self.cli} CLI through sandboxd's bridge",
                "version": "1",
            },
            "authMethods": [],
        }

    def _opened(self, session_id: str, params: dict[str, Any]) -> Session:
        """A session of ``params``' directory and MCP servers, kept as ``session_id``."""
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise RpcFailure(INVALID_PARAMS, "cwd must be an absolute path")
        servers = params.get("mcpServers") or []
        if not isinstance(servers, list) or not all(
            isinstance(s, dict) for s in servers
        ):
            raise RpcFailure(INVALID_PARAMS, "mcpServers must be a list of objects")
        session = Session(session_id, cwd, servers)
        # Refused here, not at the first prompt, if the CLI cannot take them.
        invocation(self.cli, self.program, self.access, session, "")
        self.sessions[session.session_id] = session
        return session

    def _config_options(self, session: Session) -> list[dict[str, Any]]:
        """What the session can be set to: codex's reasoning effort."""
        if self.cli != "codex":
            return []
        return [
            {
                "id": EFFORT_OPTION,
                "name": "Reasoning effort",
                "category": "thought_level",
                "type": "select",
                "currentValue": session.effort or "default",
                "options": [{"value": v, "name": v} for v in ("default", *EFFORTS)],
            }
        ]

    async def do_session_new(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._opened("cli_" + uuid.uuid4().hex, params)
        return {
            "sessionId": session.session_id,
            "configOptions": self._config_options(session),
        }

    async def do_session_set_config_option(
        self, params: dict[str, Any]
    ) -> dict[str, Any]:
        session = self._session(params)
        value = params.get("value")
        if not self._config_options(session) or params.get("configId") != EFFORT_OPTION:
            raise RpcFailure(INVALID_PARAMS, f"no option {params.get('configId')!r}")
        if value not in ("default", *EFFORTS):
            raise RpcFailure(INVALID_PARAMS, f"no reasoning effort {value!r}")
        session.effort = None if value == "default" else str(value)
        return {"configOptions": self._config_options(session)}

    async def do_session_load(self, params: dict[str, Any]) -> dict[str, Any]:
        """
        A session of an earlier bridge (the daemon restarted): its next turn
        resumes the CLI's own session.  Nothing is replayed; the daemon kept
        the conversation as it was.
        """
        session_id = params.get("sessionId")
        resume = self.pointers.read(session_id)
        if resume is None:
            raise RpcFailure(RESOURCE_NOT_FOUND, f"no session {session_id!r} to load")
        if not _NATIVE_ID.fullmatch(resume):
            raise RpcFailure(RESOURCE_NOT_FOUND, f"no session {session_id!r} to load")
        session = self._opened(str(session_id), params)
        session.resume = resume
        return {"configOptions": self._config_options(session)}

    def _session(self, params: dict[str, Any]) -> Session:
        session = self.sessions.get(params.get("sessionId"))  # type: ignore[arg-type]
        if session is None:
            raise RpcFailure(INVALID_PARAMS, "unknown sessionId")
        return session

    async def do_session_set_model(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        model = params.get("modelId")
        if not isinstance(model, str) or not model:
            raise RpcFailure(INVALID_PARAMS, "modelId must be a string")
        session.model = model
        return {}

    async def do_session_cancel(self, params: dict[str, Any]) -> None:
        session = self.sessions.get(params.get("sessionId"))  # type: ignore[arg-type]
        if session is None or not session.running:
            return
        session.cancelled = True
        if session.process is not None:
            await stop(*session.process, self.bounds.kill_grace)

    async def do_session_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        if session.running:
            raise RpcFailure(INVALID_PARAMS, "a turn is already running")
        prompt = prompt_text(params.get("prompt"))
        call = invocation(self.cli, self.program, self.access, session, prompt)
        session.running, session.cancelled = True, False
        try:
            return await self._turn(session, call)
        finally:
            session.running = False

    async def _turn(self, session: Session, call: Call) -> dict[str, Any]:
        """One run of the CLI, from its start to the prompt's answer."""
        try:
            config = (
                None if call.mcp_config is None else mcp_config_file(call.mcp_config)
            )
        except OSError as e:
            raise RpcFailure(
                INTERNAL_ERROR, f"cannot hand the MCP servers over: {e.strerror}"
            ) from None
        argv = list(call.argv)
        if config is not None:
            # Read through the bridge's own descriptor, open until the turn
            # ends: a CLI that starts itself again (qwen does) has it too,
            # which a descriptor handed down would not promise.
            argv.append(f"--mcp-config=/proc/{os.getpid()}/fd/{config}")
        try:
            return await self._run_cli(session, call, argv)
        finally:
            if config is not None:
                os.close(config)

    async def _run_cli(
        self, session: Session, call: Call, argv: list[str]
    ) -> dict[str, Any]:
        """The CLI started as ``argv``, read to its end: the prompt's answer."""
        loop = asyncio.get_running_loop()
        transport, protocol = await self._start(session, call, argv)
        process = asyncio.subprocess.Process(transport, protocol, loop)
        session.process = (process.pid, protocol.exited)
        turn = Turn()
        if session.cancelled:
            # Cancelled while it was being started.
            await stop(process.pid, protocol.exited, self.bounds.kill_grace)
        try:
            await self._run(session, process, protocol.exited, turn, call.stdin)
        finally:
            session.process = None
            transport.close()
        return self._ended(session, transport.get_returncode(), turn)

    async def _start(
        self, session: Session, call: Call, argv: list[str]
    ) -> tuple[asyncio.SubprocessTransport, _CLIProtocol]:
        """The CLI started in the session's directory, in a session of its own."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.subprocess_exec(
                lambda: _CLIProtocol(self.bounds.max_line_bytes, loop),
                *argv,
                cwd=session.cwd,
                env={**os.environ, **call.env} if call.env else None,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise RpcFailure(
                INTERNAL_ERROR, f"cannot start {self.program}: {e.strerror}"
            ) from None

    async def _run(
        self,
        session: Session,
        process: asyncio.subprocess.Process,
        exited: asyncio.Future[None],
        turn: Turn,
        stdin: bytes,
    ) -> None:
        assert process.stdin is not None
        assert process.stdout is not None and process.stderr is not None
        try:
            process.stdin.write(stdin)
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        process.stdin.close()
        reading = asyncio.ensure_future(self._stdout(session, process.stdout, turn))
        errors = asyncio.ensure_future(self._stderr(process.stderr, turn))
        await exited
        # Something the CLI started may hold its pipes open after it is gone:
        # what that has not printed by then is not waited for.
        _, late = await asyncio.wait(
            {reading, errors}, timeout=self.bounds.output_grace
        )
        for task in late:
            task.cancel()

    async def _stdout(
        self, session: Session, stream: asyncio.StreamReader, turn: Turn
    ) -> None:
        """The CLI's lines, read as its format says, sent on as updates."""
        reader = READERS[_FORMATS[self.cli]]()
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                # Longer than max_line_bytes: what was read is dropped.
                sys.stderr.write(
                    f"sandboxd bridge: a line over {self.bounds.max_line_bytes} bytes skipped\n"
                )
                continue
            if not line:
                self._take(session, turn, reader.finish())
                return
            self._take(session, turn, reader.feed(line.decode("utf-8", "replace")))

    def _take(self, session: Session, turn: Turn, parsed: Parsed) -> None:
        if (
            parsed.session_id
            and parsed.session_id != session.resume
            and _NATIVE_ID.fullmatch(parsed.session_id)
        ):
            session.resume = parsed.session_id
            self.pointers.write(session.session_id, parsed.session_id)
        if parsed.usage is not None:
            turn.usage = parsed.usage
        if parsed.outcome is not None:
            turn.outcome = parsed.outcome
        for update in parsed.updates:
            if "locations" in update:
                update["locations"] = [
                    {"path": os.path.normpath(os.path.join(session.cwd, loc["path"]))}
                    for loc in update["locations"]
                ]
            self.notify(session.session_id, update)
        for event in parsed.subagents:
            self.send(
                {
                    "method": SUBAGENT_NOTIFICATION,
                    "params": {"sessionId": session.session_id, "subagent": event},
                }
            )

    async def _stderr(self, stream: asyncio.StreamReader, turn: Turn) -> None:
        """The CLI's stderr passed on to the daemon's log, its tail kept."""
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            turn.stderr.append(chunk)
            turn.stderr_bytes += len(chunk)
            while (
                turn.stderr_bytes - len(turn.stderr[0]) >= self.bounds.error_tail_bytes
            ):
                turn.stderr_bytes -= len(turn.stderr.popleft())

    def _ended(self, session: Session, code: int | None, turn: Turn) -> dict[str, Any]:
        if session.cancelled:
            return {"stopReason": "cancelled"}
        outcome = turn.outcome
        if outcome is None:
            if code == 0:
                outcome = Outcome(True)
            else:
                tail = b"".join(turn.stderr)[-self.bounds.error_tail_bytes :].decode(
                    "utf-8", "replace"
                )
                outcome = Outcome(
                    False,
                    message=f"{self.cli} exited with status {code}"
                    + (f": {tail.strip()}" if tail.strip() else ""),
                )
        if not outcome.ok:
            raise RpcFailure(INTERNAL_ERROR, outcome.message or f"{self.cli} failed")
        result: dict[str, Any] = {"stopReason": outcome.stop_reason}
        if turn.usage is not None:
            result["usage"] = turn.usage
        return result

    async def close(self) -> None:
        """The daemon has gone: every running CLI ends with the bridge."""
        await asyncio.gather(
            *(
                stop(*s.process, self.bounds.kill_grace)
                for s in self.sessions.values()
                if s.process is not None
            )
        )


async def stop(pid: int, exited: asyncio.Future[None], grace: float) -> None:
    """
    SIGTERM to the CLI's process group; once the CLI has exited (or the
    grace is over), SIGKILL to what is left of the group.
    """
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        await asyncio.wait_for(asyncio.shield(exited), grace)
    except TimeoutError:
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def serve(cli: str, program: str, access: str, bounds: Bounds) -> None:
    """Answer ACP on stdin/stdout until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=bounds.max_line_bytes)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    bridge = Bridge(cli, program, access, bounds, write)
    while True:
        try:
            line = await reader.readline()
        except ValueError:
            continue
        if not line:
            break
        bridge.received(line)
    await bridge.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandboxd.agents.clibridge")
    parser.add_argument("--cli", choices=CLIS, required=True)
    parser.add_argument("--access", choices=ACCESS, default="read_only")
    parser.add_argument("--max-line-bytes", type=int, required=True)
    parser.add_argument("--kill-grace", type=float, required=True)
    parser.add_argument("--output-grace", type=float, required=True)
    parser.add_argument("--error-tail-bytes", type=int, required=True)
    parser.add_argument("--kept-sessions", type=int, required=True)
    parser.add_argument("program", help="the CLI's absolute path")
    args = parser.parse_args(argv)
    bounds = Bounds(
        args.max_line_bytes,
        args.kill_grace,
        args.output_grace,
        args.error_tail_bytes,
        args.kept_sessions,
    )
    asyncio.run(serve(args.cli, args.program, args.access, bounds))


if __name__ == "__main__":
    main()
