"""Readable counts for the stages' one-line summaries and `inspect` texts (parameters, MACs, instructions, cycles)."""

from __future__ import annotations


def human_count(n: float) -> str:
    """Three significant digits and a k/M/G suffix: 999, 1.23k, 12.3k, 123k, 1.13M, 2.50G (counts below 1000 as
    whole numbers). Rounding never shows four digits: 999,999 is 1.00M, not 1000k."""
    if n < 999.5:
        return f"{n:.0f}"
    for div, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G")):
        x = n / div
        if x < 999.5 or suffix == "G":
            decimals = 2 if x < 9.995 else 1 if x < 99.95 else 0
            return f"{x:.{decimals}f}{suffix}"
    raise AssertionError("unreachable")
