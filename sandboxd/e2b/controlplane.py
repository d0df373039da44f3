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
"""

from __future__ import annotations

from typing import Any

from sandboxd.api.fields import F
from sandboxd.e2b.door import REST, Call, Procedure

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
    with the caller's token as its envd access token (201, as E2B answers).
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
    return answer


def kill(call: Call, _: Any) -> int:
    """``DELETE /sandboxes/ID``: 204; the machine goes on (nothing to end)."""
    return 204


#: What ``Sandbox.create()`` sends (E2B's ``NewSandbox``): read for its
#: shape only, as E2B's API checks it, since the one sandbox there is takes
#: no template, timeout or settings.
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

PROCEDURES = {
    "POST /v2/sandboxes": Procedure(
        "POST /v2/sandboxes",
        REST,
        GOVERNED_AS,
        sandbox,
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
    f"DELETE /sandboxes/{SANDBOX_ID}": Procedure(
        f"DELETE /sandboxes/{SANDBOX_ID}", REST, GOVERNED_AS, kill, api_key=True
    ),
}
