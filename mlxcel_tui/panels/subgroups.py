"""Subgroups: the last cascade plan as a tree (group -> spans -> members,
pages, tokens, predicted saving), why a step declined, the running means."""

from __future__ import annotations

import statistics

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame, launches, pending_switch, sharing_groups
from . import format as fmt
from .page_map import PLAN_COLOUR, span_colour


def saving_text(seconds: float | None) -> str:
    return "" if seconds is None else f" · saves {seconds * 1e6:,.1f} µs/layer (predicted)"


def measured_steps(snap: dict) -> str:
    """Median decode step time of the recent cascade and flat steps: what the
    predicted saving is to be read against."""
    times = {"cascade": [], "fused_v2": []}
    for step in snap.get("recent_steps", ()):
        if step["kind"] == "decode" and step["path"] in times:
            times[step["path"]].append(step["seconds"])
    parts = [f"{name} {statistics.median(t) * 1e3:,.1f} ms ({len(t)})"
             for name, t in (("cascade", times["cascade"]), ("flat", times["fused_v2"])) if t]
    return "measured decode steps: " + (", ".join(parts) if parts else "none yet")


def plan_tree(plan: dict, snap: dict) -> list[Text]:
    """Each group's spans, nested by depth under the group's outermost one."""
    spans = plan["spans"]
    groups = sorted({s["group"] for s in spans})
    depth = 1 + max(s["depth"] for s in spans)
    head = f"{len(spans)} span{'s' if len(spans) > 1 else ''} in {len(groups)} group{'s' if len(groups) > 1 else ''}"
    lines = [Text.assemble(("plan     ", "bold"), (head, PLAN_COLOUR), f", {depth} deep")]
    step_saving = plan.get("predicted_saving_s")
    predicted = ("not calibrated (mlxcel calibrate)" if step_saving is None
                 else f"saves {step_saving * 1e3:,.2f} ms a step")
    lines.append(Text.assemble(("model    ", "bold"), f"predicted: {predicted} · {measured_steps(snap)}"))
    for group in groups:
        members = sorted({m for s in spans if s["group"] == group for m in s["members"]})
        lines.append(Text(f"  group {group + 1}: {len(members)} seqs {member_names(snap, members)}"))
        for s in sorted((s for s in spans if s["group"] == group), key=lambda s: (s["start"], s["members"])):
            ids = member_names(snap, s["members"])
            lines.append(Text.assemble("    " + "  " * s["depth"] + "└ ", ("█", span_colour(s["depth"])),
                                       f" pages {s['start']}–{s['end']} · {fmt.count(s['tokens'])} tokens · "
                                       f"{len(s['members'])} members {ids}", saving_text(s.get("predicted_saving_s"))))
    return lines


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
        elif plan and plan.get("spans"):
            lines += plan_tree(plan, snap)
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
