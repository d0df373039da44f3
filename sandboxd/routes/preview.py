# -*- test-case-name: tests.preview.test_door -*-
"""
The ``preview`` group (SPEC §23): expose a port on the preview door, list,
describe and unexpose exposures, and mint the link that opens one.

The door itself (``preview_proxy``) is :mod:`sandboxd.preview`; these
handlers only change its table of exposures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sandboxd.access.links import preview_audience
from sandboxd.errors import (
    Code,
    bad_request,
    forbidden,
    limit_rule,
    policy_rule,
    unavailable,
)
from sandboxd.policy import defaults
from sandboxd.routes.links import mint
from sandboxd.web import params
from sandboxd.web.messages import ServerRequest, ServerResponse

_LABEL = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")


def _door(request: ServerRequest) -> Any:
    """
    The preview door's service.

    :raises ApiError: 503 when the daemon was started without ``--preview-port``.
    """
    door = request.context.preview
    if door is None or door.port is None:
        raise unavailable(
            "the preview door does not listen: start the daemon with --preview-port"
        )
    return door


def _port(request: ServerRequest) -> int:
    from sandboxd.preview.exposures import check_port

    return check_port(request.path_params["port"])


async def _listening(request: ServerRequest) -> set[int]:
    """
    The ports something listens on now, in a thread: asked of the kernel,
    or where it cannot be asked read from ``/proc/net/tcp{,6}``, whose
    reads walk the kernel's whole connection table.
    """
    from sandboxd import sysinfo

    ports: set[int] = await request.context.in_thread(sysinfo.listening_ports)
    return ports


def _shown(door: Any, exposure: Any, listening: set[int]) -> dict[str, Any]:
    out: dict[str, Any] = exposure.as_json(
        door.url(exposure.port, exposure.label), exposure.port in listening
    )
    return out


def _previewable(request: ServerRequest, door: Any) -> Callable[[int], bool]:
    """
    Whether a port could be previewed now: the door listens, exposing is
    enabled, and ``POST /preview/ports`` would not refuse the port (the
    daemon's own ports, ``params.ports``, ``params.deny_ports``).  A client
    such as the console offers a preview only where one can open.
    """
    rule = request.context.policy.rules.get("preview_expose")
    if door is None or door.port is None or rule is None or not rule.enabled:
        return lambda port: False
    return lambda port: bool(door.previewable(port, rule))


async def preview_ports_list(request: ServerRequest) -> dict[str, Any]:
    """``GET /preview/ports``: every exposure, then every other listening port."""
    from sandboxd import sysinfo
    from sandboxd.preview.exposures import reached

    bound: dict[int, set[str]] = await request.context.in_thread(
        sysinfo.listening_addresses
    )
    listening = set(bound)
    door = request.context.preview
    allowed = _previewable(request, door)

    def previewable(port: int) -> bool:
        # An app bound only to the sandbox's own address listens, but the
        # door (which connects to loopback) would only ever answer 502.
        return allowed(port) and reached(bound.get(port, set()))

    ports: list[dict[str, Any]] = []
    exposed: set[int] = set()
    if door is not None:
        door.exposures.prune()
        for exposure in sorted(door.exposures.by_port.values(), key=lambda e: e.port):
            exposed.add(exposure.port)
            ports.append(
                {
                    **_shown(door, exposure, listening),
                    "exposed": True,
                    "previewable": previewable(exposure.port),
                }
            )
    for port in sorted(listening - exposed):
        ports.append(
            {
                "port": port,
                "listening": True,
                "exposed": False,
                "previewable": previewable(port),
            }
        )
    return {"ports": ports}


async def preview_expose(request: ServerRequest) -> ServerResponse:
    """``POST /preview/ports``: expose a port; answers the exposure and its URL."""
    from sandboxd.preview.exposures import check_port

    door = _door(request)
    body = request.body
    port = check_port(body.get("port"))
    label = params.string(body.get("label"), "label", None)
    if label is not None and not _LABEL.match(label):
        raise bad_request("'label' must be 1-31 lower-case letters, digits or '-'")
    public = params.flag(body.get("public", False), "public", words=False)
    rule = request.rule
    if public and not rule.params.allow_public:
        raise forbidden(
            "public previews are not allowed",
            Code.PARAM_NOT_ALLOWED,
            rule=policy_rule(rule, "params.allow_public"),
        )
    ttl = params.seconds(
        body.get("ttl_seconds"),
        "ttl_seconds",
        None,
        ceiling=defaults.PREVIEW_MAX_TTL_SECONDS,
    )
    host_header = params.one_of(
        body.get("host_header", rule.params.host_header),
        "host_header",
        ("upstream", "preserve"),
    )
    door.check_port(port, rule)
    total = rule.limits.max_sessions
    share = None
    if total is not None:
        identities = len(request.context.policy.tokens.ids())
        share = defaults.identity_cap(total, identities, rule.limits.max_per_identity)
    exposure = door.exposures.expose(
        port,
        label,
        public,
        host_header,
        request.identity.root,
        ttl,
        total,
        limit_rule(rule, "max_sessions"),
        share,
        limit_rule(rule, "max_per_identity"),
        any_owner="*" in request.identity.scopes,
    )
    listening = await _listening(request)
    return ServerResponse.ok(_shown(door, exposure, listening), status=201)


async def preview_get(request: ServerRequest) -> dict[str, Any]:
    """``GET /preview/ports/{port}``: one exposure."""
    door = _door(request)
    exposure = door.exposures.get(_port(request))
    return _shown(door, exposure, await _listening(request))


async def preview_unexpose(request: ServerRequest) -> dict[str, Any]:
    """
    ``DELETE /preview/ports/{port}``: unexpose; what is in flight is closed.
    The answer says whether the app still listens, as the list does.
    """
    door = _door(request)
    identity = request.identity
    exposure = door.exposures.unexpose(
        _port(request), identity.root, any_owner="*" in identity.scopes
    )
    return _shown(door, exposure, await _listening(request))


def preview_link(request: ServerRequest) -> ServerResponse:
    """``POST /preview/ports/{port}/link``: a link that opens the preview."""
    door = _door(request)
    port = _port(request)
    door.exposures.get(port)
    body = request.body
    made = mint(
        request,
        preview_audience(port),
        None,
        body.get("ttl_seconds"),
        body.get("uses"),
    )
    return ServerResponse.ok(made, status=201)


HANDLERS = {
    "preview_ports_list": preview_ports_list,
    "preview_expose": preview_expose,
    "preview_get": preview_get,
    "preview_unexpose": preview_unexpose,
    "preview_link": preview_link,
}
