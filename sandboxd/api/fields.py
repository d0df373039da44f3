"""
The pieces an endpoint's schema is written in: fields, error cases, stream
events and the schema that holds them (:mod:`sandboxd.api.schema` keys them
by endpoint id).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Field:
    """
    One named value: a query parameter, a body field or a response field.

    :ivar type: a JSON type (``string``, ``integer``, ``number``,
        ``boolean``, ``object``, ``array``) or ``any``.
    :ivar items: the element type of an ``array``.
    :ivar default: the value used when the field is absent (None: no
        default worth stating).
    :ivar example: a value for generated examples (curl); fields without
        one are left out of them.
    :ivar enum: the only accepted values, when there is a closed set.
    :ivar nullable: a response field that may be ``null``.
    :ivar min_length: the shortest string the handler accepts (1 for a
        name it refuses when empty); of each item, for an array.
    :ivar min_items: the fewest items an array may have.
    :ivar minimum: the smallest number accepted.
    :ivar maximum: the largest number accepted.
    """

    name: str
    type: str = "string"
    doc: str = ""
    required: bool = False
    default: Any = None
    example: Any = None
    items: str | None = None
    enum: tuple[Any, ...] = ()
    nullable: bool = False
    min_length: int | None = None
    min_items: int | None = None
    minimum: int | None = None
    maximum: int | None = None


@attrs.frozen
class ErrorCase:
    """An error an endpoint answers with: status, ``code``, and when."""

    status: int
    code: str
    when: str
    type: str = ""


@attrs.frozen
class Event:
    """One SSE event name and the JSON its ``data:`` line carries."""

    name: str
    data: str


@attrs.frozen
class Schema:
    """
    The request and response of one endpoint.

    :ivar produces: ``json``, ``sse`` (an event stream; ``events`` lists
        its event names), ``binary`` (raw bytes), ``prometheus`` (the
        Prometheus text format) or ``websocket``.
    :ivar status: the success status (201/202 for creating routes).
    :ivar raw_body: the request body is raw bytes, not JSON.
    :ivar open_body: the JSON body is free-form (a command's arguments):
        any name is accepted, so no field list can be complete.
    """

    summary: str = ""
    query: tuple[Field, ...] = ()
    body: tuple[Field, ...] = ()
    headers: tuple[Field, ...] = ()
    response: tuple[Field, ...] = ()
    errors: tuple[ErrorCase, ...] = ()
    events: tuple[Event, ...] = ()
    produces: str = "json"
    status: int = 200
    raw_body: bool = False
    open_body: bool = False
    notes: str = ""


F = Field
E = ErrorCase
