"""What the A/B tools share: measure two source trees alternately, round by round, and print
one row of medians with min-max and the after/before ratio."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def alternate(measure: Callable[[str], float], rounds: int) -> dict[str, list[float]]:
    """``measure("before")`` and ``measure("after")`` ``rounds`` times each, alternating
    which goes first, so that a host drifting during the run drifts for both alike."""
    got: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(rounds):
        for which in ("before", "after") if r % 2 == 0 else ("after", "before"):
            got[which].append(measure(which))
    return got


def row(label: str, got: dict[str, list[float]], width: int) -> str:
    """The label, each tree's median (min-max), and after/before of the medians."""
    med = {k: statistics.median(v) for k, v in got.items()}
    cells = {k: f"{_num(med[k])} ({_num(min(v))}-{_num(max(v))})" for k, v in got.items()}
    ratio = med["after"] / med["before"]
    return f"{label:<{width}}{cells['before']:>24}{cells['after']:>24}{ratio:>13.2f}x"


def _num(x: float) -> str:
    """A rate to three or more significant digits: 4,655 or 3.21."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
