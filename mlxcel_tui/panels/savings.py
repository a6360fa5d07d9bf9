"""What cascade saves, in bytes: the KV bytes the last decode step did not
read against what the flat step reads, the same per second over the last
seconds, and the total the engine counted."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import KV_BYTES_SAVED, Frame
from . import format as fmt

WINDOW = 10.0  # seconds the per-second figure averages over


class SavingsPanel(Widget):
    frame: reactive[Frame | None] = reactive(None, layout=True)  # auto height follows the content

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "KV reads saved"

    def render(self) -> Text:
        f = self.frame
        if f is None:
            return Text("…")
        snap = f.snapshot
        decode = [r for r in snap["recent_steps"] if r["kind"] == "decode"]
        if not decode:
            return Text("no decode step yet", style=fmt.MUTED)
        last = decode[-1]
        flat, saved = last.get("kv_bytes_flat", 0), last.get("kv_bytes_saved", 0)
        step = Text.assemble(("last step  ", "bold"), f"{fmt.size(saved)} of {fmt.size(flat)} not read ",
                             (f"({fmt.percent(saved, flat)})", "bold " + fmt.CASCADE_ON if saved else fmt.MUTED))
        per_second = f.history.saved_per_second(snap["timestamp"], WINDOW) if f.history else None
        window = [r for r in decode if r["timestamp"] > snap["timestamp"] - WINDOW]
        share = (sum(r.get("kv_bytes_saved", 0) for r in window), sum(r.get("kv_bytes_flat", 0) for r in window))
        second = Text.assemble(("per second ", "bold"),
                               "—" if per_second is None else f"{fmt.size(per_second)}/s",
                               f" ({fmt.percent(*share)} of flat, last {WINDOW:g} s)")
        plan = snap["plan"]
        once = Text.assemble(("read once  ", "bold"),
                             f"{fmt.count(plan['shared_tokens'])} tokens for {len(plan['members'])} members a step"
                             if plan else "no shared span on the last step")
        total = f.metrics.get(KV_BYTES_SAVED, 0.0)
        rate = f.rates.get(KV_BYTES_SAVED)
        counted = Text.assemble(("in all     ", "bold"), fmt.size(total),
                                "" if rate is None else f" ({fmt.size(rate)}/s since the last poll)")
        return Text("\n").join([step, second, once, counted])
