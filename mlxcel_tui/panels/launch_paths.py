"""Launch paths: fused_v2 / gather / cascade counts and rates, failures, and
the warning that cascade is enabled but never activating."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import CASCADE_FAILURES, Frame, launches, pending_switch
from . import format as fmt

ROWS = (("fused_v2", "fused_v2", "pages read in place"),
        ("cascade", "└ cascade", "of fused_v2"),
        ("gather", "gather", "prefill, fallback"))


class LaunchPathsPanel(Widget):
    frame: reactive[Frame | None] = reactive(None, layout=True)  # auto height follows the content

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "launch paths"

    def render(self) -> Group | Text:
        f = self.frame
        if f is None:
            return Text("…")
        table = Table(box=None, padding=(0, 1), show_edge=False, expand=True)
        table.add_column("path", no_wrap=True)
        table.add_column("launches", justify="right", no_wrap=True)
        table.add_column("/s", justify="right", no_wrap=True)
        table.add_column("", style=fmt.MUTED, no_wrap=True, overflow="ellipsis", ratio=1)
        fused = launches(f.metrics, "fused_v2")
        for path, label, note in ROWS:
            n = launches(f.metrics, path)
            if path == "cascade":
                note = f"{fmt.percent(n, fused)} {note}"
            table.add_row(label, fmt.count(n), fmt.rate(f.rate(path)), note)
        failures = f.metrics.get(CASCADE_FAILURES, 0.0)
        table.add_row(Text("failures", style=fmt.BAD if failures else ""), fmt.count(failures),
                      fmt.rate(f.rates.get(CASCADE_FAILURES)), "cascades that fell back")
        snap = f.snapshot
        pending = pending_switch(snap)
        if pending:
            status = Text(f"cascade {pending}", style=fmt.MUTED)
        elif f.stalled:
            why = snap["decline_reason"] or "no reason given"
            status = Text(f"⚠ cascade is ON but not activating: {fmt.count(f.stalled_launches)} fused_v2 launches "
                          f"since the last cascade launch. Planner: {why}", style="bold " + fmt.BAD)
        elif snap["cascade"]["enabled"]:
            status = Text(f"cascade ON · last step: {snap['last_path'] or '—'}", style=fmt.CASCADE_ON)
        else:
            status = Text("cascade OFF: every decode step is a flat fused_v2 launch (c switches it on)",
                          style=fmt.CASCADE_OFF)
        return Group(table, status)
