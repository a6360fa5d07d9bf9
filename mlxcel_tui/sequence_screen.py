"""One sequence in detail (Enter on a map row): its prompt's head and latest
generated text, its page list with each page's refcount, the sharing group
and cascade span it belongs to, its tokens/s and time to first token. It
follows the dashboard's polls until closed; a sequence that ended says so."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .frame import Frame, sharing_groups
from .panels import format as fmt
from .panels.page_map import PLAN_COLOUR, refcount_colour


def page_list(seq: dict, plan_pages: int) -> Text:
    """Each page as block:refcount, coloured as on the map."""
    text = Text()
    for i, (block, refs) in enumerate(zip(seq["pages"], seq["refcounts"])):
        text.append(f"{block}:{refs}", PLAN_COLOUR if i < plan_pages else refcount_colour(refs))
        text.append(" ")
    return text


def detail(frame: Frame, seq_id: int) -> Group | Text:
    snap = frame.snapshot
    seq = next((s for s in [*snap["sequences"], *snap.get("queued", ())] if s["id"] == seq_id), None)
    if seq is None:
        return Text(f"sequence #{seq_id} has ended (its request finished or was cancelled)", style=fmt.MUTED)
    plan = snap["plan"] or {"members": (), "shared_pages": 0, "shared_tokens": 0}
    member = seq_id in plan["members"]
    group = next((g for g in sharing_groups(snap["sequences"]) if seq_id in g.members), None)
    table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1)
    completion = seq["num_tokens"] - seq["num_prompt_tokens"]
    table.add_row("sequence", f"#{seq['id']} {seq['label']} · {seq['status']}")
    table.add_row("tokens", f"{seq['num_prompt_tokens']} prompt + {completion} generated · "
                            f"{seq['num_cached_tokens']} with K/V in the pool")
    if seq["status"] == "prefilling":
        done = min(seq["num_cached_tokens"], seq["num_prompt_tokens"])
        table.add_row("prefill", f"{done}/{seq['num_prompt_tokens']} prompt tokens "
                                 f"({fmt.percent(done, seq['num_prompt_tokens'])})")
    ttft, rate = seq.get("ttft_seconds"), seq.get("tokens_per_second")
    table.add_row("speed", f"TTFT {fmt.ms(ttft)} · " + ("—" if rate is None else f"{rate:,.1f} tokens/s"))
    table.add_row("sharing", f"{group.name}: {len(group.members)} sequences share its first "
                             f"{group.shared_pages} pages" if group else "shares no first page")
    table.add_row("cascade", Text(f"member of the last plan: its first {plan['shared_pages']} pages "
                                  f"({fmt.count(plan['shared_tokens'])} tokens) read once for "
                                  f"{len(plan['members'])} members", style=PLAN_COLOUR)
                  if member else Text("not in the last plan", style=fmt.MUTED))
    table.add_row("prompt", Text(seq.get("prompt_head") or "—", overflow="fold") + Text(" …", style=fmt.MUTED))
    table.add_row("latest", Text("… ", style=fmt.MUTED) + Text(seq.get("latest_text") or "—", overflow="fold"))
    table.add_row(f"pages ({len(seq['pages'])})", page_list(seq, plan["shared_pages"] if member else 0)
                  if seq["pages"] else Text("none yet", style=fmt.MUTED))
    return Group(table, Text("block:refcount, coloured as on the map", style=fmt.MUTED))


class SequenceScreen(ModalScreen):
    BINDINGS = [Binding("escape,enter,q", "close", "Close", tooltip="Back to the dashboard")]

    def __init__(self, dashboard, seq_id: int) -> None:
        super().__init__()
        self.dashboard = dashboard
        self.seq_id = seq_id

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="sequence"):
            yield Static(f"mlxcel-tui · sequence #{self.seq_id}", id="sequence-title")
            yield Static(id="sequence-detail")
            yield Static("Follows every poll · Esc, Enter or q closes", id="sequence-note")

    def on_mount(self) -> None:
        self.watch(self.dashboard, "frame", self.show)

    def show(self, frame: Frame | None) -> None:
        if frame is not None:
            self.query_one("#sequence-detail", Static).update(detail(frame, self.seq_id))

    def action_close(self) -> None:
        self.dismiss()
