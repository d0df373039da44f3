"""
``python -m sandboxd.client.reference > docs/client.md``: the client's
documentation, with its reference part generated from the docstrings and
signatures (and the CLI's from its argument parser), so it stays true.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from sandboxd.client import _api, _http, _sync, errors
from sandboxd.client import cli as client_cli
from sandboxd.client._plan import api, api_stream, blocking_returns, signature_of

INTRO = """\
# The Python client and the CLI

`sandboxd.client` drives a sandboxd daemon from outside the sandbox:
`Sandbox` (blocking) and `AsyncSandbox` (asyncio, every method a
coroutine with the same name and arguments). It is built on
[httpx](https://www.python-httpx.org/) (HTTP and Server-Sent Events) and
[websockets](https://websockets.readthedocs.io/) (the PTY port), and imports
nothing from Twisted, so it runs wherever those two are installed.

**Installing the client alone.** The repository builds a second
distribution, `sandboxd-client`, from `client/pyproject.toml`: the client,
the `sandboxd` command's client side (`exec`, `cp`, `ls`, `grep`,
`diagnostics`, `definition`, `ps`, `logs`, `kill`, `term`, `caps`) and nothing
of the daemon; it depends on httpx and websockets only. From a checkout:

```sh
pip install ./client
sandboxd --version                 # sandboxd 0.1.0 (client)
```

(`pip wheel --no-deps -w dist ./client` builds the wheel to install
elsewhere.) Install it or the daemon's distribution (`pip install .`, which
holds the client too, with `pip install '.[client]'` for httpx and
websockets), not both in one environment: both give the `sandboxd` command.

```python
from sandboxd.client import Sandbox, PermissionDenied

with Sandbox("http://127.0.0.1:9000", token="...") as sb:
    sb.files.write_text("notes/todo.txt", "ship it\\n")
    sb.files.upload("dataset.bin", "in/dataset.bin", progress=lambda done, total: ...)
    result = sb.commands.run("python3 train.py", cwd="in", on_stdout=print)
    print(result.exit_code)

    job = sb.commands.start("python3 -m http.server 8000", tag="web")
    for event in job.stream():          # resumes by cursor if the connection drops
        ...
    job.kill()

    with sb.pty.open(shell="bash") as term:
        term.send("ls; echo END-$((6*7))\\n")
        print(term.expect("END-42"))      # the output, not the echoed command line

    try:
        sb.files.read_text("/etc/shadow")
    except PermissionDenied as e:       # PathNotAllowed, with e.code and e.rule
        print(e.code, e.rule)
```

```python
import asyncio
from sandboxd.client import AsyncSandbox

async def main() -> None:
    async with AsyncSandbox("http://127.0.0.1:9000", token="...") as sb:
        results = await asyncio.gather(*(sb.commands.run(f"echo {i}") for i in range(4)))
        async with await sb.files.watch("src", recursive=True) as changes:
            async for change in changes:
                print(change.event, change.data["path"])

asyncio.run(main())
```

## Settings

`Sandbox(url, token=..., timeout=30, retries=3, wait_on_rate_limit=False,
pty_url=None, http_client=None)`. The URL defaults to `SANDBOXD_URL` (else
`http://127.0.0.1:9000`), the token to `SANDBOXD_TOKEN`, the PTY WebSocket
base to `SANDBOXD_PTY_URL`, else the session's `ws_url` as the daemon gives it
(when it is created, and from `GET /pty/sessions/{id}` to attach to one), else
the HTTP port + 1 (the daemon's defaults are 9000 and 9001).
The token is sent as `Authorization: Bearer`, on the PTY handshake too.
`http_client` is an `httpx.Client` (`httpx.AsyncClient`) of your own, for its
proxies, TLS settings or event hooks: the URL, token and timeout above still
decide where each call goes, as whom and for how long, and closing the sandbox
leaves it open for you to close.

## What happens when things go wrong

- **Every call has a timeout** (`timeout`, seconds to connect and between
  bytes). `commands.run` and `code.run` wait for the command's own `timeout`
  (without one, the daemon's limit for it, read once from `/capabilities`)
  plus a margin, so that a command past its limit ends with the daemon's
  `Timeout`, whose `body` holds the output so far where the daemon sends it;
  `commands.call` (a template command) likewise waits for the daemon's limit
  for commands plus the margin, or its own `timeout=`;
  streams allow 30 s between bytes (the daemon sends a heartbeat after 4 s of
  silence). A call that gets no answer in time raises `RequestTimeout`.
- **Reads are retried** (`retries` times, with a short backoff) when the
  connection is refused or drops before the answer: every GET, and the POSTs
  that change nothing or change it the same way twice (`check`, `search`,
  `archive`, `mkdir`, `env.set`, overwriting writes). Other calls are retried
  only when the connection was refused, so a request that may have reached
  the daemon is never sent twice. When the retries are spent:
  `ConnectionFailed`.
- **Streams resume.** `files.watch`, `Process.stream`/`wait` and
  `agents.events` reconnect after a cut with `Last-Event-ID` (and `after`)
  set to the last event seen: the daemon replays exactly the events after it
  that it still keeps, so nothing is lost or repeated; events it no longer
  keeps are announced by one `gap` event. A watch ends for good only with
  its `end` event (the watched directory was deleted); one the daemon ends
  without it (it stopped or restarted) is resumed the same way, and raises
  `ConnectionFailed` when the daemon is not back within the client's
  `retries` (raise them to ride out a restart). `/shell/stream` (`commands.run`
  with callbacks) is the process itself and is not resumed: the daemon kills
  the command when its client goes away.
- **Downloads resume.** `files.download` writes `LOCAL.part` (and the file's
  ETag beside it), renames it into place when complete, and continues a cut
  transfer with `Range` and `If-Range`; a file that changed in between is
  fetched again from the start. When the retries run out the `.part` is
  kept, and the next `download(..., resume=True)` carries on.
- **Uploads resume.** The daemon writes an upload atomically, so a cut one
  leaves nothing behind. `files.upload` of a file of 8 MiB or more is a
  resumable upload (`/files/uploads`): after a cut connection the client asks
  the daemon how many bytes it has and sends only the rest; the upload id
  (`on_upload_id`, or `body["upload_id"]` of the `ConnectionFailed` raised when
  the retries run out) carries it on in a later `upload(..., upload_id=...)`;
  an id whose upload is for another remote path or size raises
  `UploadMismatch` (an `InvalidParam`) before a byte is sent. Smaller files
  go in one `POST /files/raw` and are sent again whole, as do large ones when
  the daemon has no resumable uploads or refuses the size there (they have a
  `max_bytes` of their own: raise `files_uploads_create`'s and
  `files_uploads_append`'s with `files_write_raw`'s).
- **Rate limits.** A 429 raises `RateLimited` (or another `LimitExceeded`)
  with `retry_after`; with `wait_on_rate_limit=True` the client sleeps that
  long (up to 60 s per wait) and sends the call again.
- **Refusals are exceptions named for their code**, grouped in families, all
  `SandboxError` (table below). Each carries `status`, `code`, `rule`,
  `message`, `type` and the whole JSON `body` (`e.scope`, `e.endpoint`).

## The CLI

The `sandboxd` command drives a daemon as well as running one. It reads
`--url`/`--token` or `SANDBOXD_URL`/`SANDBOXD_TOKEN`, prints for humans by
default and JSON with `--json`, and exits 1 with one line (naming the code
and rule) when the daemon refuses, 2 on bad usage. `grep`, `diagnostics` and
`definition` answer with 1 (no match, an error found, no definition), so they
exit 2 when the daemon refuses or cannot be reached, as grep and compilers do.

```sh
export SANDBOXD_URL=http://sandbox:9000 SANDBOXD_TOKEN=...
sandboxd exec --cwd app --env DEBUG=1 --timeout 600 -- python3 -m pytest -q
sandboxd cp ./dataset.tar.gz :in/             # upload; a progress bar on a terminal
sandboxd cp :out/model.bin ./                 # download; run again to resume a cut one
sandboxd cp -r ./src :app                     # a directory: into :app when it exists
pg_dump db | sandboxd cp - :in/db.sql         # - is stdin (or stdout: cp :f -)
sandboxd ls -l out
sandboxd ps
sandboxd logs 4242 -f                         # follow to the end, resuming after a drop
sandboxd kill 4242 -s INT
sandboxd term                                 # new session; ctrl-p ctrl-q detaches
sandboxd term 5f0c...                         # reattach: the scrollback, then live
sandboxd caps --explain files_read_raw --path /etc/passwd
sandboxd diagnostics app/main.py              # PATH:3:5: error: undefined name 'x' [pyflakes]
sandboxd definition app/main.py:3:5           # PATH:LINE:COLUMN: the line that defines it
```

`cp` copies into a directory when the target is one (`cp f.txt :dir`, as
`cp` does), and a directory tree with `-r` (packed into a tar.gz on one side
and unpacked on the other through `files_archive` and `files_extract`, so
their `max_bytes`, 100 MB by default, bound it; the daemon's archive holds
files, so an empty directory is copied in but not out; a link that leads out
of the tree copied in, such as a virtualenv's `bin/python`, is left out with
a warning, as the daemon would refuse it). `-` is stdin as the
source and stdout as the destination, as in other Unix tools (`./-` names a
file called `-`); stdin is read to its end before it is sent, and nothing but
the file's bytes goes to stdout.

`exec` prints the command's output as it comes, byte for byte (so
`sandboxd exec -- tar czf - src > src.tgz` gives a whole archive), and
exits with its exit code (128 + N when signal N ended it, 124 when the
daemon killed it at `--timeout`, 1 with a message when the output went
over the daemon's `max_output_bytes`). With `--json` it prints one object:
`stdout`, `stderr` (with `stdout_base64`/`stderr_base64`, the exact bytes, when
the output is not UTF-8), `exit_code` and `truncated`, plus `error` and `code`
when the command ran past its timeout. When local stdin is not a terminal
it is sent to the command (`echo x | sandboxd exec -- cat` prints `x`;
read before the command starts). It goes base64-encoded in the request, so
the daemon's `endpoints.shell_stream.limits.max_request_bytes` bounds it:
about 780 KB under the default 1 MiB (and the client reads at most 64 MiB);
for more, raise that limit or copy the data in with `sandboxd cp` and
redirect from the file. A pipe that shows neither data
nor its end within a quarter of a second (a supervisor's idle stdin) is not
waited for; `-n` sends nothing. Piped into
`head`, any command ends quietly with status 141 when the reader goes. `term` puts the local terminal in raw mode, sends the window
size on every `SIGWINCH`, and restores the terminal when it detaches or the
shell exits (then with the shell's exit code). Ended by a signal (`SIGTERM`
from `timeout` or a supervisor, `SIGHUP`, `SIGINT`) it restores the terminal
too, leaves the session running as a detach does, says how to reattach, and
exits with 128 + the signal's number. A detached session is not kept
for ever: with no client attached and no output for the daemon's terminal idle
timeout (`endpoints.pty_create_session.limits.idle_timeout_seconds`, 30
minutes by default) it is closed, and what runs in it ends, a quiet job
(`sleep`, a build that prints nothing) included; the detach message says so.
`logs -f` follows a process to its end, then says how it ended and exits
with its status as `exec` would (143 for `SIGTERM`); a daemon that stops
meanwhile is a connection error (status 1), not an end. In `code`'s read-eval-print loop, Ctrl-C interrupts the running cell and the
loop goes on with the context's state kept; a second Ctrl-C within a second
leaves (status 130).

"""


def _signature(func: Callable[..., Any], owner: str) -> str:
    sig = _blocking_signature(func)
    parts: list[str] = []
    star = False
    for name, p in sig.parameters.items():
        if name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
            text = "*" + name
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + name
        else:
            text = name
        if p.annotation is not p.empty:
            text += f": {p.annotation}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        if p.kind is p.POSITIONAL_ONLY:
            text += ", /" if list(sig.parameters)[-1] == name else ""
        parts.append(text)
    result = (
        f" -> {sig.return_annotation}" if sig.return_annotation is not sig.empty else ""
    )
    text = f"{owner}.{func.__name__}({', '.join(parts)}){result}"
    return re.sub(r"\[(F|BlockingFace)\]", "", text.replace("builtins.", ""))


def _blocking_signature(func: Any) -> inspect.Signature:
    """How the blocking client shows ``func`` (a shared call, or a plain method)."""
    if isinstance(func, api):
        return signature_of(func.fn)
    if isinstance(func, api_stream):
        return signature_of(func.fn, blocking_returns(func.fn))
    return inspect.signature(func)


def _async_only(func: Any) -> bool:
    """A plain method of the asyncio client's protocol (``aclose``)."""
    params = list(inspect.signature(func).parameters.values())
    return bool(params) and "AsyncFace" in str(params[0].annotation)


_ROLE = re.compile(r":(?:meth|class|func|attr|data):`~?([^`]+)`")
_FIELD = re.compile(r"^:(param|ivar|raises|returns)\s*([^:]*):", re.MULTILINE)


def _markdown(text: str) -> str:
    """reST docstring markup as Markdown."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    text = text.replace("``", "`")

    def field(m: re.Match[str]) -> str:
        kind, name = m.group(1), m.group(2).strip()
        label = {"param": "", "ivar": "", "raises": "raises ", "returns": "returns"}[
            kind
        ]
        return f"- {label}`{name}`:" if name else f"- {label}:"

    return _FIELD.sub(field, text)


def _doc(obj: Any) -> str:
    return _markdown(inspect.cleandoc(obj.__doc__ or "").strip())


def _members(cls: type, owner: str) -> list[str]:
    out: list[str] = []
    own = [c for c in reversed(cls.__mro__) if c.__module__.startswith("sandboxd.")]
    for name, func in [item for c in own for item in vars(c).items()]:
        if name.startswith("_") or isinstance(func, type):
            continue
        shared = isinstance(func, api | api_stream)
        if not shared and (not callable(func) or _async_only(func)):
            continue
        out.append(f"#### `{_signature(func, owner)}`\n")
        doc = _doc(func)
        if doc:
            out.append(doc + "\n")
    return out


SECTIONS: list[tuple[str, type, str]] = [
    ("Sandbox", _sync.Sandbox, "sb"),
    ("sb.files", _api.Files, "sb.files"),
    ("sb.commands", _api.Commands, "sb.commands"),
    ("Process (from commands.start / connect)", _api.Process, "process"),
    ("sb.pty", _api.Pty, "sb.pty"),
    ("Terminal (from pty.open / attach)", _api.Terminal, "term"),
    ("EventStream (from files.watch / agents.events)", _http.EventStream, "stream"),
    ("sb.system", _api.System, "sb.system"),
    ("sb.env", _api.Env, "sb.env"),
    ("sb.git", _api.Git, "sb.git"),
    ("sb.code", _api.Code, "sb.code"),
    ("sb.browser", _api.Browser, "sb.browser"),
    ("sb.agents", _api.Agents, "sb.agents"),
    ("sb.links", _api.Links, "sb.links"),
    ("sb.preview", _api.Preview, "sb.preview"),
    ("sb.lsp", _api.Lsp, "sb.lsp"),
]


def _errors() -> list[str]:
    families = [
        errors.InvalidRequest,
        errors.AuthenticationError,
        errors.PermissionDenied,
        errors.NotFoundError,
        errors.DeadlineExceeded,
        errors.Conflict,
        errors.LimitExceeded,
        errors.ServerError,
    ]
    out = [
        "## Errors\n",
        "Every exception is a `SandboxError`. Catch a family to handle a kind of",
        "refusal, a code's class to handle one. Codes this client does not know",
        "map to the family of their HTTP status.\n",
        "| code | exception | family |",
        "|---|---|---|",
    ]
    for code, cls in sorted(errors.BY_CODE.items()):
        family = next(
            (f.__name__ for f in families if issubclass(cls, f)), "SandboxError"
        )
        out.append(f"| `{code}` | `{cls.__name__}` | `{family}` |")
    out.append("")
    for cls in (errors.SandboxError, *families, errors.LimitExceeded):
        if cls is errors.LimitExceeded and out[-1].startswith("`LimitExceeded`"):
            continue
        out.append(f"`{cls.__name__}`: {_doc(cls).splitlines()[0]}\n")
    return out


def _cli() -> list[str]:
    os.environ["COLUMNS"] = "88"
    parser = client_cli._parser()
    out = ["## CLI reference\n"]
    sub = next(a for a in parser._actions if a.dest == "command")
    choices: dict[str, Any] = getattr(sub, "choices", {})
    for name in client_cli.COMMANDS:
        out.append(f"### `sandboxd {name}`\n")
        out.append("```\n" + choices[name].format_help().rstrip() + "\n```\n")
    return out


def render() -> str:
    """The whole of ``docs/client.md``."""
    out = [INTRO, "## Reference\n"]
    out.append(
        "The blocking client's API; `AsyncSandbox` has the same namespaces and "
        "methods as coroutines (`await sb.files.read_text(...)`, `async for` over "
        "streams, `async with` for the client, terminals and event streams).\n"
    )
    for title, cls, owner in SECTIONS:
        out.append(f"### {title}\n")
        doc = _doc(cls)
        if doc:
            out.append(doc + "\n")
        out.extend(_members(cls, owner))
    out.extend(_errors())
    out.extend(_cli())
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
