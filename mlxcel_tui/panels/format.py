"""Number formatting and the colours the panels share (chosen to read on both
the dark and the light theme)."""

from __future__ import annotations

OK = "#5faf00"
WARN = "#d78700"
BAD = "#d70000"
MUTED = "#808080"
CASCADE_ON = "#5faf00"
CASCADE_OFF = "#5f87d7"


def size(n: float | None) -> str:
    if n is None:
        return "n/a"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def count(n: float) -> str:
    return f"{n:,.0f}"


def rate(r: float | None) -> str:
    return "—" if r is None else f"{r:,.1f}"


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.2f} ms"


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"
