"""
Hostile requests derived from the endpoint table and its declared fields,
for the sweep in :mod:`tests.security.test_every_endpoint`.

Every case says whether the daemon must refuse it (``refuse``: a wrong
type, a value out of every declared range, a body that is no object) or may
take it (an empty object, unknown fields, a null that means "not given"):
either way it must not be answered 5xx, and a refusal carries a ``code``
in the door's own framing and leaves nothing done.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import attrs

from sandboxd.api.fields import Field
from sandboxd.api.schema import PATH_PARAMS, schema_for
from sandboxd.endpoints import Endpoint

#: One MiB of text, for string fields.
MIB = 1 << 20

#: JSON nesting deeper than any parser's recursion allows.
DEPTH = 100_000

#: A placeholder the body is built with, replaced by raw JSON text after
#: encoding (``1e309`` is not a value ``json.dumps`` can write).
_RAW = "\x00sweep-raw\x00"

#: One value of each JSON type, for "the wrong type".
SAMPLES: dict[str, Any] = {
    "string": "sweep",
    "integer": 7,
    "object": {"sweep": 1},
    "array": ["sweep"],
    "boolean": True,
}

#: Which sample types a declared type takes: a number takes an integer, a
#: field of type ``any`` takes everything.
ACCEPTS: dict[str, set[str]] = {
    "string": {"string"},
    "integer": {"integer"},
    "number": {"integer"},
    "boolean": {"boolean"},
    "object": {"object"},
    "array": {"array"},
}


@attrs.frozen
class Case:
    """
    One hostile request.

    :ivar what: a short label naming the field and the value.
    :ivar target: the request target (path and query).
    :ivar body: the raw body, or None for none.
    :ivar refuse: the daemon must answer 4xx (else it may also take it).
    """

    what: str
    method: str
    target: str
    body: bytes | None
    refuse: bool


def path_values(name: str) -> list[tuple[str, bool]]:
    """Values for a path parameter: (text, must be refused)."""
    declared = PATH_PARAMS.get(name, Field(name))
    if declared.type == "integer":
        return [
            ("sweep", True),
            ("-1", True),
            ("0", True),
            (str(2**64), True),
            ("1e309", True),
        ]
    return [("sweep-nothing-here", True)]


def live_id(endpoint: Endpoint, name: str, ids: Mapping[str, str]) -> str | None:
    """
    The live thing's id for the endpoint's parameter ``name``: ``ids``
    may key one by the path's first segment too (``v1/turn_id``), where
    two doors name different things alike.
    """
    return ids.get(f"{endpoint.segments[0]}/{name}", ids.get(name))


def fill_path(endpoint: Endpoint, ids: Mapping[str, str] | None = None) -> str:
    """
    The path with every ``{param}`` replaced: by the id of a live thing
    from ``ids`` when there is one, else by a name nothing has.
    """
    parts = []
    for segment in endpoint.segments:
        name = segment[1:-1] if segment.startswith("{") else None
        if name is not None:
            found = live_id(endpoint, name, ids or {})
            parts.append(quote(found or "sweep-nothing-here", safe=""))
        else:
            parts.append(segment)
    return "/" + "/".join(parts)


def encode(body: Any, raw: str | None = None) -> bytes:
    """``body`` as JSON, with the placeholder replaced by ``raw`` text."""
    text = json.dumps(body)
    if raw is not None:
        text = text.replace(json.dumps(_RAW), raw)
    return text.encode()


def deep_array() -> str:
    return "[" * DEPTH + "]" * DEPTH


def deep_object() -> str:
    return '{"a":' * DEPTH + "{}" + "}" * DEPTH


def concrete(example: Any) -> bool:
    """Whether a declared example is a value (not a ``$PLACEHOLDER``)."""
    if isinstance(example, str):
        return not example.startswith("$")
    return example is not None


def valid_base(fields: tuple[Field, ...]) -> dict[str, Any]:
    """
    The required fields at their declared examples: each hostile value is
    sent beside them, so that it is the value, not a missing field, that
    the daemon must refuse.
    """
    return {f.name: f.example for f in fields if f.required and concrete(f.example)}


def takes_json_body(endpoint: Endpoint) -> bool:
    """Whether the endpoint parses a JSON body (POST or DELETE)."""
    if endpoint.method not in ("POST", "DELETE"):
        return False
    return endpoint.body == "json" or endpoint.door == "openai"


def _number_cases(field: Field) -> Iterator[tuple[str, str, bool]]:
    """Out-of-range numbers for an integer or number field, as JSON text."""
    yield "1e309", "1e309", True
    yield "-1e309", "-1e309", True
    if field.type == "integer":
        yield "1.5", "1.5", True
    low_ok = field.minimum is None or field.minimum <= -1
    yield "-1", "-1", not low_ok
    high_ok = field.maximum is None or field.maximum >= 2**64
    yield "2**64", str(2**64), not high_ok


def body_cases(endpoint: Endpoint, path: str) -> Iterator[Case]:
    """The hostile JSON bodies of one endpoint."""
    method = endpoint.method

    def case(what: str, body: bytes, refuse: bool) -> Case:
        return Case(what, method, path, body, refuse)

    yield case("not JSON", b"{nope", True)
    yield case("a lone surrogate", b'{"a": "\\ud800"}', True)
    yield case("a JSON array", b"[]", True)
    yield case("a JSON string", b'"sweep"', True)
    yield case("a JSON number", b"7", True)
    yield case("JSON null", b"null", True)
    yield case("JSON true", b"true", True)
    yield case("nested arrays", deep_array().encode(), True)
    yield case("nested objects", deep_object().encode(), False)
    yield case("an empty object", b"{}", False)
    yield case("unknown fields", encode({"sweep_unknown": 1, "": None}), False)
    schema = schema_for(endpoint.id)
    base = valid_base(schema.body)
    carries_files = endpoint.upload or endpoint.body == "raw"
    for field in schema.body:
        name = field.name

        def body(value: Any, raw: str | None = None, name: str = name) -> bytes:
            return encode({**base, name: value}, raw)

        if field.type != "any":
            for kind, value in SAMPLES.items():
                if kind not in ACCEPTS.get(field.type, set()):
                    yield case(f"{name}: {kind}", body(value), True)
        if field.required:
            yield case(f"{name}: null", body(None), True)
        yield case(f"{name}: nested", body(_RAW, deep_array()), field.type != "any")
        if field.type in ("string", "any"):
            # A file's content (base64) may be that big; anything else is
            # over the request cap.
            content = carries_files or "base64" in field.doc
            yield case(f"{name}: 1 MiB", body("x" * MIB), not content)
        if field.enum and field.type == "string":
            yield case(f"{name}: not in enum", body("sweep-no"), True)
        if field.type in ("integer", "number"):
            for label, text, refuse in _number_cases(field):
                # A value that may be taken is sent alone: beside the
                # examples it would be a real call (a clone, an agent).
                sent = body(_RAW, text) if refuse else encode({name: _RAW}, text)
                yield case(f"{name}: {label}", sent, refuse)


def query_cases(endpoint: Endpoint, path: str) -> Iterator[Case]:
    """The hostile query strings of one endpoint."""
    method = endpoint.method
    body = b"{}" if takes_json_body(endpoint) else None
    schema = schema_for(endpoint.id)

    def case(what: str, query: str, refuse: bool) -> Case:
        return Case(what, method, f"{path}?{query}", body, refuse)

    if not endpoint.streaming:
        yield case("unknown parameter", "sweep_unknown=1", False)
    for field in schema.query:
        name = field.name
        if name == "access_token":
            continue
        if field.type in ("integer", "number"):
            yield case(f"{name}=sweep", f"{name}=sweep", True)
            for label, text, refuse in _number_cases(field):
                if refuse or not endpoint.streaming:
                    yield case(f"{name}={label}", f"{name}={quote(text)}", refuse)
        elif field.type == "boolean":
            yield case(f"{name}=maybe", f"{name}=maybe", True)
        elif field.enum:
            yield case(f"{name}=not in enum", f"{name}=sweep-no", True)
        if field.type in ("string", "any") or field.enum:
            yield case(f"{name}=1 MiB", f"{name}={'x' * MIB}", True)


def path_cases(endpoint: Endpoint) -> Iterator[Case]:
    """Hostile path parameters (refused: nothing has these names)."""
    body = b"{}" if takes_json_body(endpoint) else None
    params = [s[1:-1] for s in endpoint.segments if s.startswith("{")]
    for name in params:
        for text, refuse in path_values(name):
            target = "/" + "/".join(
                quote(text, safe="")
                if s == "{" + name + "}"
                else ("sweep-nothing-here" if s.startswith("{") else s)
                for s in endpoint.segments
            )
            yield Case(f"{{{name}}}={text}", endpoint.method, target, body, refuse)


def cases(endpoint: Endpoint, ids: Mapping[str, str] | None = None) -> list[Case]:
    """
    Every hostile request the sweep sends to one endpoint; its body and
    query cases go to the live things of ``ids`` (by path parameter).
    """
    path = fill_path(endpoint, ids)
    found = list(path_cases(endpoint))
    if takes_json_body(endpoint):
        found.extend(body_cases(endpoint, path))
    found.extend(query_cases(endpoint, path))
    return found
