"""``bench/invocations.py``: medians and ranges over compare.sh tables."""

from __future__ import annotations

import importlib.util
import os

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIRST = """\
| workload | a | b |
|---|---|---|
| W1 req/s | 1,000 | 10 |
| W1 p50 / p99 ms | 0.10 / 1.0 | 0.20 / 2.0 |
| W5 real | yes | yes |

"""
# The same servers in the other order, as a rotated invocation prints them.
SECOND = """\
| workload | b | a |
|---|---|---|
| W1 req/s | 30 | 3,000 |
| W1 p50 / p99 ms | 0.40 / 4.0 | 0.30 / 3.0 |
| W5 real | yes | no |

"""
THIRD = SECOND.replace("30 | 3,000", "20 | 2,000")


def load() -> object:
    spec = importlib.util.spec_from_file_location(
        "invocations", os.path.join(ROOT, "bench", "invocations.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InvocationTests(SynchronousTestCase):
    def test_columns_matched_by_name(self) -> None:
        """Rotated columns line up; each part gets its median and range."""
        inv = load()
        servers, cells, count = inv.read_tables(FIRST + SECOND + THIRD)  # type: ignore[attr-defined]
        self.assertEqual((servers, count), (["a", "b"], 3))
        table = inv.render(servers, cells, count)  # type: ignore[attr-defined]
        self.assertIn("| W1 req/s | 2,000 (1,000–3,000) | 20 (10–30) |", table)
        self.assertIn(
            "| W1 p50 / p99 ms | 0.30 (0.10–0.30) / 3.00 (1.00–3.00) "
            "| 0.40 (0.20–0.40) / 4.00 (2.00–4.00) |",
            table,
        )
        self.assertIn("| W5 real | yes/no/no | yes |", table)

    def test_against(self) -> None:
        """
        Per invocation, one server's figure over the best other's: higher
        is better for a rate, lower for a latency's chosen part; a row a
        table lacks, or a mark, is ``–``.
        """
        inv = load()
        header = "| workload | sd | st | fa |\n|---|---|---|---|\n"
        first = header + (
            "| W1 GET /health c1: req/s | 1,500 | 1,000 | 500 |\n"
            "| W6 PTY keystroke echo p50 / p99 ms | 0.20 / 0.60 | 0.30 / 0.40 | 0.25 / 0.50 |\n"
            "\n"
        )
        second = header + (
            "| W1 GET /health c1: req/s | 900 | ERR | 1,000 |\n"
            "| W6 PTY keystroke echo p50 / p99 ms | 0.20 / 0.30 | – | 0.25 / 0.50 |\n"
            "\n"
        )
        tables = inv.read_each(first + second)  # type: ignore[attr-defined]
        table = inv.against(tables, "sd")  # type: ignore[attr-defined]
        self.assertIn(
            "| W1 GET /health c1: req/s, higher is better | 1.50 (st) | 0.90 (fa) |",
            table,
        )
        self.assertIn(
            "| W6 PTY keystroke echo p50 / p99 ms (second figure), lower is better "
            "| 1.50 (st) | 0.60 (fa) |",
            table,
        )
        self.assertNotIn("W4", table)
