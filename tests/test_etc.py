"""
The files under etc/ that operators copy: each is parsed and checked for the
promises it makes (policies valid under --strict, probes using the
healthcheck, tini as PID 1, reload wired to SIGHUP).
"""

from __future__ import annotations

import configparser
import glob
import io
import json
import os
import shlex

import yaml
from twisted.trial.unittest import SynchronousTestCase

from sandboxd import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETC = os.path.join(ROOT, "etc")

DOCKER_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def dockerfile_instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            full = (pending + line).strip()
            pending = ""
            word, _, rest = full.partition(" ")
            out.append((word, rest.strip()))
    return out


class PolicyFileTests(SynchronousTestCase):
    """Every shipped policy validates with check-config --strict."""

    def test_policies_strict(self) -> None:
        """etc/policy.json, etc/container/policy.json and every example pass --strict."""
        paths = [
            os.path.join(ETC, "policy.json"),
            os.path.join(ETC, "container", "policy.json"),
        ]
        paths += sorted(glob.glob(os.path.join(ETC, "examples", "*.json")))
        self.assertGreaterEqual(len(paths), 8)
        os.environ["SANDBOXD_CI_TOKEN"] = "x"
        self.addCleanup(os.environ.pop, "SANDBOXD_CI_TOKEN", None)
        for path in paths:
            with open(path) as f:
                doc = json.load(f)
            # A token_file exists on a real sandbox only; check the rest.
            tokens = doc.get("auth", {}).get("tokens", [])
            tokens[:] = [t for t in tokens if "token_file" not in t]
            tmp = self.mktemp() + ".json"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            options = cli.CheckConfigOptions()
            options.parseOptions(["--policy", tmp, "--base-dir", "/tmp", "--strict"])
            out = io.StringIO()
            self.assertEqual(
                cli.check_config(options, out), 0, f"{path}: {out.getvalue()}"
            )

    def test_presets_examples_name_their_preset(self) -> None:
        """Each preset example really selects its preset."""
        for name in ("default", "transfer-only", "read-only", "hardened", "locked"):
            with open(os.path.join(ETC, "examples", f"{name}.json")) as f:
                self.assertEqual(json.load(f)["preset"], name)


class DockerfileTests(SynchronousTestCase):
    """The container image's Dockerfile."""

    def setUp(self) -> None:
        self.instructions = dockerfile_instructions(
            os.path.join(ETC, "container", "Dockerfile")
        )

    def test_known_instructions(self) -> None:
        """Every line is a Dockerfile instruction and it starts with FROM."""
        self.assertEqual(self.instructions[0][0], "FROM")
        for word, _ in self.instructions:
            self.assertIn(word, DOCKER_INSTRUCTIONS)

    def test_tini_healthcheck_plugin_cache(self) -> None:
        """tini is PID 1, HEALTHCHECK uses sandboxd healthcheck, the plugin cache is built."""
        by_word: dict[str, list[str]] = {}
        for word, rest in self.instructions:
            by_word.setdefault(word, []).append(rest)
        entrypoint = json.loads(by_word["ENTRYPOINT"][0])
        self.assertIn("tini", entrypoint[0])
        self.assertIn(
            "sandboxd healthcheck", by_word["HEALTHCHECK"][0].replace('", "', " ")
        )
        self.assertTrue(any("getPlugins" in r for r in by_word["RUN"]))
        cmd = json.loads(by_word["CMD"][0])
        self.assertEqual(cmd[:2], ["twistd", "--nodaemon"])
        self.assertIn("--pidfile=", cmd)
        self.assertTrue(any("useradd" in r for r in by_word["RUN"]))


class SystemdTests(SynchronousTestCase):
    """The systemd unit."""

    def test_unit(self) -> None:
        """Type=exec, twistd in the foreground without a pidfile, reload by SIGHUP."""
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(os.path.join(ETC, "systemd", "sandboxd.service"))
        service = parser["Service"]
        self.assertEqual(service["Type"], "exec")
        argv = shlex.split(service["ExecStart"].replace("\\\n", " "))
        self.assertTrue(argv[0].endswith("twistd"))
        self.assertIn("--nodaemon", argv)
        self.assertIn("--pidfile=", argv)
        self.assertIn("sandboxd", argv)
        self.assertIn("-HUP", service["ExecReload"])
        self.assertEqual(parser["Install"]["WantedBy"], "multi-user.target")


class KubernetesTests(SynchronousTestCase):
    """The Kubernetes example."""

    def test_manifest(self) -> None:
        """Probes run the healthcheck; the token is a file from a Secret; ports are named."""
        with open(os.path.join(ETC, "kubernetes", "sandboxd.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        kinds = {d["kind"] for d in docs}
        self.assertEqual(kinds, {"Secret", "Pod", "Service"})
        pod = next(d for d in docs if d["kind"] == "Pod")
        container = pod["spec"]["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(
                container[probe]["exec"]["command"][:2], ["sandboxd", "healthcheck"]
            )
        env = {e["name"]: e.get("value") for e in container["env"]}
        self.assertIn("ABX_SERVER_TOKEN_FILE", env)
        self.assertNotIn("ABX_SERVER_TOKEN", env)
        self.assertEqual({p["containerPort"] for p in container["ports"]}, {9000, 9001})
        self.assertFalse(container["securityContext"]["allowPrivilegeEscalation"])
