"""
The vendored xterm.js files are exactly what the vendoring script fetched
from npm: every file re-hashed against VENDOR.json, whose packages and
integrity hashes are the script's pins.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.webui.assets import STATIC

ROOT = Path(__file__).resolve().parents[2]
VENDOR = STATIC / "vendor"


def _script() -> object:
    spec = importlib.util.spec_from_file_location(
        "vendor_console", ROOT / "scripts" / "vendor-console.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class VendorTests(SynchronousTestCase):
    """The committed vendor files against their manifest."""

    def test_files_match_manifest(self) -> None:
        """Each vendored file's SHA-256 is the manifest's, and no file is unlisted."""
        manifest = json.loads((VENDOR / "VENDOR.json").read_text())
        listed: set[str] = set()
        for package in manifest["packages"]:
            for name, digest in package["files"].items():
                listed.add(name)
                data = (VENDOR / name).read_bytes()
                self.assertEqual(hashlib.sha256(data).hexdigest(), digest, name)
        present = {p.name for p in VENDOR.iterdir() if p.is_file()} - {"VENDOR.json"}
        self.assertEqual(present, listed)

    def test_manifest_matches_pins(self) -> None:
        """The manifest names the script's pinned versions and npm integrity hashes."""
        manifest = json.loads((VENDOR / "VENDOR.json").read_text())
        pins = _script().PINS  # type: ignore[attr-defined]
        got = {
            p["package"]: (p["version"], p["integrity"]) for p in manifest["packages"]
        }
        self.assertEqual(got, {name: (v, i) for name, (v, i, _) in pins.items()})
        self.assertTrue(all(i.startswith("sha512-") for _, i in got.values()))


class PackagingTests(SynchronousTestCase):
    """The console's files travel in the wheel and the sdist."""

    def test_package_data_covers_static(self) -> None:
        """Every file under static/ matches setup.cfg's package_data for sandboxd.webui."""
        import configparser
        import fnmatch

        config = configparser.ConfigParser()
        config.read(ROOT / "setup.cfg")
        self.assertIn("sandboxd.webui", config["options"]["packages"].split())
        patterns = config["options.package_data"]["sandboxd.webui"].split()
        package = STATIC.parent
        for path in STATIC.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                relative = path.relative_to(package).as_posix()
                self.assertTrue(
                    any(fnmatch.fnmatch(relative, p) for p in patterns), relative
                )

    def test_manifest_covers_static(self) -> None:
        """MANIFEST.in includes every static file's suffix, for the sdist."""
        line = next(
            ln
            for ln in (ROOT / "MANIFEST.in").read_text().splitlines()
            if ln.startswith("recursive-include sandboxd/webui/static")
        )
        patterns = line.split()[2:]
        import fnmatch

        for path in STATIC.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                self.assertTrue(
                    any(fnmatch.fnmatch(path.name, p) for p in patterns), path.name
                )
