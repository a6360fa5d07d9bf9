"""Header: what is running where, and how full it is."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame
from . import format as fmt


def device_kind(device: str) -> str:
    return "CPU" if "cpu" in device.lower() else "GPU"


def usage_bar(used: int, total: int, width: int = 12) -> Text:
    filled = round(width * used / total) if total else 0
    colour = fmt.BAD if total and used / total > 0.9 else fmt.WARN if total and used / total > 0.7 else fmt.OK
    return Text.assemble(("█" * filled, colour), ("░" * (width - filled), fmt.MUTED))


class HeaderPanel(Widget):
    frame: reactive[Frame | None] = reactive(None, layout=True)  # auto height follows the content
    preparing: reactive[str | None] = reactive(None)

    def render(self) -> Text:
        f = self.frame
        if f is None:
            return Text(f"mlxcel-tui · {self.preparing or 'waiting for the first snapshot'} …", style="bold")
        snap, host = f.snapshot, f.host
        where = f"{f.source} · {f.url}" if f.url and f.url not in f.source else f.source
        state = Text(" ⏸ PAUSED ", style="bold reverse " + fmt.WARN) if snap["paused"] else \
            Text(" ▶ running ", style="bold reverse " + fmt.OK)
        line1 = Text.assemble(
            ("mlxcel-tui ", "bold"), (snap["model"], "bold"),
            f" on {device_kind(snap['device'])} ({snap['device']}) · {where}  ", state,
            f"  step {fmt.count(snap['step'])}")
        cpu = "n/a" if host.cpu_percent is None else f"{host.cpu_percent:.0f}%"
        line2 = Text.assemble(
            ("engine process ", "bold"), f"RSS {fmt.size(host.rss_bytes)} · CPU {cpu}   ",
            ("MLX ", "bold"), f"active {fmt.size(host.mlx_active_bytes)} · peak {fmt.size(host.mlx_peak_bytes)}   ",
            ("BLAS ", "bold"), host.blas or "n/a")
        pool = snap["pool"]
        used = pool["live"] + pool["reusable"]
        line3 = Text.assemble(
            ("KV pool ", "bold"), usage_bar(used, pool["num_blocks"]),
            f" {pool['live']}/{pool['num_blocks']} blocks live ({fmt.percent(pool['live'], pool['num_blocks'])})"
            f" · {pool['shared']} shared · {pool['reusable']} reusable · {pool['free']} free"
            f" · {pool['block_size']} tokens/block · {fmt.size(pool['bytes_per_block'])}/block")
        cache = snap["prefix_cache"]
        line4 = Text.assemble(
            ("prefix cache ", "bold"),
            f"{cache['hits']}/{cache['queries']} hits ({fmt.percent(cache['hits'], cache['queries'])})"
            f" · {fmt.count(cache['prefix_tokens_reused'])} tokens reused · {cache['cached_blocks']} cached blocks"
            f" · {cache['evictions']} evictions   ",
            ("sequences ", "bold"),
            f"{snap['running']} running · {snap['waiting']} waiting · {snap['preemptions']} preempted")
        return Text("\n").join([line1, line2, line3, line4])
