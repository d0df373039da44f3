"""
The policy matrix, in the style of OpenSSH's sftp-perm.sh: every changing
operation under several policies, checked by what happened on disk, not
only by the status.  And the same decision asked of /capabilities/check
beforehand must agree with what the real call did.
"""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import inlineCallbacks

from tests.helpers import DaemonTestCase

ADMIN = "admin-token"
LIMITED = "limited-token"


def tar_gz(name: str, data: bytes) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def exists(*parts: str) -> Callable[[str], bool]:
    return lambda base: os.path.exists(os.path.join(base, *parts))


def gone(*parts: str) -> Callable[[str], bool]:
    return lambda base: not os.path.exists(os.path.join(base, *parts))


# id, method, path, body (JSON or raw bytes), paths it touches (for check), what changes on disk
OPERATIONS: list[tuple[str, str, str, Any, list[str], Callable[[str], bool]]] = [
    (
        "upload",
        "POST",
        "/upload",
        {"path": "w/new.txt", "content_base64": "aGk="},
        ["w/new.txt"],
        exists("w", "new.txt"),
    ),
    (
        "files_upload_stream",
        "POST",
        "/files/upload-stream",
        {"path": "w/s.txt", "content_base64": "aGk="},
        ["w/s.txt"],
        exists("w", "s.txt"),
    ),
    (
        "files_write_raw",
        "POST",
        "/files/raw?path=w/raw.txt",
        b"raw bytes",
        ["w/raw.txt"],
        exists("w", "raw.txt"),
    ),
    (
        "files_mkdir",
        "POST",
        "/files/mkdir",
        {"path": "w/dir"},
        ["w/dir"],
        exists("w", "dir"),
    ),
    (
        "files_delete",
        "DELETE",
        "/files?path=w/victim.txt",
        None,
        ["w/victim.txt"],
        gone("w", "victim.txt"),
    ),
    (
        "files_move",
        "POST",
        "/files/move",
        {"source": "w/victim.txt", "destination": "w/moved.txt"},
        ["w/victim.txt", "w/moved.txt"],
        exists("w", "moved.txt"),
    ),
    (
        "files_extract",
        "POST",
        "/files/extract",
        {
            "content_base64": tar_gz("x.txt", b"x"),
            "format": "tar.gz",
            "destination": "w/ex",
        },
        ["w/ex"],
        exists("w", "ex", "x.txt"),
    ),
    (
        "shell",
        "POST",
        "/shell",
        {"command": "touch made.txt", "cwd": "w"},
        ["w"],
        exists("w", "made.txt"),
    ),
]

# name, policy, token, whether the change must happen
CONFIGS: list[tuple[str, dict[str, Any], str, bool]] = [
    ("plain", {}, ADMIN, True),
    ("endpoint disabled", {"endpoints": {"{op}": {"enabled": False}}}, ADMIN, False),
    ("scope lacking", {}, LIMITED, False),
    # A glob: under a plain directory the relative paths below would be
    # taken from that directory (as agent-sandbox-server takes them).
    (
        "paths allow elsewhere",
        {"endpoints": {"{op}": {"paths": {"allow": ["elsewhere/**"]}}}},
        ADMIN,
        False,
    ),
    ("read_only paths", {"defaults": {"paths": {"read_only": ["w"]}}}, ADMIN, False),
    ("read-only preset", {"preset": "read-only"}, ADMIN, False),
]

TOKENS = {
    "auth": {
        "tokens": [
            {"id": "admin", "token_env": "ADMIN_T", "scopes": ["*"]},
            {
                "id": "limited",
                "token_env": "LIMITED_T",
                "scopes": ["core:read", "files:read"],
            },
        ]
    }
}


def policy_for(config: dict[str, Any], op: str) -> dict[str, Any]:
    doc = json.loads(json.dumps(config).replace("{op}", op))
    doc.update(TOKENS)
    return dict(doc)


class PolicyMatrixTests(DaemonTestCase):
    """op x config, with filesystem postconditions and /capabilities/check agreement."""

    autostart = False
    timeout = 120

    def setUp(self) -> Any:
        super().setUp()
        os.makedirs(os.path.join(self.base_dir, "elsewhere"))

    def fresh(self) -> None:
        w = os.path.join(self.base_dir, "w")
        for root, dirs, files in os.walk(w, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            for name in dirs:
                os.rmdir(os.path.join(root, name))
        os.makedirs(w, exist_ok=True)
        with open(os.path.join(w, "victim.txt"), "w") as f:
            f.write("v")

    @inlineCallbacks
    def test_matrix(self) -> Any:
        """Each operation changes the disk exactly when its policy allows it."""
        failures = []
        for op, method, path, body, paths, changed in OPERATIONS:
            for name, config, token, allowed in CONFIGS:
                if op == "shell" and name == "read_only paths":
                    continue  # a shell's writes are the OS user's to police (docs/security.md)
                self.fresh()
                yield self.start(
                    policy=policy_for(config, op),
                    environ={"ADMIN_T": ADMIN, "LIMITED_T": LIMITED},
                    stop_at_end=False,
                )
                check = yield self.request(
                    "POST",
                    "/capabilities/check",
                    {"endpoint": op, "paths": paths},
                    token=ADMIN,
                )
                predicted = check.json()["allowed"] if token == ADMIN else False
                kwargs = {"raw_body": body} if isinstance(body, bytes) else {}
                reply = yield self.request(
                    method,
                    path,
                    None if isinstance(body, bytes) else body,
                    token=token,
                    **kwargs,
                )
                happened = changed(self.base_dir)
                yield self.daemon.stop()
                where = f"{op} / {name}: status {reply.status} {reply.body[:120]!r}"
                if happened != allowed:
                    failures.append(
                        f"{where}: change happened={happened}, expected {allowed}"
                    )
                if allowed and reply.status >= 400:
                    failures.append(f"{where}: refused")
                if not allowed and reply.status < 400:
                    failures.append(f"{where}: answered success")
                if (
                    not allowed
                    and reply.status >= 400
                    and reply.json().get("code") is None
                ):
                    failures.append(f"{where}: refusal without a code")
                if token == ADMIN and predicted != allowed:
                    failures.append(
                        f"{where}: /capabilities/check said allowed={predicted}"
                    )
        self.assertEqual(failures, [])
