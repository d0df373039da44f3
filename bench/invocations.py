"""
Medians and ranges over several invocations of the shared harness.

``../shared/bench/compare.sh`` prints one side-by-side table per
invocation. The performance page reports each figure as the median over
the invocations with the range in brackets; this reads the printed
tables (from the saved output of one or more runs) and writes that
table. Columns are matched by server name, not position: invocations
that start the servers in different orders (so that none always runs
right after another's heaviest round) line up all the same.

Usage: ``python bench/invocations.py OUT.LOG [...] > table.md``
(``--order a,b,c`` sets the column order; by default, first seen).

``--against NAME`` writes instead, invocation by invocation, NAME's
figure over the best of the other servers' in the same invocation for
the rows that have a target (W1 at one connection, W1b, W4: higher is
better, so 1.0 or more meets it; the keystroke echo's p99 and the first
events' p50 of W7: lower is better, so 1.0 or less meets it).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

_TABLE = re.compile(r"(\| workload \|.*?)(?:\n\n|\Z)", re.S)

#: workload -> server -> one cell per invocation
Cells = dict[str, dict[str, list[str]]]


def read_tables(text: str) -> tuple[list[str], Cells, int]:
    """The servers (first seen first), the cells, and how many tables."""
    servers: list[str] = []
    cells: Cells = {}
    tables = _TABLE.findall(text)
    for table in tables:
        lines = [line for line in table.strip().splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")][1:]
        servers += [name for name in header if name not in servers]
        for line in lines[2:]:
            row = [c.strip() for c in line.strip("|").split("|")]
            for server, value in zip(header, row[1:], strict=True):
                cells.setdefault(row[0], {}).setdefault(server, []).append(value)
    return servers, cells, len(tables)


#: (row prefix, which `` / ``-part, whether higher is better) of the
#: figures the per-call work is judged by.
TARGETS: list[tuple[str, int, bool]] = [
    ("W1 GET /health c1: req/s", 0, True),
    ("W1b GET /download", 0, True),
    ("W4 POST /shell", 0, True),
    ("W6 PTY keystroke echo", 1, False),
    ("W7 ... first event", 0, False),
]


def read_each(text: str) -> list[dict[str, dict[str, str]]]:
    """Each table on its own: row -> server -> cell."""
    out = []
    for table in _TABLE.findall(text):
        lines = [line for line in table.strip().splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")][1:]
        rows: dict[str, dict[str, str]] = {}
        for line in lines[2:]:
            row = [c.strip() for c in line.strip("|").split("|")]
            rows[row[0]] = dict(zip(header, row[1:], strict=True))
        out.append(rows)
    return out


def part(cell: str, index: int) -> float | None:
    """The ``index``-th `` / ``-separated figure of a cell, if it is one."""
    parts = cell.split(" / ")
    return number(parts[index]) if index < len(parts) else None


def against(tables: list[dict[str, dict[str, str]]], name: str) -> str:
    """
    The markdown table of ``name``'s figure over the best other server's,
    one column per invocation; ``–`` where either is missing.
    """
    lines = [
        "| target | "
        + " | ".join(f"invocation {i + 1}" for i in range(len(tables)))
        + " |",
        "|---" * (len(tables) + 1) + "|",
    ]
    for prefix, index, higher in TARGETS:
        label = ""
        shown = []
        for rows in tables:
            row = next((r for r in rows if r.startswith(prefix)), None)
            if row is None:
                shown.append("–")
                continue
            label = label or row
            ours = part(rows[row].get(name, ""), index)
            others = {
                server: part(cell, index)
                for server, cell in rows[row].items()
                if server != name
            }
            known = {s: v for s, v in others.items() if v is not None and v > 0}
            if ours is None or not known:
                shown.append("–")
                continue
            pick = max if higher else min
            best = pick(known, key=lambda s: known[s])
            shown.append(f"{ours / known[best]:.2f} ({best})")
        if label:
            which = "higher" if higher else "lower"
            part_name = (
                f" ({['first', 'second'][index]} figure)" if " / " in label else ""
            )
            head = f"{label}{part_name}, {which} is better"
            lines.append(f"| {head} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def number(text: str) -> float | None:
    """A cell's figure, or None for a mark (``yes``, ``ERR``, ``–``)."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def figure(x: float) -> str:
    """Thousands with commas, three significant digits below."""
    if abs(x) >= 1000:
        return f"{round(x):,}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.3g}"
    return f"{x:.2f}"


def summarise(values: list[str]) -> str:
    """
    ``median (low–high)`` for each `` / ``-separated part of the cells;
    a part that is not a figure in every invocation is given as is (the
    same in all, or each in turn).
    """
    parts = [v.split(" / ") for v in values]
    out = []
    for k in range(max(len(p) for p in parts)):
        texts = [p[k] if k < len(p) else "?" for p in parts]
        figures = [number(t) for t in texts]
        known = [f for f in figures if f is not None]
        if len(known) == len(texts):
            low, mid, high = min(known), statistics.median(known), max(known)
            out.append(f"{figure(mid)} ({figure(low)}–{figure(high)})")
        elif len(set(texts)) == 1:
            out.append(texts[0])
        else:
            out.append("/".join(texts))
    return " / ".join(out)


def render(servers: list[str], cells: Cells, count: int) -> str:
    """The markdown table."""
    lines = [
        "| workload | " + " | ".join(f"{s} (n={count})" for s in servers) + " |",
        "|---" * (len(servers) + 1) + "|",
    ]
    for workload, row in cells.items():
        shown = [summarise(row[s]) if s in row else "–" for s in servers]
        lines.append(f"| {workload} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--order", help="comma-separated server names")
    parser.add_argument(
        "--against",
        metavar="NAME",
        help="NAME over the best other server, per invocation",
    )
    args = parser.parse_args(argv)
    text = ""
    for path in args.logs:
        with open(path, encoding="utf-8") as f:
            text += f.read() + "\n\n"
    if args.against:
        tables = read_each(text)
        if not tables:
            print("no compare.sh tables found", file=sys.stderr)
            return 1
        sys.stdout.write(against(tables, args.against))
        return 0
    servers, cells, count = read_tables(text)
    if not count:
        print("no compare.sh tables found", file=sys.stderr)
        return 1
    if args.order:
        wanted = args.order.split(",")
        servers = [s for s in wanted if s in servers] + [
            s for s in servers if s not in wanted
        ]
    sys.stdout.write(render(servers, cells, count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
