"""
``lsp_connect``, the editors' WebSocket, through a real daemon and a real
pylsp, with websocket-client (the WebSocket client most Python users run):
the editor's JSON-RPC relayed both ways, what it names outside the path
rules refused and kept from the server, the bounds, and the server's
tree ended with the socket.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlencode

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from sandboxd.lsp.answers import uri_of
from sandboxd.policy.defaults import WS_CLOSE_SECONDS
from sandboxd.processes.tree import proc_info
from tests.helpers import DaemonTestCase, alive
from tests.lsp.test_lsp import LspTestCase, fake_pylsp, lsp_policy, need_pylsp

try:
    import websocket
except ImportError:  # pragma: no cover - the dev extra installs it
    websocket = None

#: Seconds a test waits for one message of the server's.
WAIT = 60


def need_client() -> None:
    """Skip (saying why) where websocket-client is not installed."""
    if websocket is None:
        from twisted.trial.unittest import SkipTest

        raise SkipTest("websocket-client is not installed (pip install -e '.[dev]')")


def server_pids() -> set[int]:
    """The language servers this process (the test daemon) started: pylsp children of ours."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        info = proc_info(int(name))
        if info is None or info.ppid != os.getpid() or not alive(info.pid):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if b"pylsp" in f.read():
                    found.add(info.pid)
        except OSError:
            continue
    return found


class Editor:
    """A blocking editor on the socket (run it from a thread)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        self.ws.send(json.dumps({"jsonrpc": "2.0", **message}))

    def request(self, method: str, params: Any) -> int:
        self.next_id += 1
        self.send({"id": self.next_id, "method": method, "params": params})
        return self.next_id

    def notify(self, method: str, params: Any) -> None:
        self.send({"method": method, "params": params})

    def until(self, test: Any, seconds: float = WAIT) -> dict[str, Any]:
        """The next message ``test`` accepts; the others are kept in :attr:`seen`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            message = json.loads(self.ws.recv())
            self.seen.append(message)
            if message.get("method") == "workspace/configuration":
                # An editor answers its server's requests.
                items = message["params"].get("items", [])
                self.send({"id": message["id"], "result": [None] * len(items)})
            elif "method" in message and "id" in message:
                self.send({"id": message["id"], "result": None})
            if test(message):
                return message
        raise AssertionError(f"nothing matched in {seconds} s; seen: {self.seen}")

    def answer(self, request_id: int) -> dict[str, Any]:
        return self.until(lambda m: m.get("id") == request_id and "method" not in m)

    def initialize(self, root: str) -> dict[str, Any]:
        rid = self.request(
            "initialize",
            {
                "processId": None,
                "rootUri": uri_of(root),
                "workspaceFolders": [{"uri": uri_of(root), "name": "proj"}],
                "capabilities": {},
            },
        )
        answer = self.answer(rid)
        self.notify("initialized", {})
        return answer

    def open(self, path: str) -> None:
        with open(path) as f:
            text = f.read()
        self.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": uri_of(path),
                    "languageId": "python",
                    "version": 1,
                    "text": text,
                }
            },
        )

    def diagnostics_of(self, uri: str) -> dict[str, Any]:
        return self.until(
            lambda m: (
                m.get("method") == "textDocument/publishDiagnostics"
                and m["params"]["uri"] == uri
                and m["params"]["diagnostics"]
            )
        )

    def close_frame(self, seconds: float = WAIT) -> tuple[int, str]:
        """Read until the server's close frame: its code and reason."""
        self.ws.settimeout(seconds)
        while True:
            frame = self.ws.recv_data_frame(True)[1]
            if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                code = int.from_bytes(frame.data[:2], "big")
                return code, frame.data[2:].decode("utf-8")


def close_timers() -> Any:
    """
    Let autobahn's close-handshake timer of a socket the daemon closed
    run out (its batched timer is never cancelled).
    """
    return deferLater(reactor, WS_CLOSE_SECONDS + 1.1, lambda: None)


class ConnectCase(LspTestCase):
    """A daemon with the lsp group on, and an editor's socket to it."""

    def setUp(self) -> Any:
        need_pylsp()
        need_client()
        return super().setUp()

    def url(self, **query: str) -> str:
        query = {"language": "python", **query}
        return (
            self.daemon.url.replace("http://", "ws://")
            + "/lsp/connect?"
            + urlencode(query)
        )

    def connect(self, token: str | None = None, **query: str) -> Any:
        """A connected websocket-client socket (closed at the test's end)."""
        header = [f"X-Access-Token: {token}"] if token else []
        ws = websocket.create_connection(self.url(**query), header=header, timeout=30)
        self.addCleanup(ws.shutdown)
        return ws

    def refused(self, token: str | None = None, **query: str) -> Any:
        """The status and body of an upgrade the daemon refuses."""

        def attempt() -> tuple[int, dict[str, Any]]:
            try:
                ws = self.connect(token, **query)
            except websocket.WebSocketBadStatusException as e:
                return e.status_code, json.loads(e.resp_body)
            ws.close()
            raise AssertionError("the upgrade was accepted")

        return deferToThread(attempt)

    def talk(self, script: Any, **query: str) -> Any:
        """Run ``script(editor)`` against a new socket, from a thread."""

        def run() -> Any:
            ws = self.connect(**query)
            try:
                return script(Editor(ws))
            finally:
                # The editor closes first: the daemon arms no close timer.
                ws.close()

        return deferToThread(run)


class RelayTests(ConnectCase):
    """What an editor sends and hears, relayed by the daemon."""

    @inlineCallbacks
    def test_initialize_and_definition_across_files(self) -> Any:
        """
        ``initialize`` answers with the server's capabilities; after both
        files are opened, ``textDocument/definition`` at a call of a
        function imported from the other file gives its def there.
        """
        self.project()
        root = os.path.join(self.base_dir, "proj")

        def script(editor: Editor) -> Any:
            init = editor.initialize(root)
            editor.open(os.path.join(root, "lib.py"))
            editor.open(os.path.join(root, "app.py"))
            rid = editor.request(
                "textDocument/definition",
                {
                    "textDocument": {"uri": uri_of(os.path.join(root, "app.py"))},
                    "position": {"line": 2, "character": 7},
                },
            )
            return init, editor.answer(rid)

        init, found = yield self.talk(script, root="proj")
        self.assertIn("definitionProvider", init["result"]["capabilities"])
        [location] = found["result"]
        self.assertEqual(location["uri"], uri_of(os.path.join(root, "lib.py")))
        self.assertEqual(location["range"]["start"], {"line": 0, "character": 4})

    @inlineCallbacks
    def test_diagnostics_are_published(self) -> Any:
        """A file with an undefined name gets its publishDiagnostics, as the server sent it."""
        self.write("proj/pyproject.toml", "")
        bad = self.write("proj/bad.py", "x = undefined_name + 1\n")

        def script(editor: Editor) -> Any:
            editor.initialize(os.path.dirname(bad))
            editor.open(bad)
            return editor.diagnostics_of(uri_of(bad))

        published = yield self.talk(script, root="proj")
        messages = [d["message"] for d in published["params"]["diagnostics"]]
        self.assertTrue(any("undefined_name" in m for m in messages), messages)

    @inlineCallbacks
    def test_outside_the_boundary_is_refused_and_kept_from_the_server(self) -> Any:
        """
        A definition about file:///etc/passwd is answered with a JSON-RPC
        error (data.code path_not_allowed); a didOpen of a file outside the
        base directory is dropped, the editor told with a logMessage, and
        the server never sees it: it publishes no diagnostics for it, while
        it does for a file inside opened after it.
        """
        self.write("proj/pyproject.toml", "")
        inside = self.write("proj/inside.py", "y = also_undefined\n")
        outside = "file:///etc/outside.py"

        def script(editor: Editor) -> Any:
            editor.initialize(os.path.dirname(inside))
            rid = editor.request(
                "textDocument/definition",
                {
                    "textDocument": {"uri": "file:///etc/passwd"},
                    "position": {"line": 0, "character": 0},
                },
            )
            refused = editor.answer(rid)
            editor.notify(
                "textDocument/didOpen",
                {
                    "textDocument": {
                        "uri": outside,
                        "languageId": "python",
                        "version": 1,
                        "text": "x = undefined_name\n",
                    }
                },
            )
            told = editor.until(lambda m: m.get("method") == "window/logMessage")
            editor.open(inside)
            editor.diagnostics_of(uri_of(inside))
            # The server lints each file on its own timer: give the outside
            # one, had it been passed on, as long again.
            try:
                editor.until(lambda m: False, seconds=2)
            except (AssertionError, websocket.WebSocketTimeoutException):
                pass
            return refused, told, editor.seen

        refused, told, seen = yield self.talk(script, root="proj")
        self.assertEqual(refused["error"]["data"]["code"], "path_not_allowed")
        self.assertIn("/etc/passwd", refused["error"]["message"])
        self.assertIn("rule", refused["error"]["data"])
        self.assertNotIn("result", refused)
        self.assertEqual(told["params"]["type"], 1)
        self.assertIn("textDocument/didOpen", told["params"]["message"])
        about_outside = [
            m
            for m in seen
            if m.get("method") == "textDocument/publishDiagnostics"
            and m["params"]["uri"] == outside
        ]
        self.assertEqual(about_outside, [])

    @inlineCallbacks
    def test_links_out_of_the_boundary_are_refused_as_rest_refuses_them(
        self,
    ) -> Any:
        """
        A link in the project that leads out of the base directory is
        refused by its name, as ``POST /lsp/hover`` refuses it (403
        path_not_allowed): as the workspace of ``initialize`` and a
        request about a file through it get a JSON-RPC error with that
        code, and the server never quotes what lies behind it; a folder
        added through it, under a spelling pylsp also dispatches, is
        dropped with a logMessage.
        """
        self.write("proj/pyproject.toml", "")
        root = os.path.join(self.base_dir, "proj")
        outside = os.path.realpath(self.mktemp())
        os.makedirs(outside)
        with open(os.path.join(outside, "creds.py"), "w") as f:
            f.write("TOKEN = 'outside-the-boundary'\n")
        os.symlink(outside, os.path.join(root, "outlink"))
        os.symlink("/etc", os.path.join(root, "etclink"))
        rest = yield self.request(
            "POST",
            "/lsp/hover",
            {"path": "proj/outlink/creds.py", "line": 1, "column": 1},
        )
        self.assertEqual(rest.status, 403, rest.body)
        self.assertEqual(rest.json()["code"], "path_not_allowed")

        def script(editor: Editor) -> Any:
            linked = uri_of(os.path.join(root, "outlink"))
            rid = editor.request(
                "initialize",
                {"processId": None, "rootUri": linked, "capabilities": {}},
            )
            as_root = editor.answer(rid)
            editor.initialize(root)
            answers = [as_root]
            for path in ("outlink/creds.py", "etclink/passwd"):
                rid = editor.request(
                    "textDocument/documentSymbol",
                    {"textDocument": {"uri": uri_of(os.path.join(root, path))}},
                )
                answers.append(editor.answer(rid))
            editor.notify(
                "workspace/did_change_workspace_folders",
                {"event": {"added": [{"uri": linked, "name": "o"}], "removed": []}},
            )
            told = editor.until(lambda m: m.get("method") == "window/logMessage")
            return answers, told, editor.seen

        answers, told, seen = yield self.talk(script, root="proj")
        for answer in answers:
            self.assertNotIn("result", answer)
            self.assertEqual(answer["error"]["data"]["code"], "path_not_allowed")
        self.assertIn("did_change_workspace_folders", told["params"]["message"])
        heard = json.dumps(seen)
        self.assertNotIn("outside-the-boundary", heard)
        self.assertNotIn('"root"', heard)

    @inlineCallbacks
    def test_added_folder_outside_the_root_under_another_spelling(self) -> Any:
        """
        A workspace folder beside the root, added with a spelling of
        didChangeWorkspaceFolders that pylsp dispatches as well, is dropped
        with a logMessage naming the root, as the usual spelling is.
        """
        self.write("proj/pyproject.toml", "")
        self.write("other/x.py", "")
        root = os.path.join(self.base_dir, "proj")
        beside = uri_of(os.path.join(self.base_dir, "other"))

        def script(editor: Editor) -> Any:
            editor.initialize(root)
            told = []
            for method in (
                "workspace/did_change_workspace_folders",
                "Workspace/DidChangeWorkspaceFolders",
            ):
                editor.notify(
                    method,
                    {"event": {"added": [{"uri": beside, "name": "o"}], "removed": []}},
                )
                told.append(
                    editor.until(lambda m: m.get("method") == "window/logMessage")
                )
            return told

        told = yield self.talk(script, root="proj")
        for message in told:
            self.assertIn("outside this socket's root", message["params"]["message"])

    @inlineCallbacks
    def test_root_outside_the_socket_root_is_refused(self) -> Any:
        """An initialize whose rootUri lies outside the socket's root is refused, not passed on."""
        self.write("proj/pyproject.toml", "")
        self.write("other/x.py", "")

        def script(editor: Editor) -> Any:
            rid = editor.request(
                "initialize",
                {
                    "processId": None,
                    "rootUri": uri_of(os.path.join(self.base_dir, "other")),
                    "capabilities": {},
                },
            )
            return editor.answer(rid)

        answer = yield self.talk(script, root="proj")
        self.assertEqual(answer["error"]["data"]["code"], "path_not_allowed")
        self.assertIn("root", answer["error"]["message"])

    @inlineCallbacks
    def test_execute_command_refused(self) -> Any:
        """workspace/executeCommand is refused when params.lsp_commands does not name it."""
        self.write("proj/pyproject.toml", "")

        def script(editor: Editor) -> Any:
            editor.initialize(os.path.join(self.base_dir, "proj"))
            rid = editor.request(
                "workspace/executeCommand",
                {"command": "pylsp.anything", "arguments": []},
            )
            return editor.answer(rid)

        answer = yield self.talk(script, root="proj")
        self.assertEqual(
            answer["error"]["data"],
            {"code": "command_not_allowed", "rule": "default:params.lsp_commands"},
        )

    @inlineCallbacks
    def test_frames_that_are_not_json_objects(self) -> Any:
        """A frame that is not JSON is a parse error, one that is not an object an invalid request."""

        def script(editor: Editor) -> Any:
            editor.ws.send("this is not json")
            first = editor.until(lambda m: True)
            editor.ws.send("[1, 2]")
            second = editor.until(lambda m: True)
            return first, second

        first, second = yield self.talk(script)
        self.assertEqual((first["id"], first["error"]["code"]), (None, -32700))
        self.assertEqual((second["id"], second["error"]["code"]), (None, -32600))


def pylint_running(marker: str) -> dict[str, Any]:
    """
    pylsp settings that make its pylint plugin run a program creating
    ``marker`` (a script of its own: pylsp merges ``args`` as a set, in no
    fixed order).
    """
    script = marker + ".sh"
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\ntouch {marker}\ncat >/dev/null\n")
    os.chmod(script, 0o755)
    return {"pylsp": {"plugins": {"pylint": {"enabled": True, "executable": script}}}}


class OversizedTests(ConnectCase):
    """A message of the server's over max_message_bytes, on an editor's socket."""

    policy = lsp_policy(limits={"max_message_bytes": 200_000})

    def setUp(self) -> Any:
        fake_pylsp(self, {"FAKE_DIAGNOSTICS": "5000"})
        return super().setUp()

    @inlineCallbacks
    def test_oversized_diagnostics_are_dropped_and_told(self) -> Any:
        """
        Diagnostics of over a MB are not passed on, the editor is told
        with a logMessage naming the method and the size; the socket and
        the server live on: a hover after it is answered.
        """
        self.write("proj/pyproject.toml", "")
        path = self.write("proj/many.py", "x = 1\n")

        def script(editor: Editor) -> Any:
            editor.initialize(os.path.dirname(path))
            editor.open(path)
            told = editor.until(lambda m: m.get("method") == "window/logMessage")
            rid = editor.request(
                "textDocument/hover",
                {
                    "textDocument": {"uri": uri_of(path)},
                    "position": {"line": 0, "character": 0},
                },
            )
            return told, editor.answer(rid)

        told, hover = yield self.talk(script, root="proj")
        self.assertIn("textDocument/publishDiagnostics", told["params"]["message"])
        self.assertIn("max_message_bytes 200000", told["params"]["message"])
        self.assertIn("contents", hover["result"])


class SettingsCase(ConnectCase):
    """An editor that gives pylsp settings which run a command."""

    def markers(self, *names: str) -> list[str]:
        out = os.path.realpath(self.mktemp())
        os.makedirs(out)
        return [os.path.join(out, n) for n in names]

    def lint_with_settings(self, editor: Editor, markers: list[str]) -> Any:
        """
        Give pylsp settings that run a command, by every way an editor
        could: initializationOptions, didChangeConfiguration, the same
        under another spelling pylsp dispatches alike, and with positional
        params; then have a file linted, which runs the command if any
        got through.
        """
        by_init, by_change, by_alias, by_list = markers
        root = os.path.join(self.base_dir, "proj")
        rid = editor.request(
            "initialize",
            {
                "processId": None,
                "rootUri": uri_of(root),
                "capabilities": {},
                "initializationOptions": pylint_running(by_init),
            },
        )
        editor.answer(rid)
        editor.notify("initialized", {})
        editor.notify(
            "workspace/didChangeConfiguration",
            {"settings": pylint_running(by_change)},
        )
        editor.notify(
            "WORKSPACE/did_change_configuration",
            {"settings": pylint_running(by_alias)},
        )
        editor.notify(
            "workspace/didChangeConfiguration",
            [{"settings": pylint_running(by_list)}],  # type: ignore[arg-type]
        )
        bad = os.path.join(root, "bad.py")
        editor.open(bad)
        editor.diagnostics_of(uri_of(bad))
        # pylsp lints with every plugin before it publishes; a moment more
        # for a command it started to have created its file.
        time.sleep(1)
        return editor.seen


class SettingsTests(SettingsCase):
    """
    An editor's settings, which can name programs the server runs, are
    kept from the server by default: ``lsp:use`` runs no command.
    """

    @inlineCallbacks
    def test_settings_that_run_a_command_do_not_reach_the_server(self) -> Any:
        """
        No marker file is created: the settings were taken out (the editor
        told so with a logMessage naming params.lsp_settings), and the
        positional form was refused.
        """
        self.write("proj/pyproject.toml", "")
        self.write("proj/bad.py", "x = undefined_name\n")
        markers = self.markers("init", "change", "alias", "list")
        seen = yield self.talk(
            lambda editor: self.lint_with_settings(editor, markers), root="proj"
        )
        self.assertEqual([m for m in markers if os.path.exists(m)], [])
        logs = [
            m["params"]["message"]
            for m in seen
            if m.get("method") == "window/logMessage"
            and "sandboxd" in m["params"]["message"]
        ]
        self.assertEqual(sum("params.lsp_settings" in text for text in logs), 3, logs)
        self.assertTrue(any("must be an object" in text for text in logs), logs)


class SettingsAllowedTests(SettingsCase):
    """A policy that sets ``params.lsp_settings`` lets the editor's settings through."""

    policy = lsp_policy(params={"lsp_settings": True})

    @inlineCallbacks
    def test_settings_reach_the_server(self) -> Any:
        """The command pylint's settings name runs: the marker file is created."""
        self.write("proj/pyproject.toml", "")
        self.write("proj/bad.py", "x = undefined_name\n")
        markers = self.markers("init", "change", "alias", "list")
        yield self.talk(
            lambda editor: self.lint_with_settings(editor, markers), root="proj"
        )
        self.assertTrue(os.path.exists(markers[2]), markers)


#: A language server that asks its editor for settings, and for something
#: else, then writes down every message it is sent.
ASKING_SERVER = """\
import json, sys

log = open(sys.argv[1], "a")

def read():
    length = 0
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            sys.exit(0)
        if line in (b"\\r\\n", b"\\n"):
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return json.loads(sys.stdin.buffer.read(length))

def send(message):
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
    sys.stdout.buffer.flush()

while True:
    message = read()
    log.write(json.dumps(message) + "\\n")
    log.flush()
    if message.get("method") == "initialize":
        send({"id": message["id"], "result": {"capabilities": {}}})
        send({"id": 7, "method": "workspace/configuration",
              "params": {"items": [{"section": "python"}, {"section": "pylsp"}]}})
        send({"id": 8, "method": "window/workDoneProgress/create",
              "params": {"token": "t"}})
"""


class ConfigurationTests(ConnectCase):
    """The server's own requests for settings, and what may answer them."""

    def setUp(self) -> Any:
        self.bin = os.path.realpath(self.mktemp())
        os.makedirs(self.bin)
        self.log = os.path.join(self.bin, "received.jsonl")
        with open(os.path.join(self.bin, "server.py"), "w") as f:
            f.write(ASKING_SERVER)
        with open(os.path.join(self.bin, "pylsp"), "w") as f:
            f.write(
                f"#!/bin/sh\nexec {sys.executable} {self.bin}/server.py {self.log}\n"
            )
        os.chmod(os.path.join(self.bin, "pylsp"), 0o755)
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = self.bin + os.pathsep + path
        self.addCleanup(os.environ.__setitem__, "PATH", path)
        return super().setUp()

    def received(self) -> list[dict[str, Any]]:
        """What the server was sent, once the editor's last notification came."""
        for _ in range(WAIT * 10):
            if os.path.exists(self.log):
                with open(self.log) as f:
                    got = [json.loads(line) for line in f]
                if any(m.get("method") == "test/done" for m in got):
                    return got
            time.sleep(0.1)
        raise AssertionError("the server never got test/done")

    @inlineCallbacks
    def test_settings_asked_for_are_none(self) -> Any:
        """
        The relay answers workspace/configuration itself, with no
        settings; the editor never sees it, and its own answer to that id,
        sent anyway, is dropped and it is told; its answer to the server's
        other request goes through.
        """

        def script(editor: Editor) -> Any:
            editor.initialize(self.base_dir)
            editor.until(lambda m: m.get("method") == "window/workDoneProgress/create")
            editor.send({"id": 7, "result": [{"pythonPath": "/evil"}, None]})
            told = editor.until(lambda m: m.get("method") == "window/logMessage")
            editor.notify("test/done", {})
            return told, self.received(), editor.seen

        told, received, seen = yield self.talk(script)
        self.assertNotIn("workspace/configuration", [m.get("method") for m in seen])
        answers = {m["id"]: m for m in received if "method" not in m}
        self.assertEqual(answers[7]["result"], [None, None])
        self.assertEqual(answers[8]["result"], None)
        self.assertEqual(sum(1 for m in received if m.get("id") == 7), 1)
        self.assertNotIn("/evil", json.dumps(received))
        self.assertIn("no request of that id", told["params"]["message"])


class LifeTests(ConnectCase):
    """Each socket's server lives and dies with it."""

    @inlineCallbacks
    def test_closing_the_socket_ends_the_server(self) -> Any:
        """A socket has a pylsp of its own; once the editor closes, that process is gone."""
        before = server_pids()

        def script(editor: Editor) -> Any:
            editor.initialize(self.base_dir)
            mine = server_pids() - before
            editor.ws.close()
            return mine

        mine = yield self.talk(script)
        self.assertEqual(len(mine), 1, mine)
        [pid] = mine
        for _ in range(200):
            if not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))
        reply = yield self.request("GET", "/lsp/sessions")
        self.assertEqual(reply.json()["sessions"], [])

    @inlineCallbacks
    def test_server_exit_closes_1011(self) -> Any:
        """A server killed under the socket closes it with 1011 and a reason naming the signal."""
        before = server_pids()

        def script(editor: Editor) -> Any:
            editor.initialize(self.base_dir)
            [pid] = server_pids() - before
            os.kill(pid, signal.SIGKILL)
            return editor.close_frame()

        code, reason = yield self.talk(script)
        yield close_timers()
        self.assertEqual(code, 1011)
        self.assertIn("SIGKILL", reason)

    @inlineCallbacks
    def test_daemon_stop_closes_the_socket(self) -> Any:
        """The daemon's stop closes the socket (1001) and leaves no server behind."""
        before = server_pids()
        ws = yield deferToThread(self.connect)
        editor = Editor(ws)
        yield deferToThread(editor.initialize, self.base_dir)
        [pid] = server_pids() - before
        closed = deferToThread(editor.close_frame)
        yield self.daemon.stop()
        code, _ = yield closed
        yield close_timers()
        self.assertEqual(code, 1001)
        self.assertFalse(alive(pid))


class HandshakeTests(ConnectCase):
    """What is refused before any upgrade."""

    policy = lsp_policy(limits={"max_sessions": 1})

    @inlineCallbacks
    def test_plain_get(self) -> Any:
        """A GET without the upgrade is 400 invalid_param saying to send it."""
        reply = yield self.request("GET", "/lsp/connect?language=python")
        self.assertEqual((reply.status, reply.json()["code"]), (400, "invalid_param"))
        self.assertIn("Upgrade: websocket", reply.json()["error"])

    @inlineCallbacks
    def test_no_server_named(self) -> Any:
        """Neither server nor language: 400 before any upgrade."""
        status, body = yield self.refused(language="")
        self.assertEqual((status, body["code"]), (400, "invalid_param"))

    @inlineCallbacks
    def test_max_sessions_counts_rest_sessions(self) -> Any:
        """
        With max_sessions 1 and an idle REST session running, a socket's
        server takes its place (the session is stopped); a REST session is
        then 429, as an open socket's server is never stopped for room.
        """
        self.write("proj/pyproject.toml", "")
        reply = yield self.request(
            "POST", "/lsp/sessions", {"language": "python", "root": "proj"}
        )
        self.assertEqual(reply.status, 201, reply.body)
        ws = yield deferToThread(self.connect, root="proj")
        gone = yield self.request("GET", f"/lsp/sessions/{reply.json()['id']}")
        self.assertEqual(gone.status, 404)
        again = yield self.request(
            "POST", "/lsp/sessions", {"language": "python", "root": "proj"}
        )
        self.assertEqual(
            (again.status, again.json()["code"]), (429, "too_many_sessions")
        )
        yield deferToThread(ws.close)


class ScopeTests(ConnectCase):
    """The gate decides before any upgrade."""

    policy = {
        **lsp_policy(),
        "auth": {
            "tokens": [
                {"id": "editor", "token_env": "EDITOR", "scopes": ["lsp:use"]},
                {"id": "reader", "token_env": "READER", "scopes": ["files:read"]},
                {
                    "id": "minter",
                    "token_env": "MINTER",
                    "scopes": ["lsp:use", "links:mint"],
                },
            ]
        },
    }
    environ = {
        "EDITOR": "editor-token",
        "READER": "reader-token",
        "MINTER": "minter-token",
    }

    @inlineCallbacks
    def test_token_and_scope(self) -> Any:
        """No token is 401, a token without lsp:use 403; the right one connects."""
        status, body = yield self.refused()
        self.assertEqual((status, body["code"]), (401, "unauthorized"))
        status, body = yield self.refused("reader-token")
        self.assertEqual((status, body["code"]), (403, "missing_scope"))
        ws = yield deferToThread(self.connect, "editor-token")
        yield deferToThread(ws.close)

    @inlineCallbacks
    def test_token_in_the_query(self) -> Any:
        """A browser's socket passes its token as access_token; a wrong one is 401."""
        ws = yield deferToThread(self.connect, access_token="editor-token")
        yield deferToThread(ws.close)
        status, body = yield self.refused(access_token="not-a-token")
        self.assertEqual((status, body["code"]), (401, "unauthorized"))
        status, body = yield self.refused(access_token="reader-token")
        self.assertEqual((status, body["code"]), (403, "missing_scope"))

    @inlineCallbacks
    def test_link_in_the_query(self) -> Any:
        """A page passes a short-lived link, not the token; a revoked link is 401."""
        reply = yield self.request(
            "POST",
            "/auth/links",
            {"audience": "console", "scopes": ["lsp:use"], "ttl_seconds": 60},
            token="minter-token",
        )
        self.assertEqual(reply.status, 201, reply.body)
        link = reply.json()
        ws = yield deferToThread(self.connect, access_token=link["token"])
        yield deferToThread(ws.close)
        yield self.request(
            "DELETE", f"/auth/links/{link['link_id']}", token="minter-token"
        )
        status, body = yield self.refused(access_token=link["token"])
        self.assertEqual((status, body["code"]), (401, "link_invalid"))


class OffTests(DaemonTestCase):
    """The group is off unless the policy turns it on."""

    @inlineCallbacks
    def test_off_by_default(self) -> Any:
        """Without the lsp group the upgrade is 404 endpoint_disabled."""
        need_client()
        key = base64.b64encode(os.urandom(16)).decode()
        reply = yield self.request(
            "GET",
            "/lsp/connect?language=python",
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": key,
                "Sec-WebSocket-Version": "13",
            },
        )
        self.assertEqual(
            (reply.status, reply.json()["code"]), (404, "endpoint_disabled")
        )


class ReloadTests(ConnectCase):
    """A policy reload closes the editors' sockets it no longer lets in."""

    autostart = False

    def setUp(self) -> Any:
        super().setUp()
        return self.start_on_policy_file(lsp_policy())

    @inlineCallbacks
    def test_lsp_switched_off_closes_1008(self) -> Any:
        """
        A reload that turns the lsp group off closes an open editor's
        socket 1008 saying why, and its server ends with it.
        """
        before = server_pids()
        ws = yield deferToThread(self.connect)
        editor = Editor(ws)
        yield deferToThread(editor.initialize, self.base_dir)
        [pid] = server_pids() - before
        closed = deferToThread(editor.close_frame)
        self.reload_policy({**lsp_policy(), "groups": {"lsp": False}})
        code, reason = yield closed
        yield close_timers()
        self.assertEqual(code, 1008)
        self.assertIn("lsp_connect", reason)
        for _ in range(50):
            if not alive(pid):
                break
            yield deferLater(reactor, 0.1, lambda: None)
        self.assertFalse(alive(pid))
