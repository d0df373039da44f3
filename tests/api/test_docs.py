"""
The documentation stays true: ``docs/api.md`` is what the generator renders
from the endpoint table, every endpoint has a schema, the names handlers
read are declared, the docs link to files that exist, and the example
client runs end to end against a real daemon.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import tarfile
import textwrap
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from sandboxd.api import apidoc, openapi, schema
from sandboxd.endpoints import RouteTable, catalogue_table
from sandboxd.policy import load_policy
from sandboxd.routes import builtin_table, load_all
from tests.helpers import DaemonTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
EXAMPLE = os.path.join(ROOT, "examples", "sdk_client.py")


def handlers_table() -> RouteTable:
    """The built-in table with every group's real handlers attached."""
    table = builtin_table()
    load_all(table)
    return table


#: How handlers read request values: body.get("x"), request.query["x"],
#: request.arg("x"), q.get("x") (q = request.query).
_READS = re.compile(
    r"""(?:\bbody|\bquery|\bq)(?:\.get\(|\[)\s*["']([A-Za-z_]\w*)["']"""
    r"""|\.arg\(\s*["']([A-Za-z_]\w*)["']"""
)


def read_doc(name: str) -> str:
    """One file under docs/, as text."""
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read()


#: The JSON types of sandboxd/api/schema.py each parser of
#: sandboxd/web/params.py may read (an integer field may be read as a
#: number, a string field as one of a closed set, ...).
_PARSER_TYPES = {
    "flag": {"boolean"},
    "integer": {"integer"},
    "dimension": {"integer"},
    "number": {"number", "integer"},
    "seconds": {"number", "integer"},
    "string": {"string", "any"},
    "required": {"string"},
    "path": {"string"},
    "one_of": {"string"},
    "strings": {"array"},
    "string_map": {"object"},
}


def handler_sources(handler: Any) -> list[str]:
    """
    A handler's source and that of the module-level functions of its module
    that it calls directly (one level), which is where the groups keep their
    small parsing helpers.
    """
    func = getattr(handler, "__func__", handler)
    module = sys.modules[func.__module__]
    sources = [inspect.getsource(func)]
    for node in ast.walk(ast.parse(inspect.getsource(func).lstrip())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            helper = getattr(module, node.func.id, None)
            if inspect.isfunction(helper) and helper.__module__ == module.__name__:
                sources.append(inspect.getsource(helper))
    return sources


def parser_reads(handler: Any) -> dict[str, set[str]]:
    """
    Field name -> the sandboxd.web.params parsers a handler reads it with,
    for calls spelled ``parser(x.get("name", ...), "name", ...)``.
    """
    found: dict[str, set[str]] = {}
    for source in handler_sources(handler):
        for node in ast.walk(ast.parse(textwrap.dedent(source))):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            kind = (
                func.attr
                if isinstance(func, ast.Attribute)
                else getattr(func, "id", "")
            )
            raw, name = node.args[0], node.args[1]
            if (
                kind in _PARSER_TYPES
                and isinstance(name, ast.Constant)
                and isinstance(raw, ast.Call)
                and isinstance(raw.func, ast.Attribute)
                and raw.func.attr in ("get", "arg")
                and raw.args
                and isinstance(raw.args[0], ast.Constant)
                and raw.args[0].value == name.value
            ):
                found.setdefault(name.value, set()).add(kind)
    return found


def names_read(handler: Any) -> set[str]:
    """
    Request names a handler reads: in its own source and in the module-level
    functions of its module that it calls directly (one level), which is
    where the groups keep their small parsing helpers.
    """
    found: set[str] = set()
    for source in handler_sources(handler):
        for match in _READS.finditer(source):
            found.add(match.group(1) or match.group(2))
    return found


class ReferenceTests(SynchronousTestCase):
    """docs/api.md and the schemas against the endpoint table."""

    def test_api_md_is_generated(self) -> None:
        """docs/api.md is byte for byte what `python -m sandboxd.apidoc` prints."""
        self.assertEqual(
            read_doc("api.md"),
            apidoc.render(),
            "docs/api.md is stale: run `python -m sandboxd.api.apidoc > docs/api.md`",
        )

    def test_no_error_row_repeats_another(self) -> None:
        """
        No endpoint's error table lists a status and code twice where one
        row says what the other already does (a shared block's generic row
        beside the endpoint's own, fuller one).
        """
        for endpoint_id, entry in schema.SCHEMAS.items():
            rows = [(e.status, e.code, e.when) for e in entry.errors]
            for i, (status, code, when) in enumerate(rows):
                for other in rows[i + 1 :]:
                    if other[:2] == (status, code):
                        self.assertFalse(
                            when in other[2] or other[2] in when,
                            f"{endpoint_id}: {status} {code} twice",
                        )

    def test_every_endpoint_documented(self) -> None:
        """Every endpoint id has a schema and a section (with an example) in api.md."""
        text = read_doc("api.md")
        for endpoint in catalogue_table():
            self.assertIn(endpoint.id, schema.SCHEMAS, endpoint.id)
            self.assertIn(f'<a id="{endpoint.id}"></a>', text)
            section = text.split(f'<a id="{endpoint.id}"></a>', 1)[1].split(
                "<a id=", 1
            )[0]
            self.assertIn("```sh", section, endpoint.id)
            self.assertIn(endpoint.method, section)

    def test_no_schema_for_unknown_ids(self) -> None:
        """A schema keyed by a mistyped id would silently document nothing."""
        ids = set(catalogue_table().ids())
        self.assertEqual(set(schema.SCHEMAS) - ids, set())

    def test_handler_reads_are_declared(self) -> None:
        """Every body or query name a handler reads is declared in its schema."""
        missing = {}
        for endpoint in handlers_table():
            if endpoint.handler is None:
                continue  # not implemented yet; the SPEC-derived schema stands
            undeclared = names_read(endpoint.handler) - schema.declared_names(
                endpoint.id
            )
            if undeclared:
                missing[endpoint.id] = sorted(undeclared)
        self.assertEqual(missing, {}, "declare these in sandboxd/schema.py")

    def test_parsers_match_declared_types(self) -> None:
        """
        A field a handler reads with a sandboxd.web.params parser has the
        JSON type that parser reads in the endpoint's schema (``depth``
        read by ``integer`` is declared ``integer``).
        """
        wrong = {}
        checked = 0
        for endpoint in handlers_table():
            if endpoint.handler is None or endpoint.id not in schema.SCHEMAS:
                continue
            declared = schema.SCHEMAS[endpoint.id]
            fields = {f.name: f for f in (*declared.query, *declared.body)}
            for name, kinds in parser_reads(endpoint.handler).items():
                if name not in fields:
                    continue  # test_handler_reads_are_declared reports it
                checked += 1
                for kind in kinds:
                    if fields[name].type not in _PARSER_TYPES[kind]:
                        wrong[f"{endpoint.id}.{name}"] = (kind, fields[name].type)
        self.assertEqual(wrong, {}, "the schema's type and the handler's parser differ")
        self.assertGreater(checked, 30, "the scan found too few parser calls")

    def test_names_read_sees_helpers(self) -> None:
        """The scan follows one level of helpers (else the test above is weak)."""
        table = handlers_table()
        self.assertIn("overwrite", names_read(table.get("files_move").handler))
        self.assertIn("filter", names_read(table.get("env_get").handler))

    def test_examples_use_declared_fields(self) -> None:
        """Example values name only declared fields, and required ones have one."""
        for endpoint_id, s in schema.SCHEMAS.items():
            for field in (*s.query, *s.body):
                if field.required and field.name != "*":
                    self.assertIsNotNone(
                        field.example, f"{endpoint_id}.{field.name} needs an example"
                    )

    def test_openapi_uses_schemas(self) -> None:
        """/openapi.json carries the declared parameters, bodies and errors."""
        table = catalogue_table()
        doc = openapi.document(table, load_policy(table, explicit={}, environ={}))
        upload = doc["paths"]["/upload"]["post"]
        body = upload["requestBody"]["content"]["application/json"]["schema"]
        self.assertEqual(body["required"], ["path", "content_base64"])
        self.assertIn("413", upload["responses"])
        listing = doc["paths"]["/files/list"]["get"]
        self.assertIn("depth", [p["name"] for p in listing["parameters"]])
        stream = doc["paths"]["/shell/stream"]["post"]["responses"]["200"]
        self.assertIn("text/event-stream", stream["content"])
        self.assertIn("exit", stream["x-sandboxd-events"])
        created = doc["paths"]["/agents/sessions"]["post"]["responses"]
        self.assertIn("201", created)


class DocsTests(SynchronousTestCase):
    """The hand-written pages exist, link to real files, and cover their topics."""

    PAGES = ("index.md", "api.md", "protocols.md", "operations.md", "security.md")

    def test_no_internal_labels(self) -> None:
        """
        The user's pages cite nothing a reader cannot look up: no contract
        sections ("SPEC §"), issue numbers or "as in the seed" (the
        benchmark page's W0-W8 are defined on it).  The developer's map
        cites the contract on purpose.
        """
        internal = re.compile(
            r"SPEC §|\bissue #?\d+|as in the seed|the seed's|the seed daemon"
        )
        for name in sorted(os.listdir(DOCS)):
            if not name.endswith(".md") or name == "architecture.md":
                continue
            with open(os.path.join(DOCS, name), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    self.assertIsNone(
                        internal.search(line), f"docs/{name}:{number}: {line.strip()}"
                    )
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            self.assertIsNone(internal.search(f.read()))

    def test_query_token_routes_listed(self) -> None:
        """
        security.md's list of the routes that take a token in the URL is
        every route that does (operators decide from it which URLs may
        carry tokens into access logs), and names no other.
        """
        from sandboxd.web.query_token import QUERY_TOKEN_ENDPOINTS

        text = read_doc("security.md")
        start = text.index("**A token in a URL")
        paragraph = " ".join(text[start : text.index("\n- ", start)].split())
        shape = re.compile(r"\{[^}]*\}")
        listed = {
            shape.sub("{}", p) for p in re.findall(r"`GET\s+(/[^`?]+)", paragraph)
        }
        routes = {
            shape.sub("{}", e.path)
            for e in builtin_table()
            if e.id in QUERY_TOKEN_ENDPOINTS
        }
        self.assertEqual(listed, routes)

    def test_relative_links_resolve(self) -> None:
        """Every relative Markdown link in docs/ and examples/ points at a file."""
        link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
        pages = [os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md")]
        pages.append(os.path.join(ROOT, "examples", "README.md"))
        for page in pages:
            with open(page, encoding="utf-8") as f:
                text = f.read()
            for target in link.findall(text):
                if re.match(r"[a-z]+:", target):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(page), target))
                self.assertTrue(os.path.exists(path), f"{page}: broken link {target}")

    def test_index_lists_every_page(self) -> None:
        """docs/index.md links to every page in docs/."""
        index = read_doc("index.md")
        for name in sorted(os.listdir(DOCS)):
            if name.endswith(".md") and name != "index.md":
                self.assertIn(f"({name})", index, name)

    def test_protocols_cover_both_streams(self) -> None:
        """The protocol page has Python and JavaScript clients for both streams."""
        text = read_doc("protocols.md")
        for needle in (
            "Last-Event-ID",
            "offset",
            "EventSource",
            "new WebSocket",
            "```python",
            "```js",
            "gap",
            "keep-alive",
            "1008",
            "4008",
        ):
            self.assertIn(needle, text)

    def test_security_states_the_limits(self) -> None:
        """The security page says plainly what sandboxd does not protect against."""
        text = read_doc("security.md")
        for needle in (
            "/proc/",
            "environ",
            "default_user",
            "DNS rebinding",
            "Origin",
            "does not protect",
        ):
            self.assertIn(needle, text)

    def test_shared_browser_said(self) -> None:
        """
        The security page and the API reference's browser section say that
        every identity with browser:use shares one browser's cookies,
        logins and console, and that its URL rules are one rule.
        """
        security = read_doc("security.md")
        self.assertIn("One browser for every identity", security)
        self.assertIn("same cookies, logins", security)
        api = read_doc("api.md")
        section = api[api.index("\n## browser\n") :]
        section = section[: section.index("<a id=")]
        for needle in ("share its cookies, logins", "console", "strictest"):
            self.assertIn(needle, section)

    def test_shell_background_jobs_said(self) -> None:
        """
        The API reference's /shell and /shell/stream sections, the security
        page and the migration guide say that a job the command leaves
        running is neither waited for nor ended nor reported, and point to
        process_start for what should outlive a call.
        """
        api = read_doc("api.md")
        for endpoint in ("shell", "shell_stream"):
            section = api[api.index(f'<a id="{endpoint}"></a>') :]
            section = section[: section.index("<a id=", 1)]
            for needle in ("a job it leaves running", "process_start", "SIGPIPE"):
                self.assertIn(needle, section, endpoint)
        security = read_doc("security.md")
        self.assertIn("A job that `/shell` or `/shell/stream` leaves running", security)
        migration = read_doc("migrating-from-agent-sandbox-server.md")
        self.assertIn("A job `process.shell()` leaves in the background", migration)

    def test_migration_says_content_comes_in_parts(self) -> None:
        """
        The migration guide says that a page's content comes in parts, that
        the agent-sandbox SDK reads only the first, and how to read on.
        """
        text = read_doc("migrating-from-agent-sandbox-server.md")
        for needle in (
            "content comes in parts",
            "GET /browser/content?offset=N",
            "browser.content(offset=, max_bytes=)",
        ):
            self.assertIn(needle, text)

    def test_operations_cover_deployments(self) -> None:
        """The operations page uses the shipped etc/ files and TLS endpoint strings."""
        text = read_doc("operations.md")
        for needle in (
            "etc/systemd/sandboxd.service",
            "etc/container/Dockerfile",
            "etc/kubernetes/sandboxd.yaml",
            "ssl:",
            "tls:",
            "SIGHUP",
            "SIGTERM",
            "healthcheck",
            "ABX_SERVER_AUDIT_LOG",
        ):
            self.assertIn(needle, text)

    def test_example_compiles(self) -> None:
        """The example client is valid Python."""
        with open(EXAMPLE, encoding="utf-8") as f:
            compile(f.read(), EXAMPLE, "exec")


class ExampleClientTests(DaemonTestCase):
    """examples/sdk_client.py does its four steps against a real daemon."""

    timeout = 120
    token = "docs-example-token"

    @inlineCallbacks
    def test_example_client_end_to_end(self) -> Any:
        """Upload, streamed tests, a terminal command and the archive all work."""
        if self.daemon.context.pty_port is None:
            raise SkipTest("the PTY WebSocket port is not listening")
        out = os.path.join(self.mktemp() + "-results.tar.gz")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        env["SANDBOXD_TOKEN"] = self.token
        stdout, stderr, code = yield getProcessOutputAndValue(
            sys.executable,
            [EXAMPLE, "--url", self.daemon.url, "--out", out],
            env=env,
            reactor=reactor,
        )
        text = stdout.decode() + stderr.decode()
        self.assertEqual(code, 0, text)
        self.assertIn("6 x 7 = 42", text)
        self.assertIn("[stderr] OK", text)
        with tarfile.open(out) as tar:
            names = set(tar.getnames())
        self.assertTrue(
            {
                "sdk-example/calc.py",
                "sdk-example/test-output.txt",
                "sdk-example/answer.txt",
            }
            <= names,
            names,
        )
