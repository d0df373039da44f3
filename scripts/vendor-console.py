#!/usr/bin/env python3
"""
Re-fetch the web console's vendored JavaScript from npm, check it, and
write ``sandboxd/webui/static/vendor/VENDOR.json``.

The console ships xterm.js and its fit add-on inside the Python package:
an sdist must not need npm at install time, and a sandbox may be offline
(no CDN at run time).  This script is how those files get there: ``npm
pack`` each pinned version into a temporary directory, check the tarball
against the integrity hash pinned below (npm's ``sha512-`` form), copy the
few files the console loads, and record each file's SHA-256 in the
manifest, which ``tests/webui/test_vendor.py`` re-hashes.

Run it from the repository root: ``python3 scripts/vendor-console.py``.
Bumping a version means changing the pin and its integrity here (``npm
view @xterm/xterm@X dist.integrity``) and committing the new files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "sandboxd" / "webui" / "static" / "vendor"

#: package -> (version, npm integrity of the tarball, {path in tarball: file name})
PINS: dict[str, tuple[str, str, dict[str, str]]] = {
    "@xterm/xterm": (
        "6.0.0",
        "sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==",
        {
            "package/lib/xterm.mjs": "xterm.mjs",
            "package/css/xterm.css": "xterm.css",
            "package/LICENSE": "xterm.LICENSE",
        },
    ),
    "@xterm/addon-fit": (
        "0.11.0",
        "sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==",
        {
            "package/lib/addon-fit.mjs": "addon-fit.mjs",
            "package/LICENSE": "addon-fit.LICENSE",
        },
    ),
}


def integrity(data: bytes) -> str:
    """npm's integrity string (SRI, sha512) of a tarball."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def strip_source_map(data: bytes) -> bytes:
    """
    Drop a trailing ``sourceMappingURL`` comment: the map is not shipped,
    and a browser with its developer tools open would ask for it.
    """
    lines = data.rstrip(b"\n").split(b"\n")
    if lines and lines[-1].startswith(b"//# sourceMappingURL="):
        lines = lines[:-1]
    return b"\n".join(lines) + b"\n"


def fetch(package: str, version: str, work: Path) -> Path:
    """``npm pack`` one pinned version into ``work``; the tarball's path."""
    out = subprocess.run(
        [
            "npm",
            "pack",
            f"{package}@{version}",
            "--json",
            "--pack-destination",
            str(work),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return work / json.loads(out.stdout)[0]["filename"]


def main() -> int:
    """Fetch, check, copy, and write the manifest."""
    manifest: dict[str, object] = {"packages": []}
    packages: list[dict[str, object]] = []
    VENDOR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for package, (version, pinned, files) in PINS.items():
            tarball = fetch(package, version, Path(tmp))
            got = integrity(tarball.read_bytes())
            if got != pinned:
                print(
                    f"{package}@{version}: integrity {got} != pinned {pinned}",
                    file=sys.stderr,
                )
                return 1
            hashes: dict[str, str] = {}
            with tarfile.open(tarball) as tar:
                for member, name in files.items():
                    extracted = tar.extractfile(member)
                    if extracted is None:
                        print(f"{package}: {member} missing", file=sys.stderr)
                        return 1
                    data = extracted.read()
                    if name.endswith(".mjs"):
                        data = strip_source_map(data)
                    (VENDOR / name).write_bytes(data)
                    hashes[name] = hashlib.sha256(data).hexdigest()
            packages.append(
                {
                    "package": package,
                    "version": version,
                    "integrity": pinned,
                    "files": hashes,
                }
            )
            print(f"{package}@{version}: {', '.join(hashes)}")
    manifest["packages"] = packages
    (VENDOR / "VENDOR.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(VENDOR / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
