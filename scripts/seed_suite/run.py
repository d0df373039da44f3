"""
The seed's own test suites, run against sandboxd.

agent-sandbox-server and its SDK agent-sandbox-client publish their
tests in their source distributions. Those that start a server and talk
to it (the server's HTTP tests, and the SDK's ``ServerClient`` tests
against a live server) are run here with ``live.py`` in place of their
live-server helpers, so that every server they start is a sandboxd
child: what the seed's authors check their server does, and what their
SDK expects of it, checked on ours.

Each such test that sandboxd does not pass is either listed in
``differences.txt`` with the reason (sandboxd is stricter on purpose,
or the test reaches into the seed's own process) or a failure of this
run. A listed test that passes is a failure too, so the list stays true.

Usage: ``python scripts/seed_suite/run.py [-j N] [--keep DIR] [pytest args...]``
(``make test`` runs it). The source distributions are downloaded once
with pip into ``.venv/seed-suite/`` and checked against pinned digests.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.4.0a6"
HERE = Path(__file__).resolve().parent
CACHE = Path(sys.prefix) / "seed-suite"
#: A test that runs longer than this fails (each starts its own daemon).
TEST_TIMEOUT = 60


@dataclass(frozen=True)
class Suite:
    """One published test suite and where its live-server helpers are."""

    name: str
    distribution: str
    sha256: str
    #: the folder of its tests that start servers, and its helper module there
    folder: str
    helper: str
    #: a test module that mentions one of these starts a server (none: all do)
    markers: tuple[str, ...]

    @property
    def archive(self) -> str:
        return f"{self.distribution.replace('-', '_')}-{VERSION}.tar.gz"

    @property
    def top(self) -> str:
        return f"{self.distribution.replace('-', '_')}-{VERSION}/"


SUITES = (
    Suite(
        "server",
        "agent-sandbox-server",
        "812388ba126973e7ab5911214eaacdd7b352a6ef81356a2ce099e2af3341e6c3",
        "tests/test_server",
        "_live.py",
        ("wire(", "live_server"),
    ),
    Suite(
        "client",
        "agent-sandbox-client",
        "bf57cae0eb81dc1a95a9e7ed4862ec3af15e7b5dba2d6283b9be2bced4616aa6",
        "tests/test_api/server_e2e",
        "_live.py",
        (),
    ),
)


def archive(suite: Suite) -> Path:
    """A suite's source distribution, downloaded on first use and verified."""
    path = CACHE / suite.archive
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(CACHE),
                f"{suite.distribution}=={VERSION}",
            ],
            check=True,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != suite.sha256:
        path.unlink()
        sys.exit(
            f"seed suite: {suite.archive} has sha256 {digest}, expected {suite.sha256}"
        )
    return path


def unpack(suite: Suite, scratch: Path) -> Path:
    """The suite's ``tests`` package and pytest settings, with our helpers in."""
    with tarfile.open(archive(suite)) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(suite.top + "tests/")
            or m.name == suite.top + "pyproject.toml"
        ]
        tar.extractall(scratch, members=members, filter="data")
    root = scratch / suite.top
    shutil.copyfile(HERE / "live.py", root / suite.folder / suite.helper)
    return root


def live_modules(suite: Suite, root: Path) -> list[str]:
    """The test modules that start a server (the others test the package's internals)."""
    found = []
    for path in sorted((root / suite.folder).glob("test_*.py")):
        text = path.read_text()
        if not suite.markers or any(marker in text for marker in suite.markers):
            found.append(str(path.relative_to(root)))
    return found


def differences() -> dict[str, str]:
    """``differences.txt``: test id -> why sandboxd answers otherwise."""
    listed: dict[str, str] = {}
    for line in (HERE / "differences.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        test, _, why = line.partition("  ")
        listed[test.strip()] = why.strip()
    return listed


def outcomes(suite: Suite, report: Path) -> dict[str, tuple[str, str]]:
    """JUnit XML -> ``suite:test id`` -> (passed|failed|skipped, first line of why)."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # classname is tests.test_server.test_x[.TestClass]
        split = next(i for i, p in enumerate(parts) if p.startswith("test_") and i > 1)
        path = "/".join(parts[: split + 1]) + ".py"
        test = (
            suite.name
            + ":"
            + "::".join([path, *parts[split + 1 :], case.get("name", "")])
        )
        state, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
                why = (
                    (child.get("message") or "").splitlines()[0][:200]
                    if child.get("message")
                    else ""
                )
            elif child.tag == "skipped":
                state = "skipped"
        found[test] = (state, why)
    return found


def run(
    suite: Suite, jobs: int, extra: list[str], scratch: Path
) -> dict[str, tuple[str, str]]:
    """Run one suite's server tests against sandboxd; its outcomes by test id."""
    root = unpack(suite, scratch)
    report = scratch / f"{suite.name}.xml"
    # The seed's default base dir is /home/user, which a test machine may
    # not have: sandboxd refuses to start without its base dir, where the
    # seed starts anyway (see the migration page). Tests that need a
    # particular one set it themselves.
    home = scratch / "home-user"
    home.mkdir()
    env = dict(os.environ)
    env["SEED_SUITE_SANDBOXD"] = shlex.join([sys.executable, "-m", "sandboxd"])
    env["ABX_SERVER_BASE_DIR"] = str(home)
    daemons = scratch / "daemons"
    daemons.mkdir()
    env["SEED_SUITE_SCRATCH"] = str(daemons)
    env.pop("ABX_SERVER_TOKEN", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
        f"--timeout={TEST_TIMEOUT}",
        f"--junitxml={report}",
        "-n",
        str(jobs),
        *extra,
        *live_modules(suite, root),
    ]
    subprocess.run(command, cwd=root, env=env, stdout=subprocess.DEVNULL)
    if not report.exists():
        sys.exit(f"seed suite: pytest wrote no report for {suite.distribution}")
    return outcomes(suite, report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="unpack and run in DIR (a new folder) and leave it: the tests, "
        "and each daemon's policy and log under SUITE/daemons/",
    )
    args, extra = parser.parse_known_args()
    found: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="seed-suite-") as scratch:
        where = Path(args.keep or scratch)
        where.mkdir(exist_ok=args.keep is None)
        for suite in SUITES:
            folder = where / suite.name
            folder.mkdir()
            found.update(run(suite, args.jobs, extra, folder))
    listed = differences()
    unexpected = {
        t: w for t, (s, w) in found.items() if s == "failed" and t not in listed
    }
    stale = sorted(t for t, (s, _) in found.items() if s == "passed" and t in listed)
    # Extra pytest arguments (-k ...) may leave listed tests out on purpose.
    missing = [] if extra else sorted(t for t in listed if t not in found)
    counts = {
        s: sum(1 for v in found.values() if v[0] == s)
        for s in ("passed", "failed", "skipped")
    }
    print(
        f"the seed's suites {VERSION}: {len(found)} tests, {counts['passed']} passed, "
        f"{counts['failed']} failed ({counts['failed'] - len(unexpected)} listed in differences.txt), "
        f"{counts['skipped']} skipped"
    )
    for test, why in sorted(unexpected.items()):
        print(f"  FAILED (not a listed difference) {test}: {why}")
    for test in stale:
        print(f"  PASSES NOW (remove it from differences.txt) {test}")
    for test in missing:
        print(f"  NOT RUN (listed in differences.txt) {test}")
    if unexpected and not args.keep:
        print("  (run again with --keep DIR to keep the tests and each daemon's log)")
    return 1 if unexpected or stale or missing else 0


if __name__ == "__main__":
    sys.exit(main())
