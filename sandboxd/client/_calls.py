"""
Every plain JSON call of the API (SPEC §7, §15), described once: the sync
and the async namespaces send these same :class:`~sandboxd.client._core.Req`
values.  Field names follow the daemon's handlers in ``sandboxd/routes``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxd.client._core import Req, body, clean, seg

# -- core -------------------------------------------------------------------------


def health() -> Req:
    return Req("GET", "/health")


def capabilities() -> Req:
    return Req("GET", "/capabilities")


def check(
    endpoint: str,
    path: str | None = None,
    op: str | None = None,
    paths: Sequence[str] | None = None,
    command: str | None = None,
) -> Req:
    return Req(
        "POST",
        "/capabilities/check",
        json=body(
            endpoint=endpoint,
            path=path,
            op=op,
            paths=list(paths) if paths is not None else None,
            command=command,
        ),
        idempotent=True,
    )


def openapi() -> Req:
    return Req("GET", "/openapi.json")


# -- template commands -------------------------------------------------------------


def list_commands() -> Req:
    return Req("GET", "/commands")


def run_command(name: str, kwargs: Mapping[str, Any]) -> Req:
    return Req("POST", f"/commands/{seg(name)}", json=dict(kwargs))


# -- files ----------------------------------------------------------------------------


def files_list(path: str | None, depth: int | None, hidden: bool | None) -> Req:
    return Req(
        "GET", "/files/list", clean({"path": path, "depth": depth, "hidden": hidden})
    )


def download_lines(path: str, offset: int, limit: int | None) -> Req:
    return Req(
        "GET", "/download", clean({"path": path, "offset": offset, "limit": limit})
    )


def files_stat(path: str) -> Req:
    return Req("GET", "/files/stat", {"path": path})


def files_mkdir(path: str) -> Req:
    return Req("POST", "/files/mkdir", json={"path": path}, idempotent=True)


def files_delete(path: str) -> Req:
    return Req("DELETE", "/files", {"path": path})


def files_move(source: str, destination: str, overwrite: bool) -> Req:
    return Req(
        "POST",
        "/files/move",
        json={"source": source, "destination": destination, "overwrite": overwrite},
    )


def files_search(pattern: str, path: str | None, max_results: int | None) -> Req:
    return Req(
        "POST",
        "/files/search",
        json=body(pattern=pattern, path=path, max_results=max_results),
        idempotent=True,
    )


def files_edit(
    path: str,
    edits: Sequence[dict[str, Any]] | dict[str, Any],
    dry_run: bool,
    if_match: str | None,
) -> Req:
    """
    ``edits`` as a list, or one edit as a mapping: sent in the body's
    one-edit form, so that the daemon's messages name its fields as the
    caller gave them (``old_text``, not ``edits[0].old_text``).
    """
    fields = dict(edits) if isinstance(edits, dict) else {"edits": list(edits)}
    return Req(
        "POST",
        "/files/edit",
        json=body(path=path, **fields, dry_run=dry_run, if_match=if_match),
        # Sent twice, a replacement could apply twice; with if_match the
        # second is refused (412) instead.
        idempotent=if_match is not None,
    )


def files_grep(
    pattern: str,
    path: str | None,
    fixed_strings: bool,
    ignore_case: bool,
    include: str | None,
    max_results: int | None,
    max_depth: int | None,
    context: int | None = None,
) -> Req:
    return Req(
        "POST",
        "/files/grep",
        json=body(
            pattern=pattern,
            path=path,
            fixed_strings=fixed_strings or None,
            ignore_case=ignore_case or None,
            include=include,
            max_results=max_results,
            max_depth=max_depth,
            context=context or None,
        ),
        idempotent=True,
    )


def files_chmod(path: str, mode: str | int) -> Req:
    return Req(
        "POST", "/files/chmod", json={"path": path, "mode": mode}, idempotent=True
    )


def files_archive(paths: Sequence[str], format: str) -> Req:
    return Req(
        "POST",
        "/files/archive",
        json={"paths": list(paths), "format": format},
        idempotent=True,
    )


def files_extract(data: bytes, destination: str, format: str, overwrite: bool) -> Req:
    return Req(
        "POST",
        "/files/extract",
        json={
            "content_base64": base64.b64encode(data).decode("ascii"),
            "destination": destination,
            "format": format,
            "overwrite": overwrite,
        },
    )


def files_write_raw(
    path: str, overwrite: bool, mode: str | int | None, if_match: str | None
) -> Req:
    headers = {"Content-Type": "application/octet-stream"}
    if if_match is not None:
        headers["If-Match"] = if_match
    return Req(
        "POST",
        "/files/raw",
        clean(
            {
                "path": path,
                "overwrite": overwrite,
                "mode": None if mode is None else _mode(mode),
            }
        ),
        headers=headers,
    )


def files_uploads_create(
    path: str,
    size: int,
    overwrite: bool,
    mode: str | int | None,
    if_match: str | None,
) -> Req:
    return Req(
        "POST",
        "/files/uploads",
        json=body(
            path=path,
            size=size,
            overwrite=overwrite,
            mode=None if mode is None else _mode(mode),
            if_match=if_match,
        ),
    )


def files_uploads_get(upload_id: str) -> Req:
    return Req("GET", f"/files/uploads/{seg(upload_id)}")


def files_uploads_append(upload_id: str, offset: int, length: int) -> Req:
    return Req(
        "POST",
        f"/files/uploads/{seg(upload_id)}",
        {"offset": offset},
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(length),
        },
        idempotent=False,
    )


def files_uploads_delete(upload_id: str) -> Req:
    return Req("DELETE", f"/files/uploads/{seg(upload_id)}", idempotent=True)


def _mode(mode: str | int) -> str:
    return format(mode, "o") if isinstance(mode, int) else mode


# -- processes --------------------------------------------------------------------------


def _launch(
    command: str | Sequence[str],
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | int | None,
    shell: str | None,
    timeout: float | None,
    idle_timeout: float | None,
) -> dict[str, Any]:
    if not isinstance(command, str):
        import shlex

        command = shlex.join(command)
    return body(
        command=command,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        user=user,
        shell=shell,
        timeout=timeout,
        idle_timeout=idle_timeout,
    )


def shell(
    command: str | Sequence[str],
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str | int | None = None,
    shell: str | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
) -> dict[str, Any]:
    """The body of ``/shell``, ``/shell/stream`` (and ``/process/start``)."""
    return _launch(command, cwd, env, user, shell, timeout, idle_timeout)


def shell_bytes(launch: dict[str, Any], stdin: bytes | None) -> dict[str, Any]:
    """The body of a byte-exact ``/shell/stream``, with its stdin if any."""
    extra = {} if stdin is None else {"stdin_base64": base64.b64encode(stdin).decode()}
    return {**launch, "output": "bytes", **extra}


def process_start(launch: dict[str, Any], stdin: bool, tag: str | None) -> Req:
    return Req(
        "POST", "/process/start", json={**launch, "stdin": stdin, **body(tag=tag)}
    )


def process_list(tag: str | None) -> Req:
    return Req("GET", "/process/list", clean({"tag": tag}))


def process_detail(pid: int) -> Req:
    return Req("GET", f"/process/{int(pid)}")


def process_signal(pid: int, signal: int | str) -> Req:
    return Req("POST", f"/process/{int(pid)}/signal", json={"signal": signal})


def process_output(pid: int, after: int) -> Req:
    return Req("GET", f"/process/{int(pid)}/output", {"after": after})


def process_stdin(pid: int, data: str, eof: bool) -> Req:
    return Req("POST", f"/process/{int(pid)}/stdin", json={"data": data, "eof": eof})


# -- terminals ----------------------------------------------------------------------------


def pty_create_session(
    cols: int,
    rows: int,
    shell: str | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | int | None,
) -> Req:
    child = _child(cwd, env, user)
    return Req(
        "POST", "/pty/sessions", json=body(cols=cols, rows=rows, shell=shell, **child)
    )


def _child(
    cwd: str | None, env: Mapping[str, str] | None, user: str | int | None
) -> dict[str, Any]:
    """Where and as whom a child runs: the fields every launch shares."""
    return body(cwd=cwd, env=dict(env) if env is not None else None, user=user)


def pty_list_sessions() -> Req:
    return Req("GET", "/pty/sessions")


def pty_detail(session_id: str) -> Req:
    return Req("GET", f"/pty/sessions/{seg(session_id)}")


def pty_resize(session_id: str, cols: int, rows: int) -> Req:
    return Req(
        "POST",
        f"/pty/sessions/{seg(session_id)}/resize",
        json={"cols": cols, "rows": rows},
        idempotent=True,
    )


def pty_delete_session(session_id: str) -> Req:
    return Req("DELETE", f"/pty/sessions/{seg(session_id)}")


# -- system -----------------------------------------------------------------------------


def system_info() -> Req:
    return Req("GET", "/system/info")


def system_metrics() -> Req:
    return Req("GET", "/system/metrics")


def ports() -> Req:
    return Req("GET", "/ports")


def port_wait(port: int, wait: float) -> Req:
    # The answer may take the whole wait: the read's timeout is longer.
    return Req(
        "GET", "/ports", params={"port": int(port), "wait": wait}, timeout=wait + 30
    )


def packages(manager: str) -> Req:
    return Req("GET", "/packages", {"manager": manager}, timeout=120.0)


def env_get(names: Sequence[str]) -> Req:
    return Req("GET", "/env", {"filter": ",".join(names)} if names else None)


def env_set(variables: Mapping[str, str | None]) -> Req:
    return Req("POST", "/env", json={"vars": dict(variables)}, idempotent=True)


# -- dev tools ----------------------------------------------------------------------------


def code_run(
    code: str,
    language: str,
    timeout: float | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | int | None,
) -> Req:
    fields = body(
        code=code, language=language, timeout=timeout, **_child(cwd, env, user)
    )
    return Req("POST", "/code/run", json=fields)


def git_status(path: str) -> Req:
    return Req("GET", "/git/status", {"path": path})


def git_diff(path: str, staged: bool, file: str | None) -> Req:
    return Req(
        "GET", "/git/diff", clean({"path": path, "staged": staged, "file": file})
    )


def git(
    method: str,
    route: str,
    params: Mapping[str, Any] | None = None,
    wait: float | None = None,
    **fields: Any,
) -> Req:
    """
    One call of the ``git`` group (SPEC §24); ``route`` below ``/git``.  A
    remote call that waits ``wait`` seconds for its job gets that long
    (and a margin) before the client gives up.
    """
    timeout = None if wait is None else wait + 30.0
    if method in ("GET", "DELETE"):
        return Req(method, "/git" + route, clean(params), timeout=timeout)
    return Req(
        method,
        "/git" + route,
        clean(params),
        json=body(wait=wait, **fields),
        timeout=timeout,
    )


# -- browser ----------------------------------------------------------------------------


def browser(method: str, name: str, **fields: Any) -> Req:
    """One browser call: ``POST /browser/NAME`` with a body, or a GET with a query."""
    if method == "GET":
        return Req("GET", f"/browser/{name}", clean(fields), timeout=120.0)
    return Req("POST", f"/browser/{name}", json=body(**fields), timeout=120.0)


# -- agents -------------------------------------------------------------------------------


def code_contexts(
    method: str,
    path: str = "",
    params: Mapping[str, Any] | None = None,
    read_timeout: float = 120.0,
    **fields: Any,
) -> Req:
    """
    One code-context call (SPEC §22); ``path`` below ``/code/contexts``.

    :param read_timeout: the client's wait for the answer (an execution's
        ``timeout`` is a body field).
    """
    if method in ("GET", "DELETE"):
        return Req(method, "/code/contexts" + path, clean(params), timeout=read_timeout)
    return Req(
        method,
        "/code/contexts" + path,
        clean(params),
        json=body(**fields),
        timeout=read_timeout,
    )


def code_context_path(context_id: str, tail: str = "") -> str:
    """``/{cid}`` plus a tail, below ``/code/contexts``."""
    return f"/{seg(context_id)}{tail}"


def agents(
    method: str, path: str, params: Mapping[str, Any] | None = None, **fields: Any
) -> Req:
    """One agents call (SPEC §15.2); ``path`` below ``/agents``."""
    if method in ("GET", "DELETE"):
        return Req(method, "/agents" + path, clean(params), timeout=120.0)
    return Req(
        method, "/agents" + path, clean(params), json=body(**fields), timeout=120.0
    )


def session_path(session_id: str, tail: str = "") -> str:
    """``/sessions/{sid}`` plus a tail, below ``/agents``."""
    return f"/sessions/{seg(session_id)}{tail}"


# -- capability links and previews ----------------------------------------------------


def links_mint(
    audience: str,
    scopes: Sequence[str] | None,
    ttl_seconds: float | None,
    uses: int | None,
) -> Req:
    listed = list(scopes) if scopes is not None else None
    fields = body(audience=audience, scopes=listed, ttl_seconds=ttl_seconds, uses=uses)
    return Req("POST", "/auth/links", json=fields)


def links_list() -> Req:
    return Req("GET", "/auth/links")


def links_revoke(link_id: str) -> Req:
    return Req("DELETE", f"/auth/links/{seg(link_id)}")


def preview_list() -> Req:
    return Req("GET", "/preview/ports")


def preview_expose(port: int, **fields: Any) -> Req:
    """``POST /preview/ports``: exposing a port again replaces its exposure."""
    return Req(
        "POST", "/preview/ports", json=body(port=int(port), **fields), idempotent=True
    )


def preview_get(port: int) -> Req:
    return Req("GET", f"/preview/ports/{int(port)}")


def preview_unexpose(port: int) -> Req:
    return Req("DELETE", f"/preview/ports/{int(port)}")


def preview_link(port: int, ttl_seconds: float | None, uses: int | None) -> Req:
    fields = body(ttl_seconds=ttl_seconds, uses=uses)
    return Req("POST", f"/preview/ports/{int(port)}/link", json=fields)


# -- language servers -------------------------------------------------------------------

#: How long the client waits for an lsp answer: the first question about a
#: project starts its server (``start_timeout_seconds``) before it is asked.
LSP_WAIT = 120.0


def lsp(
    method: str,
    route: str = "",
    wait: float | None = None,
    idempotent: bool = True,
    **fields: Any,
) -> Req:
    """
    One call of the ``lsp`` group; ``route`` below ``/lsp``.  A question
    only reads, and starting a session answers the running one when it is
    asked twice, so a POST is sent again after a lost answer (a rename,
    which writes, says ``idempotent=False``).

    :param wait: seconds the daemon may wait besides a server's start
        (a diagnostics ``timeout``).
    """
    timeout = LSP_WAIT + (wait or 0)
    if method in ("GET", "DELETE"):
        return Req(method, "/lsp" + route, timeout=timeout)
    return Req(
        "POST",
        "/lsp" + route,
        json=body(**fields),
        idempotent=idempotent,
        timeout=timeout,
    )


def lsp_session_path(session_id: str) -> str:
    """``/sessions/{lid}``, below ``/lsp``."""
    return f"/sessions/{seg(session_id)}"
