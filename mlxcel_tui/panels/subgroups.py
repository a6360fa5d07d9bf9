"""Subgroups: the last cascade plan, why a step declined, the running means."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame, launches, sharing_groups
from . import format as fmt
from .page_map import PLAN_COLOUR


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
        lines = [Text.assemble("cascade ", state,
                               f" · min shared pages {cfg['min_shared_pages']} · min members {cfg['min_members']}")]
        plan = snap["plan"]
        if plan:
            ids = " ".join(f"#{m}" for m in plan["members"])
            lines.append(Text.assemble(("plan     ", "bold"), (f"{len(plan['members'])} members", PLAN_COLOUR),
                                       f" {ids}"))
            lines.append(Text(f"         {plan['shared_pages']} shared pages · {fmt.count(plan['shared_tokens'])}"
                              " KV tokens read once per step"))
        else:
            lines.append(Text.assemble(("plan     ", "bold"), ("none on the last decode step", fmt.MUTED)))
        if snap["decline_reason"]:
            label = "planner  " if plan else "declined "
            lines.append(Text.assemble((label, "bold"), (snap["decline_reason"], "" if plan else fmt.WARN)))
        shared, members = f.means()
        n = launches(f.metrics, "cascade")
        lines.append(Text.assemble(
            ("means    ", "bold"),
            "no cascade launch yet" if shared is None else
            f"{shared:,.1f} shared tokens · {members:.2f} members per launch ({fmt.count(n)} launches)"))
        groups = sharing_groups(snap["sequences"])
        lines.append(Text.assemble(
            ("sharing  ", "bold"),
            " · ".join(f"{g.name}: {len(g.members)} seqs × {g.shared_pages} pages" for g in groups)
            or "no two live sequences share a first page"))
        return Text("\n").join(lines)
