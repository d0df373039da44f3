# -*- test-case-name: tests.lsp.test_answers -*-
"""
What a language server answers, as an agent reads it: paths instead of
URIs, 1-based lines and columns in characters, kinds and severities by
name, hover contents as one text.  Pure: the caller brings the files'
text (:class:`~sandboxd.lsp.text.Text`).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from sandboxd.lsp.text import Text

SEVERITIES = (None, "error", "warning", "information", "hint")

SYMBOL_KINDS = (
    None,
    "file",
    "module",
    "namespace",
    "package",
    "class",
    "method",
    "property",
    "field",
    "constructor",
    "enum",
    "interface",
    "function",
    "variable",
    "constant",
    "string",
    "number",
    "boolean",
    "array",
    "object",
    "key",
    "null",
    "enum_member",
    "struct",
    "event",
    "operator",
    "type_parameter",
)

COMPLETION_KINDS = (
    None,
    "text",
    "method",
    "function",
    "constructor",
    "field",
    "variable",
    "class",
    "interface",
    "module",
    "property",
    "unit",
    "value",
    "enum",
    "keyword",
    "snippet",
    "color",
    "file",
    "reference",
    "folder",
    "enum_member",
    "constant",
    "struct",
    "event",
    "operator",
    "type_parameter",
)

#: The longest documentation or detail text one completion carries.
MAX_DOC_CHARS = 2000


def uri_of(path: str) -> str:
    """The ``file://`` URI of an absolute path."""
    return "file://" + urllib.parse.quote(path, safe="/")


def path_of(uri: Any) -> str | None:
    """The path of a ``file://`` URI; None for any other."""
    if not isinstance(uri, str):
        return None
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    path = urllib.parse.unquote(parts.path)
    return path if path.startswith("/") else None


def _name(table: tuple[str | None, ...], value: Any) -> str | None:
    if isinstance(value, int) and 0 < value < len(table):
        return table[value]
    return None


def locations(result: Any) -> list[tuple[str, Any]]:
    """
    ``(path, range)`` of each Location or LocationLink in a definition or
    references answer (one, a list, or null); URIs that are not files are
    left out.
    """
    items = result if isinstance(result, list) else [result]
    out: list[tuple[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "targetUri" in item:
            uri = item.get("targetUri")
            span = item.get("targetSelectionRange") or item.get("targetRange")
        else:
            uri, span = item.get("uri"), item.get("range")
        path = path_of(uri)
        if path is not None and isinstance(span, dict):
            out.append((path, span))
    return out


def severity_of(item: Any) -> str:
    """A diagnostic's severity by name (a server that gives none means an error)."""
    value = item.get("severity") if isinstance(item, dict) else None
    return _name(SEVERITIES, value) or "error"


def severity_counts(items: list[Any]) -> dict[str, int]:
    """How many of ``items`` (a publishDiagnostics list) there are of each severity."""
    counts = {s: 0 for s in SEVERITIES if s is not None}
    for item in items:
        if isinstance(item, dict):
            counts[severity_of(item)] += 1
    return counts


def most_severe(items: list[Any], keep: int) -> list[Any]:
    """
    ``keep`` of ``items``, the most severe first (errors before warnings,
    in the server's order within each): a file with a thousand warnings
    before its one error still shows the error.
    """
    if len(items) <= keep:
        return items
    rank = {name: i for i, name in enumerate(SEVERITIES) if name is not None}
    return sorted(items, key=lambda item: rank[severity_of(item)])[:keep]


def diagnostics(
    items: Any, text: Text, count_in: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """
    A publishDiagnostics list, in file order.

    :param count_in: by a diagnostic's ``source``, the unit its columns
        count when that is not the session's (a server's plugin that
        passes on another tool's offsets).
    """
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        code = item.get("code")
        source = _text(item.get("source"))
        unit = (count_in or {}).get(source)
        counted = text.in_encoding(unit) if unit is not None else text
        out.append(
            {
                **counted.span(item.get("range")),
                "severity": severity_of(item),
                "code": code if isinstance(code, (str, int)) else None,
                "source": source or None,
                "message": _text(item.get("message")),
            }
        )
    out.sort(key=lambda d: (d["line"], d["column"]))
    return out


def hover_text(contents: Any) -> str:
    """Hover contents (MarkupContent, a MarkedString, or a list of them) as one text."""
    if isinstance(contents, list):
        return "\n\n".join(t for t in (hover_text(c) for c in contents) if t)
    if isinstance(contents, str):
        return contents
    if isinstance(contents, dict):
        value = _text(contents.get("value"))
        language = contents.get("language")
        if isinstance(language, str) and value:
            return f"```{language}\n{value}\n```"
        return value
    return ""


def completions(
    result: Any, limit: int, typed: str = ""
) -> tuple[list[dict[str, Any]], bool, bool]:
    """
    ``(items, is_incomplete, truncated)`` of a completion answer (a list or
    a CompletionList), at most ``limit``: those that start with ``typed``
    (the name being typed) first, as an editor filters them, the same case
    before another; in the server's sort order within each.
    """
    incomplete = False
    items: Any = result
    if isinstance(result, dict):
        incomplete = bool(result.get("isIncomplete"))
        items = result.get("items")
    entries = (
        [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
    )
    entries.sort(key=lambda i: _text(i.get("sortText")) or _text(i.get("label")))
    if typed:
        entries.sort(key=lambda i: _typed_rank(i, typed))
    out = []
    for item in entries[:limit]:
        edit = item.get("textEdit")
        insert = edit.get("newText") if isinstance(edit, dict) else None
        if not isinstance(insert, str):
            insert = item.get("insertText")
        label = _text(item.get("label"))
        out.append(
            {
                "label": label,
                "kind": _name(COMPLETION_KINDS, item.get("kind")),
                "detail": _text(item.get("detail"))[:MAX_DOC_CHARS] or None,
                "documentation": hover_text(item.get("documentation"))[:MAX_DOC_CHARS]
                or None,
                "insert_text": insert if isinstance(insert, str) else label,
            }
        )
    return out, incomplete, len(entries) > limit


def _typed_rank(item: dict[str, Any], typed: str) -> int:
    """0: it is what was typed; 1: it starts so; 2: in another case; 3: neither."""
    name = _text(item.get("filterText")) or _text(item.get("label"))
    if name == typed:
        return 0
    if name.startswith(typed):
        return 1
    if name.lower().startswith(typed.lower()):
        return 2
    return 3


#: The name being typed: the word characters just before the cursor.
TYPED = re.compile(r"[\w$]*\Z")


def document_symbols(result: Any, text: Text, path: str) -> list[dict[str, Any]]:
    """
    A documentSymbol answer (hierarchical DocumentSymbols, or flat
    SymbolInformation) as a flat list in file order, each naming its
    ``container``: where its name is, and the lines its ``body`` spans (the
    whole definition, to read it by lines).
    """
    out: list[dict[str, Any]] = []
    for name, kind, container, span, whole in _symbols(result, None):
        body = text.span(whole)
        if body["end_column"] == 1 and body["end_line"] > body["line"]:
            # Ending at a line's start is ending with the line before.
            body["end_line"] -= 1
        out.append(
            {
                "name": name,
                "kind": kind,
                "container": container,
                "path": path,
                **text.span(span),
                "body": {"line": body["line"], "end_line": body["end_line"]},
            }
        )
    out.sort(key=lambda s: (s["line"], s["column"]))
    return out


def _symbols(
    items: Any, container: str | None
) -> Iterator[tuple[str, str | None, str | None, Any, Any]]:
    """``(name, kind, container, the name's range, the whole symbol's range)``."""
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        name = _text(item.get("name"))
        kind = _name(SYMBOL_KINDS, item.get("kind"))
        if "location" in item:
            location = item["location"]
            span = location.get("range") if isinstance(location, dict) else None
            outer = item.get("containerName")
            yield name, kind, outer if isinstance(outer, str) else container, span, span
            continue
        whole = item.get("range")
        yield (
            name,
            kind,
            container,
            item.get("selectionRange") or whole,
            whole or item.get("selectionRange"),
        )
        yield from _symbols(item.get("children"), name)


def workspace_symbols(result: Any) -> list[tuple[dict[str, Any], str, Any]]:
    """
    A workspace/symbol answer as ``(fields, path, range)``: the caller
    turns the range into lines with the file's text.  A symbol with no
    range (WorkspaceSymbol's URI-only location) is placed at its file's top.
    """
    out = []
    for item in result if isinstance(result, list) else []:
        if not isinstance(item, dict):
            continue
        location = item.get("location")
        if not isinstance(location, dict):
            continue
        path = path_of(location.get("uri"))
        if path is None:
            continue
        container = item.get("containerName")
        fields = {
            "name": _text(item.get("name")),
            "kind": _name(SYMBOL_KINDS, item.get("kind")),
            "container": container if isinstance(container, str) else None,
        }
        span = location.get("range") or {"start": {"line": 0, "character": 0}}
        out.append((fields, path, span))
    return out


def text_edits(edit: Any) -> tuple[dict[str, list[tuple[Any, str]]], list[str]]:
    """
    A WorkspaceEdit as ``({path: [(range, new_text)]}, operations)``: its
    ``changes`` or ``documentChanges`` text edits by file, and the kinds of
    the file operations it also asks for (``create``, ``rename``,
    ``delete``), which the caller refuses.  Edits of a URI that is not a
    file count as an operation (``uri``).
    """
    edits: dict[str, list[tuple[Any, str]]] = {}
    operations: list[str] = []

    def add(uri: Any, items: Any) -> None:
        path = path_of(uri)
        if path is None:
            operations.append("uri")
            return
        for item in items if isinstance(items, list) else []:
            span = item.get("range") if isinstance(item, dict) else None
            if isinstance(span, dict):
                edits.setdefault(path, []).append((span, _text(item.get("newText"))))

    if not isinstance(edit, dict):
        return edits, operations
    changes = edit.get("documentChanges")
    if isinstance(changes, list):
        for change in changes:
            if not isinstance(change, dict):
                continue
            if "kind" in change:
                operations.append(_text(change.get("kind")) or "unknown")
                continue
            document = change.get("textDocument")
            uri = document.get("uri") if isinstance(document, dict) else None
            add(uri, change.get("edits"))
    elif isinstance(edit.get("changes"), dict):
        for uri, items in edit["changes"].items():
            add(uri, items)
    return edits, operations


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
