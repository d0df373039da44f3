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
import re
import shlex
import subprocess

import yaml
from twisted.trial.unittest import SkipTest, SynchronousTestCase

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
        """etc/policy.json, the container and systemd policies and every example pass --strict."""
        paths = [
            os.path.join(ETC, "policy.json"),
            os.path.join(ETC, "container", "policy.json"),
            os.path.join(ETC, "systemd", "policy.json"),
        ]
        paths += sorted(glob.glob(os.path.join(ETC, "examples", "*.json")))
        self.assertGreaterEqual(len(paths), 8)
        os.environ["SANDBOXD_CI_TOKEN"] = "x"
        self.addCleanup(os.environ.pop, "SANDBOXD_CI_TOKEN", None)
        # The container and systemd policies name the user their image or
        # set-up creates; check-config looks users up on the machine it runs on.
        import pwd

        real = pwd.getpwnam
        self.patch(
            pwd,
            "getpwnam",
            lambda name: real("root") if name == "user" else real(name),
        )
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

    def test_ssh_kept_from_every_file_endpoint(self) -> None:
        """
        A shipped policy that keeps ``.ssh`` out keeps it out of every file
        endpoint: ``download`` and ``upload`` (the seed's names, which an
        MCP client uses most) as well as the ``files_*`` ones.
        """
        from sandboxd.policy import load_policy
        from sandboxd.policy.paths import decide
        from sandboxd.routes import default_table

        paths = [
            os.path.join(ETC, "policy.json"),
            os.path.join(ETC, "container", "policy.json"),
            os.path.join(ETC, "systemd", "policy.json"),
            os.path.join(ETC, "examples", "multi-token.json"),
        ]
        table = default_table()
        file_ops = [e for e in table if e.group == "file_ops"]
        self.assertIn("download", [e.id for e in file_ops])
        for path in paths:
            with open(path) as f:
                doc = json.load(f)
            doc.pop("auth", None)
            doc.pop("base_dir", None)
            doc.pop("default_user", None)
            policy = load_policy(table, explicit=doc, base_dir="/tmp", environ={})
            for endpoint in file_ops:
                rule = policy.rules[endpoint.id]
                decision = decide(rule, "/tmp/.ssh/id_rsa", "read")
                self.assertFalse(decision.allowed, f"{path}: {endpoint.id}")

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
        """
        tini is PID 1, HEALTHCHECK uses sandboxd healthcheck, the daemon is
        ``sandboxd serve``, the plugin cache is built (for twistd sandboxd).
        """
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
        self.assertEqual(cmd[:2], ["sandboxd", "serve"])
        self.assertIn("--policy", cmd)
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

    def setUp(self) -> None:
        with open(os.path.join(ETC, "kubernetes", "sandboxd.yaml")) as f:
            self.docs = [d for d in yaml.safe_load_all(f) if d]
        self.pod = next(d for d in self.docs if d["kind"] == "Pod")

    def test_manifest(self) -> None:
        """Probes run the healthcheck; the token is a file from a Secret; ports are named."""
        kinds = {d["kind"] for d in self.docs}
        self.assertEqual(kinds, {"Pod", "Service"})
        container = self.pod["spec"]["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(
                container[probe]["exec"]["command"][:2], ["sandboxd", "healthcheck"]
            )
        env = {e["name"]: e.get("value") for e in container["env"]}
        self.assertIn("ABX_SERVER_TOKEN_FILE", env)
        self.assertNotIn("ABX_SERVER_TOKEN", env)
        self.assertEqual({p["containerPort"] for p in container["ports"]}, {9000, 9001})
        self.assertFalse(container["securityContext"]["allowPrivilegeEscalation"])

    def test_pod_hardening(self) -> None:
        """
        No service-account token or service links reach the sandbox; the
        home volume and the container's ephemeral storage are bounded; the
        pod meets Pod Security "baseline" (and says it is not "restricted").
        """
        spec = self.pod["spec"]
        self.assertIs(spec["automountServiceAccountToken"], False)
        self.assertIs(spec["enableServiceLinks"], False)
        home = next(v for v in spec["volumes"] if v["name"] == "home")
        self.assertIn("sizeLimit", home["emptyDir"])
        container = spec["containers"][0]
        self.assertIn("ephemeral-storage", container["resources"]["limits"])
        # Baseline: no privileged container, no host namespaces or paths, only
        # the capabilities baseline allows to be added.
        baseline_caps = {
            "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
            "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP",
            "SETUID", "SYS_CHROOT",
        }  # fmt: skip
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            self.assertFalse(spec.get(key, False), key)
        self.assertFalse(any("hostPath" in v for v in spec["volumes"]))
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            ctx = c["securityContext"]
            self.assertFalse(ctx.get("privileged", False))
            self.assertLessEqual(set(ctx["capabilities"]["add"]), baseline_caps)
            self.assertEqual(ctx["seccompProfile"]["type"], "RuntimeDefault")
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            self.assertIn(
                "meets the `baseline` standard, not\n  `restricted`", f.read()
            )

    def test_no_secret_value(self) -> None:
        """The manifest carries no Secret, so `kubectl apply` cannot overwrite the real token."""
        for doc in self.docs:
            self.assertNotEqual(doc["kind"], "Secret")
            self.assertNotIn("stringData", doc)
            self.assertNotIn("data", doc)
        with open(os.path.join(ETC, "kubernetes", "sandboxd.yaml")) as f:
            self.assertNotIn("change-me", f.read())

    def test_docs_steps_in_order(self) -> None:
        """
        docs/operations.md creates the Secret the pod mounts, with the key its
        token file is named by, before applying the manifest; the image it
        builds is the one the pod runs.
        """
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            text = f.read()
        section = text[text.index("## Kubernetes") :]
        section = section[: section.index("\n## ", 1)]
        commands = [
            shlex.split(line.split("#")[0])
            for line in section.splitlines()
            if line.startswith(("kubectl ", "docker "))
        ]
        verbs = [" ".join(c[:3]) for c in commands]
        create = verbs.index("kubectl create secret")
        apply = verbs.index("kubectl apply -f")
        self.assertLess(create, apply)
        self.assertEqual(commands[apply][3], "etc/kubernetes/sandboxd.yaml")
        secret_name = commands[create][4]
        volumes = {v["name"]: v for v in self.pod["spec"]["volumes"]}
        container = self.pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        token_path = env["ABX_SERVER_TOKEN_FILE"]
        mounts = [
            m
            for m in container["volumeMounts"]
            if token_path.startswith(m["mountPath"] + "/")
        ]
        self.assertEqual(len(mounts), 1)
        self.assertEqual(
            volumes[mounts[0]["name"]]["secret"]["secretName"], secret_name
        )
        from_file = next(a for a in commands[create] if a.startswith("--from-file="))
        key = from_file.split("=", 2)[1]
        self.assertEqual(os.path.basename(token_path), key)
        build = next(c for c in commands if c[:2] == ["docker", "build"])
        tag = build[build.index("-t") + 1]
        images = {c["image"] for c in self.pod["spec"]["containers"]}
        images |= {c["image"] for c in self.pod["spec"].get("initContainers", [])}
        self.assertEqual(images, {tag})

    def test_image_tag(self) -> None:
        """A locally built image is named by this version, never :latest."""
        from sandboxd._version import __version__

        for c in self.pod["spec"]["containers"] + self.pod["spec"]["initContainers"]:
            self.assertEqual(c["image"], f"sandboxd:{__version__}")
            self.assertEqual(c["imagePullPolicy"], "IfNotPresent")

    def test_home_seeded(self) -> None:
        """The emptyDir at /home/user gets the image's /home/user copied in first."""
        init = self.pod["spec"]["initContainers"][0]
        self.assertEqual(init["command"][:2], ["cp", "-a"])
        self.assertEqual(init["command"][2], "/home/user/.")
        seed = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
        target = init["command"][3].rstrip("/")
        container = self.pod["spec"]["containers"][0]
        home = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        self.assertEqual(seed[target], home["/home/user"])

    def test_schema(self) -> None:
        """Every object validates against the Kubernetes API schema (kubernetes-validate)."""
        try:
            import kubernetes_validate
        except ImportError:
            raise SkipTest(
                "kubernetes-validate is not installed (pip install kubernetes-validate)"
            ) from None
        version = kubernetes_validate.latest_version()
        for doc in self.docs:
            kubernetes_validate.validate(doc, version, strict=True)


class ContainerContextTests(SynchronousTestCase):
    """What a `docker build` of the checkout takes, and the image's variants."""

    def test_syntax_for_newer_flags(self) -> None:
        """
        The Dockerfile uses ``HEALTHCHECK --start-interval``, which
        Dockerfile frontends before 1.6 refuse: its first line asks
        BuildKit for a current frontend.
        """
        with open(os.path.join(ETC, "container", "Dockerfile")) as f:
            text = f.read()
        self.assertIn("--start-interval", text)
        self.assertEqual(text.splitlines()[0], "# syntax=docker/dockerfile:1")

    def test_dockerignore(self) -> None:
        """The build context leaves out .venv, workspace/, test output and .git (both ignore files, equal)."""
        with open(os.path.join(ROOT, ".dockerignore")) as f:
            root = f.read()
        with open(os.path.join(ETC, "container", "Dockerfile.dockerignore")) as f:
            beside = f.read()
        self.assertEqual(root, beside)
        patterns = {line.strip() for line in root.splitlines() if line.strip()}
        patterns = {p for p in patterns if not p.startswith("#")}
        for needed in (".git", ".venv", "workspace", "_trial_temp*"):
            self.assertIn(needed, patterns)

    def test_browser_variant_and_loopback_run(self) -> None:
        """The Dockerfile says whether it has a browser, offers the variant, and its run example binds loopback."""
        with open(os.path.join(ETC, "container", "Dockerfile")) as f:
            text = f.read()
        instructions = dockerfile_instructions(
            os.path.join(ETC, "container", "Dockerfile")
        )
        self.assertIn(("ARG", "WITH_BROWSER=0"), instructions)
        runs = " ".join(rest for word, rest in instructions if word == "RUN")
        self.assertIn("chromium", runs)
        self.assertIn(",browser]", runs)
        self.assertIn("--build-arg WITH_BROWSER=1", text)
        examples = [
            line for line in text.splitlines() if line.startswith("#") and "-p " in line
        ]
        self.assertTrue(examples)
        for line in examples:
            self.assertNotRegex(line, r"-p (?!127\.0\.0\.1:)")


class SystemdHardeningTests(SynchronousTestCase):
    """The unit's hardening and what it says about it."""

    def test_no_new_privileges(self) -> None:
        """NoNewPrivileges is on (switching users works under it), and the unit says what the rest does to children."""
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        path = os.path.join(ETC, "systemd", "sandboxd.service")
        parser.read(path)
        self.assertEqual(parser["Service"]["NoNewPrivileges"], "yes")
        with open(path) as f:
            text = f.read()
        for setting in ("ProtectSystem", "PrivateTmp", "RestrictSUIDSGID"):
            self.assertIn(f"# - {setting}", text)
        self.assertIn("children", text)


class ReadmeTests(SynchronousTestCase):
    """The README's commands, read literally."""

    def setUp(self) -> None:
        with open(os.path.join(ROOT, "README.md")) as f:
            self.text = f.read()

    def test_token_recipe_runs_on_a_fresh_machine(self) -> None:
        """
        The "Running it for real" recipe makes /etc/sandboxd, writes the
        token under umask 077, installs a policy that names the children's
        user, and creates that user, before the daemon starts.
        """
        section = self.text[self.text.index("## Running it for real") :]
        opening = section.index("```sh")
        block = section[opening : section.index("```", opening + 5)]
        lines = [line for line in block.splitlines()[1:] if line.strip()]
        start = next(i for i, line in enumerate(lines) if "twistd" in line)
        before = "\n".join(lines[:start])
        self.assertIn("mkdir -p /etc/sandboxd", before)
        self.assertIn("umask 077", before)
        self.assertIn("etc/systemd/policy.json /etc/sandboxd/policy.json", before)
        self.assertIn("useradd", before)
        with open(os.path.join(ETC, "systemd", "policy.json")) as f:
            params = json.load(f)["defaults"]["params"]
        self.assertEqual(params["default_user"], "user")

    def test_unit_documentation_is_installed(self) -> None:
        """The page the unit's Documentation= names is installed by the documented steps."""
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read(os.path.join(ETC, "systemd", "sandboxd.service"))
        page = parser["Unit"]["Documentation"].removeprefix("file://")
        with open(os.path.join(ROOT, "docs", "operations.md")) as f:
            self.assertIn(f"docs/operations.md {page}", f.read())

    def test_where_the_commands_live(self) -> None:
        """It says the console scripts are in .venv/bin after make."""
        self.assertIn(".venv/bin/sandboxd", self.text)

    def test_make_serve_ports(self) -> None:
        """`make serve PORT=... PTY_PORT=...` moves both listeners."""
        result = subprocess.run(
            ["make", "-n", "serve", "PORT=9100", "PTY_PORT=9101"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        self.assertIn("tcp:9100:interface=127.0.0.1", result.stdout)
        self.assertIn("tcp:9101:interface=127.0.0.1", result.stdout)
        self.assertIn("PORT=9100", self.text)

    def test_token_recipe_needs_no_url_encoding(self) -> None:
        """The token recipe makes a value of URL-safe characters only."""
        [line] = [line for line in self.text.splitlines() if "head -c 32" in line]
        recipe = "head -c 32" + line.split("head -c 32", 1)[1].split(">", 1)[0]
        for _ in range(20):
            token = subprocess.run(
                ["sh", "-c", recipe], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            self.assertRegex(token, r"^[A-Za-z0-9_-]{40,}$")


class AgentSandboxTemplateTests(SynchronousTestCase):
    """The agent-sandbox runtime template (etc/kubernetes/agent-sandbox-template.yaml)."""

    def setUp(self) -> None:
        with open(os.path.join(ETC, "kubernetes", "agent-sandbox-template.yaml")) as f:
            self.docs = [d for d in yaml.safe_load_all(f) if d]
        self.config = next(d for d in self.docs if d["kind"] == "ConfigMap")
        self.template = next(d for d in self.docs if d["kind"] == "SandboxTemplate")
        self.spec = self.template["spec"]["podTemplate"]["spec"]
        self.container = self.spec["containers"][0]

    def test_warm_pool_names_the_template(self) -> None:
        """The pool the SDK claims from refers to the template by its name."""
        pool = next(d for d in self.docs if d["kind"] == "SandboxWarmPool")
        self.assertEqual(
            pool["spec"]["sandboxTemplateRef"]["name"],
            self.template["metadata"]["name"],
        )

    def secrets_here(self) -> tuple[str, dict[str, str]]:
        """
        The template's policy, as a file, and the container's environment,
        with the Secret's mount point moved to a directory here holding a
        file per key (the Secret's keys: ``token``, ``sdk-token``).
        """
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        secrets = os.path.abspath(self.mktemp())
        os.makedirs(secrets)
        for key in ("token", "sdk-token"):
            with open(os.path.join(secrets, key), "w") as f:
                f.write(f"{key}-value\n")
        text = self.config["data"]["policy.json"].replace(mounts["tokens"], secrets)
        path = self.mktemp() + ".json"
        with open(path, "w") as f:
            f.write(text)
        environ = {
            e["name"]: e["value"].replace(mounts["tokens"], secrets)
            for e in self.container["env"]
        }
        return path, environ

    def test_policy_passes_strict_with_the_sdk_token(self) -> None:
        """
        The policy passes ``check-config --strict`` in the container's
        environment (``ABX_SERVER_TOKEN_FILE``) with the Secret's files as
        mounted, the kep group on and calls without a credential standing
        for the SDK's token.
        """
        import pwd

        real = pwd.getpwnam
        self.patch(
            pwd, "getpwnam", lambda name: real("root") if name == "user" else real(name)
        )
        path, environ = self.secrets_here()
        for name, value in environ.items():
            self.addCleanup(os.environ.pop, name, None)
            os.environ[name] = value
        options = cli.CheckConfigOptions()
        options.parseOptions(["--policy", path, "--base-dir", "/tmp", "--strict"])
        out = io.StringIO()
        self.assertEqual(cli.check_config(options, out), 0, out.getvalue())
        doc = json.loads(self.config["data"]["policy.json"])
        self.assertEqual(doc["groups"], {"kep": True})
        self.assertEqual(doc["endpoints"]["kep"]["params"]["unauthenticated_as"], "sdk")

    def test_operator_token_logs_in(self) -> None:
        """
        The operators' token (the Secret's ``token``, the container's
        ``ABX_SERVER_TOKEN_FILE``) logs in with every scope; the SDK's
        token with the SDK's scopes only.
        """
        from sandboxd.policy import load_policy
        from sandboxd.routes import default_table

        path, environ = self.secrets_here()
        policy = load_policy(
            default_table(), path=path, base_dir="/tmp", environ=environ
        )
        operator = policy.tokens.identify(b"token-value")
        assert operator is not None, policy.warnings
        self.assertEqual(operator.scopes, frozenset({"*"}))
        sdk = policy.tokens.identify(b"sdk-token-value")
        assert sdk is not None
        self.assertEqual(sdk.id, "sdk")
        self.assertNotIn("*", sdk.scopes)
        self.assertEqual(
            [w for w in policy.warnings if "ABX_SERVER_TOKEN" in w], [], policy.warnings
        )

    def test_image_installs_the_grpc_library(self) -> None:
        """
        The image the template runs (etc/container/Dockerfile) installs the
        ``kep`` extra in every variant, since ``--kep-grpc-port`` refuses to
        start without it.
        """
        with open(os.path.join(ETC, "container", "Dockerfile")) as f:
            text = f.read()
        self.assertIn("--kep-grpc-port", self.container["args"])
        [install] = [line for line in text.splitlines() if line.startswith("RUN if [ ")]
        extras = re.findall(r'extra="\[([^\]]*)\]"', install)
        self.assertEqual(len(extras), 2, install)
        for chosen in extras:
            self.assertIn("kep", chosen.split(","), install)
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(os.path.join(ROOT, "setup.cfg"))
        self.assertIn("h2", parser["options.extras_require"]["kep"])

    def test_container(self) -> None:
        """
        Its argv is what ``sandboxd serve`` takes (the KEP ports on the
        protocol's 8080 and 9090, the policy where the ConfigMap is
        mounted); the probes are the protocol's /v1/health; the tokens
        are files from a Secret.
        """
        from sandboxd.daemon.tap import Options

        args = self.container["args"]
        self.assertEqual(args[:2], ["sandboxd", "serve"])
        flags = dict(zip(args[2::2], args[3::2], strict=True))
        self.assertEqual(
            (flags["--kep-rest-port"], flags["--kep-grpc-port"]), ("8080", "9090")
        )
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        self.assertEqual(os.path.dirname(flags["--policy"]), mounts["policy"])
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.assertEqual((ports["kep-rest"], ports["kep-grpc"]), (8080, 9090))
        for probe in ("startupProbe", "readinessProbe"):
            get = self.container[probe]["httpGet"]
            self.assertEqual((get["path"], get["port"]), ("/v1/health", "kep-rest"))
        policy = json.loads(self.config["data"]["policy.json"])
        for token in policy["auth"]["tokens"]:
            self.assertEqual(os.path.dirname(token["token_file"]), mounts["tokens"])
        env = self.container["env"][0]
        self.assertEqual(env["name"], "ABX_SERVER_TOKEN_FILE")
        self.assertEqual(os.path.dirname(env["value"]), mounts["tokens"])
        volumes = {v["name"]: v for v in self.spec["volumes"]}
        self.assertEqual(volumes["tokens"]["secret"]["defaultMode"], 0o400)
        # The argv parses as the daemon's own options (paths made real here).
        import pwd

        real = pwd.getpwnam
        self.patch(
            pwd, "getpwnam", lambda name: real("root") if name == "user" else real(name)
        )
        policy_path, environ = self.secrets_here()
        argv = [*args[2:]]
        argv[argv.index("--policy") + 1] = policy_path
        argv[argv.index("--base-dir") + 1] = "/tmp"
        for name, value in environ.items():
            self.addCleanup(os.environ.pop, name, None)
            os.environ[name] = value
        Options().parseOptions(argv)

    def test_schema(self) -> None:
        """The ConfigMap, and the pod the template makes, validate (kubernetes-validate)."""
        try:
            import kubernetes_validate
        except ImportError:
            raise SkipTest(
                "kubernetes-validate is not installed (pip install kubernetes-validate)"
            ) from None
        version = kubernetes_validate.latest_version()
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sandbox"},
            "spec": self.spec,
        }
        for doc in (self.config, pod):
            kubernetes_validate.validate(doc, version, strict=True)
