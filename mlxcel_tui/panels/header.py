"""Header: what is running where, how full it is, and what the sequences are
doing (prefilling ones with their progress). One line per topic, cut to the
width (never wrapped), so its height is the same at every terminal size; a
narrow terminal gets the short form of each line. A tensor-parallel engine
adds a line of its ranks (the panel's -tensor-parallel class makes room)."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame, page_gain
from . import format as fmt

WIDE = 140  # columns from which the long form of each line fits
NARROW = 100  # below it the process line is left out (the header is 3 lines)


def device_kind(device: str) -> str:
    return "CPU" if "cpu" in device.lower() else "GPU"


def usage_bar(used: int, total: int, width: int = 12) -> Text:
    filled = round(width * used / total) if total else 0
    colour = fmt.BAD if total and used / total > 0.9 else fmt.WARN if total and used / total > 0.7 else fmt.OK
    return Text.assemble(("█" * filled, colour), ("░" * (width - filled), fmt.MUTED))


def prefill_progress(sequences: list[dict]) -> list[tuple[int, int]]:
    """(prompt tokens computed, prompt tokens) of each prefilling sequence."""
    return [(min(s["num_cached_tokens"], s["num_prompt_tokens"]), s["num_prompt_tokens"])
            for s in sequences if s["status"] == "prefilling"]


def sequences_line(snap: dict) -> Text:
    prefilling = prefill_progress(snap["sequences"])
    decoding = sum(1 for s in snap["sequences"] if s["status"] == "running")
    waiting = max(snap["waiting"], len(snap.get("queued", ())))
    parts = [("sequences ", "bold"), f"{decoding} decoding · "]
    if prefilling:
        done, total = map(sum, zip(*prefilling))
        parts += [(f"{len(prefilling)} prefilling {fmt.count(done)}/{fmt.count(total)} tokens "
                   f"({fmt.percent(done, total)})", "bold " + fmt.WARN), " · "]
    else:
        parts.append("0 prefilling · ")
    parts.append(f"{waiting} waiting · {snap['preemptions']} preempted")
    return Text.assemble(*parts)


def kv_format(pool: dict, wide: bool) -> str | None:
    """The pages' format, bytes and the pages it gains over the model's own
    dtype ("int8 · 33.0 KiB/page · 1.9x pages"; wide, with the page's tokens
    and the dtype compared with); None for a snapshot that does not say (a
    server from before quantized pages)."""
    gain = page_gain(pool)
    if not pool.get("kv_dtype") or gain is None:
        return None
    page = f"{fmt.size(pool['bytes_per_block'])}/page"
    if not wide:
        versus = "model dtype" if pool["kv_dtype"] == pool["model_dtype"] else f"{gain:.1f}x pages"
        return f"{pool['kv_dtype']} · {page} · {versus}"
    versus = "the model's dtype" if pool["kv_dtype"] == pool["model_dtype"] else \
        f"{gain:.2f}x pages vs {pool['model_dtype']}"
    return f"{pool['kv_dtype']} · {page} ({pool['block_size']} tokens) · {versus}"


def tensor_parallel_line(view: dict, wide: bool) -> Text:
    """The ranks, their backend, each rank's pool and MLX memory. Every rank's
    pool has the same blocks and Hkv/N heads (Ranks.share_pool): they show once."""
    first = view["ranks"][0]
    parts = [("tensor parallel " if wide else "TP ", "bold"), f"{view['size']} ranks · {view['backend']} · "]
    parts.append(f"each {first['kv_heads']} KV heads, pool {fmt.size(first['pool_bytes'])}" if wide else
                 f"pool {fmt.size(first['pool_bytes'])} each")
    for r in view["ranks"]:  # 0 bytes: no message between the ranks has told it yet
        parts.append(f" · r{r['rank']} MLX {fmt.size(r['active_memory_bytes'] or None)}" +
                     (f" (peak {fmt.size(r['peak_memory_bytes'] or None)})" if wide else ""))
    return Text.assemble(*parts)


class HeaderPanel(Widget):
    frame: reactive[Frame | None] = reactive(None)
    preparing: reactive[str | None] = reactive(None)

    def watch_frame(self, frame: Frame | None) -> None:
        self.set_class(frame is not None and frame.snapshot.get("tensor_parallel") is not None, "-tensor-parallel")

    def render(self) -> Text:
        f = self.frame
        wide = self.size.width >= WIDE
        if f is None:
            return Text.assemble(("mlxcel-tui ", "bold"), (f"◌ {self.preparing or 'waiting for the first snapshot'} …",
                                                           "bold " + fmt.WARN))
        snap, host = f.snapshot, f.host
        where = f"{f.source} · {f.url}" if f.url and f.url not in f.source else f.source
        state = Text(" ⏸ PAUSED ", style="bold reverse " + fmt.WARN) if snap["paused"] else \
            Text(" ▶ running ", style="bold reverse " + fmt.OK)
        line1 = Text.assemble(("mlxcel-tui ", "bold"), (snap["model"], "bold"),
                              f" on {device_kind(snap['device'])}" + (f" ({snap['device']})" if wide else ""),
                              " ", state, f" step {fmt.count(snap['step'])} · {where}")
        pool = snap["pool"]
        used = pool["live"] + pool["reusable"]
        kv = kv_format(pool, wide)
        pool_line = Text.assemble(
            ("KV pool ", "bold"), usage_bar(used, pool["num_blocks"], 12 if wide else 8),
            f" {pool['live']}/{pool['num_blocks']} live ({fmt.percent(pool['live'], pool['num_blocks'])})",
            *((" · ", (kv, "bold")) if kv else ()),
            f" · {pool['shared']} shared · {pool['reusable']} reusable")
        cache = snap["prefix_cache"]
        pool_line.append(f" · prefix cache {cache['hits']}/{cache['queries']} hits")
        if wide:
            pool_line.append(f" · {pool['free']} free" +
                             ("" if kv else f" · {pool['block_size']} tokens/block"
                                            f" · {fmt.size(pool['bytes_per_block'])}/block") +
                             f" · {fmt.count(cache['prefix_tokens_reused'])} tokens reused · "
                             f"{cache['evictions']} evictions")
        cpu = "n/a" if host.cpu_percent is None else f"{host.cpu_percent:.0f}%"
        host_line = Text.assemble(
            ("process ", "bold"), f"RSS {fmt.size(host.rss_bytes)} · CPU {cpu} · ",
            ("MLX ", "bold"), f"active {fmt.size(host.mlx_active_bytes)} · peak {fmt.size(host.mlx_peak_bytes)} · ",
            ("BLAS ", "bold"), host.blas or "n/a")
        lines = [line1, sequences_line(snap), pool_line]
        if snap.get("tensor_parallel") is not None:  # recordings from before it have no such key
            lines.append(tensor_parallel_line(snap["tensor_parallel"], wide))
        if self.size.width >= NARROW:
            lines.append(host_line)
        joined = Text("\n").join(lines)
        joined.no_wrap, joined.overflow = True, "ellipsis"
        return joined
