"""Subgroups: the last cascade plan, why a step declined, the running means."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame, launches, pending_switch, sharing_groups
from . import format as fmt
from .page_map import PLAN_COLOUR


def member_names(snap: dict, members) -> str:
    """Plan members by the ids the map's rows show; one no longer live says so."""
    live = {s["id"] for s in snap["sequences"]}
    return " ".join(f"#{m}" if m in live else f"#{m} (ended)" for m in members)


class SubgroupsPanel(Widget):
    frame: reactive[Frame | None] = reactive(None, layout=True)  # auto height follows the content

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "cascade subgroups"

    def render(self) -> Text:
        f = self.frame
        if f is None:
            return Text("…")
        snap = f.snapshot
        cfg = snap["cascade"]
        state = ("ON", "bold " + fmt.CASCADE_ON) if cfg["enabled"] else ("OFF", "bold " + fmt.CASCADE_OFF)
        lines = [Text.assemble("cascade ", state, f" · min pages {cfg['min_shared_pages']} · "
                                                  f"min members {cfg['min_members']}")]
        pending = pending_switch(snap)
        plan = None if pending else snap["plan"]
        if pending:
            lines.append(Text.assemble(("plan     ", "bold"), (pending, fmt.MUTED)))
        elif plan:
            lines.append(Text.assemble(("plan     ", "bold"), (f"{len(plan['members'])} members", PLAN_COLOUR),
                                       f" {member_names(snap, plan['members'])}"))
            lines.append(Text(f"         {plan['shared_pages']} shared pages · {fmt.count(plan['shared_tokens'])}"
                              " tokens read once a step"))
        else:
            lines.append(Text.assemble(("plan     ", "bold"), ("none on the last decode step", fmt.MUTED)))
        if snap["decline_reason"] and not pending:
            label = "planner  " if plan else "declined "
            lines.append(Text.assemble((label, "bold"), (snap["decline_reason"], "" if plan else fmt.WARN)))
        shared, members = f.means()
        n = launches(f.metrics, "cascade")
        lines.append(Text.assemble(
            ("means    ", "bold"),
            "no cascade launch yet" if shared is None else
            f"{shared:,.0f} tokens · {members:.2f} members a launch ({fmt.count(n)})"))
        groups = sharing_groups(snap["sequences"])
        lines.append(Text.assemble(
            ("sharing  ", "bold"),
            " · ".join(f"{g.name}: {len(g.members)} seqs × {g.shared_pages} pages" for g in groups)
            or "no two live sequences share a first page"))
        return Text("\n").join(lines)
