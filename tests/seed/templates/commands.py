"""
A template's ``commands.py`` written for the seed's server, kept unchanged:
sandboxd must load it with ``--commands`` as the seed loads it.

A small "release desk" template: commands with inferred and declared
arguments (``string_array`` among them), a command behind a custom scope,
a hidden command, a command registered through the client SDK's
``@sandbox.register`` bridge, and custom routes (JSON, an error, event
streams, one of them following a child process).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import subprocess
import time

from agent_sandbox import sandbox
from agent_sandbox.server import (
    CapabilityGroup,
    CommandArg,
    SandboxServer,
    ServerPolicy,
    ServerResponse,
    SSEResponse,
    command,
    default_table,
)

table = default_table()


@command("greet", description="Say hello")
def greet(name: str, shout: bool = False) -> str:
    text = f"Hello, {name}!"
    return text.upper() if shout else text


@command()
def count_words(words: list[str], min_length: int = 1) -> dict:
    kept = [w for w in words if len(w) >= min_length]
    return {"count": len(kept), "kept": kept}


@command(
    "deploy",
    description="Record a deployment",
    scopes=["myapp:deploy"],
    args=[
        CommandArg("env", "string", required=True, description="target environment"),
        CommandArg("tags", "string_array", default='["latest"]'),
        CommandArg("replicas", "integer", default="2"),
        CommandArg("dry_run", "boolean", default="false"),
    ],
)
def deploy(env: str, tags: list[str], replicas: int, dry_run: bool) -> dict:
    return {"env": env, "tags": tags, "replicas": replicas, "dry_run": dry_run}


@command("rotate_keys", hidden=True)
def rotate_keys() -> str:
    return "rotated"


@sandbox.register
def tally(items: list[str], weight: int = 2) -> int:
    return len(items) * weight


@table.route("GET", "/release/status", group=CapabilityGroup.SYSTEM)
def status(request):
    verbose = request.query.get("verbose", ["0"])[0] == "1"
    body = {
        "ready": True,
        "query": request.query,
        "has_body": request.body is not None,
        "release": request.headers.get("X-Release", "none"),
    }
    if verbose:
        body["detail"] = "all checks passed"
    return ServerResponse.ok(body)


@table.route(
    "POST",
    "/release/notes",
    group=CapabilityGroup.COMMANDS,
    name="release_notes",
    scopes=["myapp:deploy"],
)
def notes(request):
    if not request.body or "text" not in request.body:
        return ServerResponse.error(400, "'text' is required", error_type="ValueError")
    return ServerResponse.ok({"saved": request.body["text"], "by": request.path})


@table.route("GET", "/release/ticks", group=CapabilityGroup.SYSTEM, streaming=True)
def ticks(request):
    count = int(request.query.get("n", ["3"])[0])

    def frames():
        for i in range(count):
            time.sleep(0.01)
            yield f"data: {json.dumps({'tick': i})}\n\n"
        yield "event: end\ndata: {}\n\n"

    return SSEResponse(event_iterator=frames())


@table.route("GET", "/release/items/{item}", group=CapabilityGroup.SYSTEM)
def item(request):
    return ServerResponse.ok({"item": request.path_params["item"]})


@table.route("GET", "/release/when", group=CapabilityGroup.SYSTEM)
def when(request):
    return ServerResponse.ok(
        {"when": datetime.datetime(2020, 1, 1), "where": pathlib.Path("/tmp")}
    )


@table.route("GET", "/release/follow", group=CapabilityGroup.SYSTEM, streaming=True)
def follow(request):
    """Follow a child's work; the child ends when the stream does."""

    def frames():
        with subprocess.Popen(["sleep", "300"]) as child:
            try:
                yield f"data: {json.dumps({'pid': child.pid})}\n\n"
                while True:
                    time.sleep(0.05)
                    yield ": still following\n\n"
            finally:
                child.kill()

    return SSEResponse(event_iterator=frames())


if __name__ == "__main__":
    # Run on its own: the seed's server, uploads and downloads only.
    SandboxServer(host="0.0.0.0", policy=ServerPolicy.only("transfer")).serve(port=9000)
