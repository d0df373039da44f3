"""
The endpoint table (SPEC §2): every id once, routing from templates, and
the registration rules template authors meet.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from sandboxd.endpoints import CapabilityGroup, RouteTable, catalogue_table
from sandboxd.routes import builtin_table
from sandboxd.web.routing import Router

SEED_AND_BEYOND = {
    "core": ["health", "capabilities", "capabilities_check", "openapi"],
    "commands": ["list_commands", "run_command"],
    "file_ops": [
        "upload",
        "download",
        "files_list",
        "files_stat",
        "files_mkdir",
        # Permissions: beyond SPEC §2's table.
        "files_chmod",
        "files_delete",
        "files_move",
        "files_search",
        # Editing by exact replacement: beyond SPEC §2's table.
        "files_edit",
        "files_grep",
        "files_upload_stream",
        "files_download_stream",
        "files_archive",
        "files_extract",
        "files_read_raw",
        "files_write_raw",
        # Resumable uploads (issue 19): not in SPEC §2's table yet.
        "files_uploads_create",
        # Listing the caller's uploads: beyond SPEC §2's table.
        "files_uploads_list",
        "files_uploads_get",
        "files_uploads_append",
        "files_uploads_delete",
        "files_watch",
    ],
    "process": [
        "shell",
        "shell_stream",
        "process_start",
        "process_list",
        "process_detail",
        "process_signal",
        "process_output",
        "process_stdin",
    ],
    "terminal": [
        "pty_create_session",
        "pty_list_sessions",
        "pty_detail",
        "pty_resize",
        "pty_delete_session",
        "pty_connect",
    ],
    "system": [
        "system_info",
        "env_get",
        "env_set",
        "ports",
        "packages",
        "system_metrics",
        "metrics",
    ],
    "dev_tools": ["code_run", "git_status", "git_diff"],
    "browser": [
        "browser_navigate",
        "browser_screenshot",
        "browser_content",
        "browser_click",
        "browser_type",
        "browser_evaluate",
        "browser_pdf",
        "browser_console",
    ],
    "e2b": ["e2b"],
    "kep": ["kep"],
}


class CatalogueTests(SynchronousTestCase):
    """The table declares exactly the endpoints of SPEC §2 and §15."""

    def test_every_id(self) -> None:
        """
        Every id of SPEC §2 sits in its group; the agents group has its 27
        native routes plus the ``/v1`` door's (the seed's ``agents_*`` ids,
        scope ``agents:use``).
        """
        table = catalogue_table()
        for group, ids in SEED_AND_BEYOND.items():
            self.assertEqual(
                [e.id for e in table if e.group.value == group], ids, group
            )
        agents = [e for e in table if e.group is CapabilityGroup.AGENTS]
        native = [e for e in agents if e.door == "http"]
        door = [e for e in agents if e.door == "openai"]
        self.assertEqual(len(native), 27)
        self.assertEqual(len(agents), len(native) + len(door))
        for endpoint in door:
            self.assertTrue(endpoint.path.startswith("/v1/"), endpoint.id)
            self.assertEqual(endpoint.scopes, ("agents:use",), endpoint.id)

    def test_every_builtin_is_implemented(self) -> None:
        """With every group built, no endpoint is left not_implemented."""
        self.assertEqual([e.id for e in builtin_table() if not e.implemented], [])

    def test_files_move_needs_two_scopes(self) -> None:
        """files_move needs files:write and files:delete."""
        self.assertEqual(
            catalogue_table().get("files_move").scopes, ("files:write", "files:delete")
        )


class RoutingTests(SynchronousTestCase):
    """Templates, static-before-parameter, and path parameters."""

    def test_static_beats_parameter(self) -> None:
        """/process/list is process_list, /process/42 is process_detail."""
        router = Router(catalogue_table())
        match = router.match("GET", ("process", "list"))
        assert match is not None
        self.assertEqual(match[0].id, "process_list")
        match = router.match("GET", ("process", "42"))
        assert match is not None
        self.assertEqual((match[0].id, match[1]), ("process_detail", {"pid": "42"}))

    def test_nested_parameters(self) -> None:
        """Two parameters in one template both come back by name."""
        router = Router(catalogue_table())
        match = router.match("GET", ("agents", "sessions", "s1", "turns", "t2"))
        assert match is not None
        self.assertEqual(
            (match[0].id, match[1]), ("agents_turn_get", {"sid": "s1", "turn_id": "t2"})
        )

    def test_method_matters(self) -> None:
        """The same path answers by method; an unserved method is no match."""
        router = Router(catalogue_table())
        get = router.match("GET", ("env",))
        post = router.match("POST", ("env",))
        assert get is not None and post is not None
        self.assertEqual((get[0].id, post[0].id), ("env_get", "env_set"))
        self.assertIsNone(router.match("DELETE", ("env",)))


class RegistrationTests(SynchronousTestCase):
    """What a template author may and may not register."""

    def handler(self, request: Any) -> dict[str, Any]:
        return {}

    def test_custom_route_defaults(self) -> None:
        """A custom route's id is 'METHOD path' and its scope follows its group."""
        table = RouteTable()
        endpoint = table.register(
            "GET", "/hello/{name}", self.handler, CapabilityGroup.SYSTEM
        )
        self.assertEqual(
            (endpoint.id, endpoint.scopes), ("GET /hello/{name}", ("system:read",))
        )

    def test_clashes_refused(self) -> None:
        """A second id, or a second route for the same method and path, is refused."""
        table = catalogue_table()
        with self.assertRaises(ValueError):
            table.register("GET", "/elsewhere", self.handler, name="health")
        with self.assertRaises(ValueError) as clash:
            table.register("GET", "/health", self.handler)
        self.assertIn("already served by 'health'", str(clash.exception))
        with self.assertRaises(ValueError):
            table.register("PUT", "/x", self.handler)
        # A refused route left nothing behind: the same path under a method
        # the table takes is still free.
        table.register("POST", "/x", self.handler)

    def test_frozen(self) -> None:
        """Once serving, the table takes no more routes."""
        table = RouteTable()
        table.freeze()
        with self.assertRaises(RuntimeError):
            table.register("GET", "/late", self.handler)

    def test_core_cannot_be_disabled(self) -> None:
        """disable_group(core) raises; other groups write the code layer."""
        table = RouteTable()
        with self.assertRaises(ValueError):
            table.disable_group(CapabilityGroup.CORE)
        table.enable_group("dev_tools")
        self.assertEqual(
            table.code_layer[CapabilityGroup.DEV_TOOLS],
            (True, "code:enable_group:dev_tools"),
        )
