# -*- test-case-name: tests.e2b.test_token_mode -*-
"""
The three calls of E2B's control plane an SDK makes around one sandbox,
answered for the sandbox sandboxd is, so the SDK's own token flow works:
``Sandbox.create()`` (``POST /v2/sandboxes``), ``Sandbox.connect(ID)``
(``POST /v2/sandboxes/ID/connect`` in current SDKs, ``POST
/sandboxes/ID/connect`` in earlier ones) and ``kill()`` (``DELETE
/sandboxes/ID``).

The SDK sends its API key (``E2B_API_KEY``, as ``X-API-Key``) to the
control plane and the ``envdAccessToken`` it is answered to envd, as
``X-Access-Token``, on every later call.  Here the API key is a sandboxd
token: it is checked as one (governed as ``capabilities``, which every
identity may call), and the answer hands the same token back, so the SDK
authenticates every envd call with it.  Nothing is created or ended: the
sandbox is the machine sandboxd runs on.

``set_timeout`` (``POST /sandboxes/ID/timeout``) is answered 204 and
changes nothing, as ``kill()``: the machine has no timeout to set (the
SDK's debug mode skips the call too).  Every other control-plane call
(``get_info``, ``Sandbox.list``, snapshots, templates, ...) is refused as
what it is, with the API key taken as the token as on the calls above:
404 for a sandbox other than this one, 501 for a call this port does not
serve, never a 401 that would send the user to check a valid key.
"""

from __future__ import annotations

from typing import Any

from sandboxd.api.fields import F
from sandboxd.e2b.door import REST, Call, Procedure
from sandboxd.errors import bad_request, not_found, unsupported

#: The id every answer gives the one sandbox.
SANDBOX_ID = "sandboxd"

#: The envd version answered: the newest this door's SDK behaviour was
#: checked against (what the SDK enables above it is not served).
ENVD_VERSION = "0.6.4"


#: The endpoint a control-plane call is governed as (the door takes the
#: SDK's ``X-API-Key`` as the token first: ``Procedure.api_key``).
GOVERNED_AS = "capabilities"


def _token(call: Call) -> str | None:
    values = call.headers.get(b"x-access-token") or []
    return values[0].decode("latin-1") if values else None


def sandbox(call: Call, _: Any) -> dict[str, Any]:
    """
    ``POST /v2/sandboxes``, ``POST [/v2]/sandboxes/ID/connect``: this sandbox,
    with the caller's token as its envd access token (201, as E2B answers)
    and as its traffic access token: the code-interpreter SDKs send only
    that one (``E2B-Traffic-Access-Token``) on ``/contexts*``, so without
    it every context call of a sandbox made this way is refused.
    """
    call.request.setResponseCode(201)
    call.status = 201
    answer: dict[str, Any] = {
        "templateID": "sandboxd",
        "sandboxID": SANDBOX_ID,
        "clientID": SANDBOX_ID,
        "envdVersion": ENVD_VERSION,
    }
    token = _token(call)
    if token is not None:
        answer["envdAccessToken"] = token
        answer["trafficAccessToken"] = token
    return answer


#: The templates ``Sandbox.create()`` names when none is given (E2B's SDK,
#: its code interpreter's), and this sandbox's own name: any other is an
#: image this port cannot give.
DEFAULT_TEMPLATES = frozenset({"base", "code-interpreter-v1", SANDBOX_ID})


def _unhonoured(message: dict[str, Any]) -> tuple[str, str] | None:
    """
    The ``Sandbox.create()`` option in ``message`` that asks for something
    this sandbox is not and cannot become, as the SDK spells it, and why;
    or None.  What changes nothing that code could rely on (``metadata``;
    ``timeout``, since the machine is never ended; ``secure``) passes.
    """
    template = message.get("templateID")
    if template is not None and template not in DEFAULT_TEMPLATES:
        return (
            f"template={template[:100]!r}",
            "this port serves one sandbox, the machine sandboxd runs on, "
            "whatever its template; leave template out",
        )
    if message.get("allow_internet_access") is False:
        return (
            "allow_internet_access=False",
            "this port does not control the machine's network: commands here "
            "could still reach the internet",
        )
    if message.get("network"):
        return (
            "network=...",
            "this port does not control the machine's network: its rules "
            "would not hold",
        )
    if message.get("envVars"):
        return (
            "envs=...",
            "commands here get no sandbox-wide environment; pass envs= to "
            "each commands.run(), pty.create() or run_code()",
        )
    resume = message.get("autoResume")
    if message.get("autoPause") is True or (
        isinstance(resume, dict) and resume.get("enabled")
    ):
        return "lifecycle=...", "this sandbox is never paused or resumed"
    for name, option in (("mcp", "mcp"), ("volumeMounts", "volume_mounts")):
        if message.get(name):
            return f"{option}=...", "this port does not serve it"
    if message.get("iam"):
        return "iam=...", "this port does not serve it"
    return None


def create(call: Call, message: Any) -> dict[str, Any]:
    """
    ``POST /v2/sandboxes``: this sandbox (:func:`sandbox`), unless an
    option asks for what it cannot honour (:func:`_unhonoured`): then 400
    naming the option, never a sandbox that code would take for offline,
    or for one with its environment, when it is neither.
    """
    found = _unhonoured(message if isinstance(message, dict) else {})
    if found is not None:
        option, why = found
        raise bad_request(f"Sandbox.create({option}) cannot be honoured: {why}")
    return sandbox(call, message)


def kill(call: Call, _: Any) -> int:
    """``DELETE /sandboxes/ID``: 204; the machine goes on (nothing to end)."""
    return 204


def set_timeout(call: Call, _: Any) -> int:
    """``POST /sandboxes/ID/timeout``: 204; the machine has no timeout to set."""
    return 204


#: The first segment of E2B's control-plane paths (after an optional
#: ``/v1``, ``/v2``, ``/v3``): what the SDK sends its API URL.
_CONTROL_PLANE = frozenset(
    {"sandboxes", "templates", "snapshots", "volumes", "secrets", "teams", "tags"}
)


def control_plane_path(path: str) -> bool:
    """Whether ``path`` is one of E2B's control-plane calls (not envd's)."""
    parts = path.strip("/").split("/")
    if parts and parts[0] in ("v1", "v2", "v3"):
        parts = parts[1:]
    return bool(parts) and parts[0] in _CONTROL_PLANE


def unserved(call: Call, _: Any) -> Any:
    """
    A control-plane call this port does not serve: 404 for a sandbox
    other than this one (the SDK raises ``SandboxNotFoundException``), 501
    naming the call otherwise.
    """
    method = call.request.method.decode("latin-1")
    path = call.request.path.decode("latin-1", "replace")[:200]
    parts = path.strip("/").split("/")
    if parts and parts[0] in ("v1", "v2", "v3"):
        parts = parts[1:]
    if len(parts) >= 2 and parts[0] == "sandboxes" and parts[1] != SANDBOX_ID:
        raise not_found(
            f"no sandbox {parts[1][:100]!r}: this port serves one sandbox, "
            f"{SANDBOX_ID!r}, the machine sandboxd runs on"
        )
    raise unsupported(
        f"{method} {path} is a call of E2B's cloud API, which this port does not "
        f"serve: it serves one sandbox, {SANDBOX_ID!r}, the machine sandboxd runs on"
    )


def unserved_procedure(path: str) -> Procedure | None:
    """
    The procedure of a control-plane call not served (the API key is the
    token, as on the served ones), or None for a path that is not one.
    """
    if not control_plane_path(path):
        return None
    return Procedure(path, REST, GOVERNED_AS, unserved, api_key=True)


#: What ``Sandbox.create()`` sends (E2B's ``NewSandbox``): checked for its
#: shape, as E2B's API checks it; what asks for another sandbox than the
#: one there is is refused by :func:`create`.
CREATE_FIELDS = (
    F("templateID"),
    F("timeout", "integer"),
    F("autoPause", "boolean"),
    F("secure", "boolean"),
    F("allow_internet_access", "boolean"),
    F("metadata", "object"),
    F("envVars", "object"),
    F("network", "object"),
    F("volumeMounts", "array"),
)

#: What ``Sandbox.connect()`` sends (E2B's ``ConnectSandbox``; the v2
#: call's ``ConnectSandboxV2`` adds ``memory``, how a paused sandbox
#: resumes, which a running one has no use for).
CONNECT_FIELDS = (F("timeout", "integer"),)
CONNECT_V2_FIELDS = (*CONNECT_FIELDS, F("memory", "boolean"))

#: What ``set_timeout()`` sends (E2B's ``SandboxTimeoutRequest``).
TIMEOUT_FIELDS = (F("timeout", "integer"),)

PROCEDURES = {
    "POST /v2/sandboxes": Procedure(
        "POST /v2/sandboxes",
        REST,
        GOVERNED_AS,
        create,
        api_key=True,
        fields=CREATE_FIELDS,
    ),
    f"POST /sandboxes/{SANDBOX_ID}/connect": Procedure(
        f"POST /sandboxes/{SANDBOX_ID}/connect",
        REST,
        GOVERNED_AS,
        sandbox,
        api_key=True,
        fields=CONNECT_FIELDS,
    ),
    f"POST /v2/sandboxes/{SANDBOX_ID}/connect": Procedure(
        f"POST /v2/sandboxes/{SANDBOX_ID}/connect",
        REST,
        GOVERNED_AS,
        sandbox,
        api_key=True,
        fields=CONNECT_V2_FIELDS,
    ),
    f"POST /sandboxes/{SANDBOX_ID}/timeout": Procedure(
        f"POST /sandboxes/{SANDBOX_ID}/timeout",
        REST,
        GOVERNED_AS,
        set_timeout,
        api_key=True,
        fields=TIMEOUT_FIELDS,
    ),
    f"DELETE /sandboxes/{SANDBOX_ID}": Procedure(
        f"DELETE /sandboxes/{SANDBOX_ID}", REST, GOVERNED_AS, kill, api_key=True
    ),
}
