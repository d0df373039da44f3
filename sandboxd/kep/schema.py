# -*- test-case-name: tests.kep.test_wire -*-
"""
The ``process.v1`` messages of the agent-sandbox runtime protocol.

Field names and numbers are wire facts of
``packages/sandboxd/spec/process/v1/process.proto``; a test checks each
message against the SDK's generated classes.  Enum fields decode to their
number (proto3 enums are open: an unknown number is kept, not refused);
:class:`Signal` names the numbers the protocol defines.
"""

from __future__ import annotations

import enum

import attrs

from sandboxd.proto3 import Kind, Schema, field, message, oneof

__all__ = [
    "EMPTY",
    "EXECUTE",
    "EXECUTE_REQUEST",
    "EXECUTE_RESPONSE",
    "EXIT_EVENT",
    "INIT_EVENT",
    "PROCESS_CONFIG",
    "PTY",
    "RESIZE_TTY",
    "RESIZE_TTY_REQUEST",
    "RESIZE_TTY_RESPONSE",
    "RPCS",
    "SEND_SIGNAL",
    "SEND_SIGNAL_REQUEST",
    "SEND_SIGNAL_RESPONSE",
    "SERVICE",
    "START",
    "START_REQUEST",
    "START_RESPONSE",
    "WRITE_STDIN",
    "WRITE_STDIN_REQUEST",
    "WRITE_STDIN_RESPONSE",
    "Rpc",
    "Signal",
]

#: The gRPC service name: a method's path is ``/SERVICE/Method``.
SERVICE = "process.v1.ProcessService"


class Signal(enum.IntEnum):
    """``process.v1.Signal``: the numbers are the POSIX signals' own."""

    SIGNAL_UNSPECIFIED = 0
    SIGNAL_SIGINT = 2
    SIGNAL_SIGKILL = 9
    SIGNAL_SIGTERM = 15


#: ``google.protobuf.Empty``.
EMPTY: Schema = message("google.protobuf.Empty")

PTY: Schema = message(
    "process.v1.PTY",
    field(1, "cols", Kind.UINT32),
    field(2, "rows", Kind.UINT32),
)

PROCESS_CONFIG: Schema = message(
    "process.v1.ProcessConfig",
    field(1, "command", Kind.STRING, repeated=True),
    field(2, "env_vars", Kind.MAP),
    field(3, "cwd", Kind.STRING, optional=True),
)

START_REQUEST: Schema = message(
    "process.v1.StartRequest",
    field(1, "config", Kind.MESSAGE, message=PROCESS_CONFIG),
    field(2, "pty", Kind.MESSAGE, optional=True, message=PTY),
)

INIT_EVENT: Schema = message(
    "process.v1.InitEvent",
    field(1, "process_id", Kind.INT32),
)

EXIT_EVENT: Schema = message(
    "process.v1.ExitEvent",
    field(1, "exit_code", Kind.INT32),
)

START_RESPONSE: Schema = message(
    "process.v1.StartResponse",
    oneof(
        "event",
        field(1, "init", Kind.MESSAGE, message=INIT_EVENT),
        field(2, "stdout", Kind.BYTES),
        field(3, "stderr", Kind.BYTES),
        field(4, "exit", Kind.MESSAGE, message=EXIT_EVENT),
    ),
)

EXECUTE_REQUEST: Schema = message(
    "process.v1.ExecuteRequest",
    field(1, "config", Kind.MESSAGE, message=PROCESS_CONFIG),
)

EXECUTE_RESPONSE: Schema = message(
    "process.v1.ExecuteResponse",
    field(1, "exit_code", Kind.INT32),
    field(2, "stdout", Kind.BYTES),
    field(3, "stderr", Kind.BYTES),
)

WRITE_STDIN_REQUEST: Schema = message(
    "process.v1.WriteStdinRequest",
    field(1, "process_id", Kind.INT32),
    oneof(
        "payload",
        field(2, "input", Kind.BYTES),
        field(3, "eof", Kind.MESSAGE, message=EMPTY),
    ),
)

WRITE_STDIN_RESPONSE: Schema = message("process.v1.WriteStdinResponse")

SEND_SIGNAL_REQUEST: Schema = message(
    "process.v1.SendSignalRequest",
    field(1, "process_id", Kind.INT32),
    field(2, "signal", Kind.ENUM),
)

SEND_SIGNAL_RESPONSE: Schema = message("process.v1.SendSignalResponse")

RESIZE_TTY_REQUEST: Schema = message(
    "process.v1.ResizeTTYRequest",
    field(1, "process_id", Kind.INT32),
    field(2, "cols", Kind.UINT32),
    field(3, "rows", Kind.UINT32),
)

RESIZE_TTY_RESPONSE: Schema = message("process.v1.ResizeTTYResponse")


@attrs.frozen
class Rpc:
    """One method of the service: what a transport needs to route and frame it."""

    name: str
    request: Schema
    response: Schema
    server_streaming: bool = False

    @property
    def path(self) -> str:
        """The HTTP/2 ``:path`` of the method."""
        return f"/{SERVICE}/{self.name}"


START = Rpc("Start", START_REQUEST, START_RESPONSE, server_streaming=True)
EXECUTE = Rpc("Execute", EXECUTE_REQUEST, EXECUTE_RESPONSE)
WRITE_STDIN = Rpc("WriteStdin", WRITE_STDIN_REQUEST, WRITE_STDIN_RESPONSE)
SEND_SIGNAL = Rpc("SendSignal", SEND_SIGNAL_REQUEST, SEND_SIGNAL_RESPONSE)
RESIZE_TTY = Rpc("ResizeTTY", RESIZE_TTY_REQUEST, RESIZE_TTY_RESPONSE)

#: Every method of ``process.v1.ProcessService``, in the ``.proto``'s order.
RPCS: tuple[Rpc, ...] = (START, EXECUTE, WRITE_STDIN, SEND_SIGNAL, RESIZE_TTY)
