"""The immutable picture of the engine the dashboard, `mlxcel stats` and the
control API read after each step. Nothing here refers to live engine state."""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SequenceView:
    id: int
    label: str
    status: str  # "waiting", "prefilling" or "running"
    num_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    pages: tuple[int, ...]
    refcounts: tuple[int, ...]  # per page, at snapshot time
    first_page_offset: int
    last_page_len: int  # valid tokens in the last page
    prompt_head: str = ""   # the prompt's first tokens, decoded
    latest_text: str = ""   # the last generated tokens, decoded
    ttft_seconds: float | None = None        # submission to first token; None before it
    tokens_per_second: float | None = None   # generated tokens after the first, over the time since it


@dataclass(frozen=True)
class SpanView:
    """One span of a plan: pages [start, end) of every member, read once."""

    group: int                 # which first-page group (its outermost span's index)
    depth: int                 # 0 outermost
    members: tuple[int, ...]   # sequence ids
    start: int
    end: int
    tokens: int
    predicted_saving_s: float | None = None   # per layer, by the device's cost model


@dataclass(frozen=True)
class PlanView:
    members: tuple[int, ...]  # sequence ids of the span with the most saved reads
    shared_pages: int         # that span's pages
    shared_tokens: int
    shared_blocks: tuple[int, ...]
    spans: tuple[SpanView, ...] = ()          # every span, outermost first
    predicted_saving_s: float | None = None   # the whole plan's, per step (every layer)


@dataclass(frozen=True)
class PoolView:
    num_blocks: int
    block_size: int
    live: int
    free: int
    shared: int
    reusable: int  # unreferenced but kept for the prefix cache
    bytes_per_block: int   # K and V of one block, all layers, scales included
    # The page format and the model's own dtype with its page's bytes ("" and 0
    # in snapshots of servers from before quantized pages).
    kv_dtype: str = ""
    model_dtype: str = ""
    model_dtype_bytes_per_block: int = 0


@dataclass(frozen=True)
class StepRecord:
    step: int
    kind: str  # "decode" (a prefill chunk may ride along) or "prefill"
    seconds: float
    batch: int
    tokens: int
    path: str  # launch path of the step's attention
    cascade_enabled: bool
    timestamp: float
    host_seconds: float = 0.0    # the engine's: scheduling, planning, building the graph
    device_seconds: float = 0.0  # MLX's: encoding and running the kernels, waiting for them
    prefill_tokens: int = 0      # prompt tokens computed beside the decode rows
    kv_bytes_flat: int = 0       # KV bytes the decode rows' attention reads flat (all layers)
    kv_bytes_saved: int = 0      # of those, the bytes a cascade launch did not read (all layers)


@dataclass(frozen=True)
class RankView:
    rank: int
    kv_heads: int             # this rank's share of the KV heads: its pool holds only these
    pool_bytes: int           # its pool's K/V bytes (every rank's pool has the same blocks)
    active_memory_bytes: int  # MLX memory, as of a recent message between the ranks
    peak_memory_bytes: int


@dataclass(frozen=True)
class TensorParallelView:
    size: int
    backend: str              # mx.distributed's: "ring", "nccl", "mpi", "jaccl"
    ranks: tuple[RankView, ...]


@dataclass(frozen=True)
class EngineSnapshot:
    step: int
    timestamp: float
    model: str
    device: str
    sequences: tuple[SequenceView, ...]
    plan: PlanView | None
    decline_reason: str | None
    last_path: str
    recent_steps: tuple[StepRecord, ...]
    pool: PoolView
    prefix_cache: dict
    cascade: dict
    cascade_switches: tuple[tuple[int, float, bool], ...]  # (step, time, enabled)
    waiting: int
    running: int
    preemptions: int
    paused: bool = False
    tensor_parallel: TensorParallelView | None = None   # None on one device
    extra: dict = field(default_factory=dict)
    queued: tuple[SequenceView, ...] = ()  # submitted, holding no pages yet (status "waiting"), oldest first

    def decode_latencies(self, field: str = "seconds") -> list[float]:
        """A StepRecord field (seconds, host_seconds, device_seconds) of the recent decode steps."""
        return [getattr(r, field) for r in self.recent_steps if r.kind == "decode"]

    def latency_percentile(self, q: float, field: str = "seconds") -> float | None:
        """q in [0, 100] over the recent decode steps (nearest-rank)."""
        values = sorted(self.decode_latencies(field))
        if not values:
            return None
        return values[max(1, math.ceil(q / 100 * len(values))) - 1]

    def tokens_per_second(self) -> float:
        steps = [r for r in self.recent_steps if r.kind == "decode"]
        seconds = sum(r.seconds for r in steps)
        return sum(r.tokens for r in steps) / seconds if seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["latency_p50_seconds"] = self.latency_percentile(50)
        out["latency_p99_seconds"] = self.latency_percentile(99)
        out["host_p50_seconds"] = self.latency_percentile(50, "host_seconds")
        out["device_p50_seconds"] = self.latency_percentile(50, "device_seconds")
        out["tokens_per_second"] = self.tokens_per_second()
        return out
