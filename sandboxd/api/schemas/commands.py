"""What the endpoints of the template author's commands take and give."""

from __future__ import annotations

from sandboxd.api.fields import E, F, Schema

SCHEMAS: dict[str, Schema] = {
    "list_commands": Schema(
        response=(
            F(
                "commands",
                "array",
                "[{name, description, args: [{name, type, required, "
                "default, description}]}]; hidden ones and those the caller may not "
                "run are left out",
                items="object",
            ),
        ),
    ),
    "run_command": Schema(
        body=(F("*", "any", "the command's arguments by name", example=None),),
        open_body=True,
        response=(F("result", "any", "what the command returned"),),
        errors=(
            E(
                400,
                "invalid_param",
                "a required argument is missing, undeclared or uncoercible",
            ),
            E(
                403,
                "missing_scope",
                "the command's own scopes (or commands:run:NAME) are lacking",
            ),
            E(
                404,
                "not_found",
                "unknown command; the message lists the available ones",
            ),
            E(
                429,
                "concurrency_limited",
                "max_concurrency commands are running for their callers, or as many"
                " answered at their timeout still run (listed in stuck)",
            ),
            E(
                500,
                "internal",
                "the command raised (type is its exception's name; the traceback"
                " goes to the daemon's log), or its result is not JSON: a number"
                " that is infinite or NaN (type ValueError); a coroutine command"
                " that awaited a Deferred is told so",
            ),
            E(
                500,
                "timeout",
                "the command did not finish within the endpoint's timeout_seconds"
                " (300 by default; type TimeoutError, limit timeout_seconds and"
                " the rule named); a plain function runs on, as a thread cannot"
                " be stopped",
            ),
        ),
        notes="Arguments are coerced to the declared types: string, integer, "
        "float (finite: a text such as `inf`, `nan` or `1e309` is refused), "
        "boolean (true/false/yes/no/1/0). A result JSON cannot carry (a "
        "datetime, bytes, a set) is sent as its str().",
    ),
}
