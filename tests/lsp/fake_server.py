"""
A small language server for tests that need a server to behave one exact
way (no real server does it reliably, or none is installed): started as
``python fake_server.py``, it speaks LSP on stdio.

- It registers a file watcher (``**/*.py``) once initialized, as pyright
  does, and keeps every ``workspace/didChangeWatchedFiles`` change.
- A hover answers, as its Markdown, a JSON object of what it heard:
  ``changes`` (the watched-file changes) and ``texts`` (the versions of
  each document sent to it).
- ``FAKE_DIAGNOSTICS=N`` publishes N diagnostics (errors after
  ``FAKE_WARNINGS_FIRST`` warnings) for every document it is sent.
- A completion answers pyright's list after ``os.wal``, in its order.
- ``FAKE_COLD_RENAMES=N``: the first N renames answer null, as a server
  still indexing does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_out = sys.stdout.buffer
_in = sys.stdin.buffer


def send(message: dict[str, Any]) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    _out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    _out.flush()


def read() -> dict[str, Any] | None:
    length = 0
    while True:
        line = _in.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    message: dict[str, Any] = json.loads(_in.read(length))
    return message


def diagnostics(uri: str, version: int) -> None:
    count = int(os.environ.get("FAKE_DIAGNOSTICS", "0"))
    if not count:
        send(
            {
                "method": "textDocument/publishDiagnostics",
                "params": {"uri": uri, "version": version, "diagnostics": []},
            }
        )
        return
    warnings = int(os.environ.get("FAKE_WARNINGS_FIRST", "0"))
    span = {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}
    items = [
        {
            "range": span,
            "severity": 2 if n < warnings else 1,
            "message": f"problem {n} " + "x" * 200,
            "source": "fake",
        }
        for n in range(count)
    ]
    send(
        {
            "method": "textDocument/publishDiagnostics",
            "params": {"uri": uri, "version": version, "diagnostics": items},
        }
    )


def main() -> None:
    changes: list[Any] = []
    texts: dict[str, list[int]] = {}
    cold = int(os.environ.get("FAKE_COLD_RENAMES", "0"))
    while True:
        message = read()
        if message is None:
            return
        method = message.get("method")
        params = message.get("params") or {}
        if method == "initialize":
            capabilities = {
                "textDocumentSync": 1,
                "hoverProvider": True,
                "renameProvider": True,
                "completionProvider": {},
            }
            send({"id": message["id"], "result": {"capabilities": capabilities}})
        elif method == "initialized":
            watchers = {"watchers": [{"globPattern": "**/*.py"}]}
            registration = {
                "id": "watch-1",
                "method": "workspace/didChangeWatchedFiles",
                "registerOptions": watchers,
            }
            send(
                {
                    "id": "reg-1",
                    "method": "client/registerCapability",
                    "params": {"registrations": [registration]},
                }
            )
        elif method in ("textDocument/didOpen", "textDocument/didChange"):
            doc = params["textDocument"]
            texts.setdefault(doc["uri"], []).append(doc["version"])
            diagnostics(doc["uri"], doc["version"])
        elif method == "workspace/didChangeWatchedFiles":
            changes.extend(params.get("changes", []))
        elif method == "textDocument/hover":
            heard = json.dumps({"changes": changes, "texts": texts})
            send({"id": message["id"], "result": {"contents": heard}})
        elif method == "textDocument/completion":
            # pyright's answer after ``os.wal``: sorted for an editor that
            # filters by what was typed itself.
            labels = ["MFD_ALLOW_SEALING", "WIFSIGNALED", "_wrap_close", "fwalk"]
            labels += ["waitid_result", "walk"]
            items = [
                {"label": label, "sortText": f"{n:02d}"}
                for n, label in enumerate(labels)
            ]
            send(
                {"id": message["id"], "result": {"isIncomplete": False, "items": items}}
            )
        elif method == "textDocument/rename":
            if cold > 0:
                cold -= 1
                send({"id": message["id"], "result": None})
                continue
            uri = params["textDocument"]["uri"]
            position = params["position"]
            edit = {
                "range": {"start": position, "end": position},
                "newText": params["newName"],
            }
            send({"id": message["id"], "result": {"changes": {uri: [edit]}}})
        elif method == "shutdown":
            send({"id": message["id"], "result": None})
        elif method == "exit":
            return
        elif "id" in message and method is not None:
            send({"id": message["id"], "result": None})


if __name__ == "__main__":
    main()
