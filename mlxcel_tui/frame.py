"""What one dashboard refresh shows: the engine snapshot and metric samples of
one poll, plus what the dashboard derives across polls (launch rates, the
never-activating watch) and the host figures beside them. Pure data, no
widgets: the panels only render a Frame."""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

LAUNCH_PATHS = ("fused_v2", "gather", "cascade")
CASCADE_SHARED_TOKENS = "mlxcel_cascade_shared_tokens_total"
CASCADE_MEMBERS = "mlxcel_cascade_member_sequences_total"
CASCADE_FAILURES = "mlxcel_cascade_failures_total"
KV_BYTES_SAVED = "mlxcel_cascade_kv_bytes_saved_total"
# Keys an engine may publish in the snapshot's `extra` dict for remote viewers.
EXTRA_RSS = "process_rss_bytes"
EXTRA_CPU = "process_cpu_percent"
EXTRA_MLX_ACTIVE = "mlx_active_memory_bytes"
EXTRA_MLX_PEAK = "mlx_peak_memory_bytes"
EXTRA_BLAS = "blas"

# fused_v2 launches with cascade enabled and not one cascade launch before the
# dashboard says cascade is not activating.
STALL_LAUNCHES = 32
HISTORY_SECONDS = 15 * 60  # how far back the history plots reach


def page_gain(pool: dict) -> float | None:
    """Pages a byte budget holds in a snapshot pool's format per page at the
    model's own dtype; None where the snapshot does not say (older servers)."""
    model_bytes = pool.get("model_dtype_bytes_per_block")
    return model_bytes / pool["bytes_per_block"] if model_bytes else None


def launch_key(path: str) -> str:
    return f'mlxcel_paged_decode_launches_total{{path="{path}"}}'


def launches(metrics: dict[str, float], path: str) -> float:
    return metrics.get(launch_key(path), 0.0)


@dataclass(frozen=True)
class HostInfo:
    """The engine process as the dashboard can see it; None where unknown."""

    rss_bytes: int | None = None
    cpu_percent: float | None = None
    mlx_active_bytes: int | None = None
    mlx_peak_bytes: int | None = None
    blas: str | None = None


class HostProbe:
    """Reads HostInfo for one poll. In process: psutil and MLX on this process;
    attached: only what the engine put in the snapshot's `extra` dict (the
    dashboard's own process says nothing about a remote engine)."""

    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process
        self._process = None
        if in_process:
            import psutil

            self._process = psutil.Process(os.getpid())
            self._process.cpu_percent(None)  # primes the counter; the first reading is 0

    def __call__(self, snapshot: dict) -> HostInfo:
        if not self.in_process:
            extra = snapshot.get("extra") or {}
            return HostInfo(extra.get(EXTRA_RSS), extra.get(EXTRA_CPU), extra.get(EXTRA_MLX_ACTIVE),
                            extra.get(EXTRA_MLX_PEAK), extra.get(EXTRA_BLAS))
        import mlx.core as mx

        from mlxcel.engine import blas

        return HostInfo(self._process.memory_info().rss, self._process.cpu_percent(None),
                        mx.get_active_memory(), mx.get_peak_memory(), blas.describe())


class RateMeter:
    """Per-second deltas of the launch counters between consecutive polls."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, float]] | None = None

    def update(self, now: float, metrics: dict[str, float]) -> dict[str, float | None]:
        keys = [launch_key(p) for p in LAUNCH_PATHS] + [CASCADE_FAILURES, KV_BYTES_SAVED]
        current = {k: metrics.get(k, 0.0) for k in keys}
        previous, self._last = self._last, (now, current)
        if previous is None or now <= previous[0]:
            return {k: None for k in keys}
        elapsed = now - previous[0]
        # A counter going down means a different engine (restart): no rate this time.
        return {k: (v - previous[1][k]) / elapsed if v >= previous[1][k] else None
                for k, v in current.items()}


class StallWatch:
    """Counts fused_v2 launches made while cascade was enabled since the last
    cascade launch (or since it was switched on). Large means enabled but never
    activating."""

    def __init__(self) -> None:
        self._base: tuple[float, float] | None = None  # (fused_v2, cascade) when the watch began

    def observe(self, enabled: bool, metrics: dict[str, float]) -> int:
        fused, cascade = launches(metrics, "fused_v2"), launches(metrics, "cascade")
        if not enabled:
            self._base = None
            return 0
        if self._base is None or cascade != self._base[1] or fused < self._base[0]:
            self._base = (fused, cascade)
        return int(fused - self._base[0])


@dataclass(frozen=True)
class Frame:
    snapshot: dict
    metrics: dict[str, float]
    rates: dict[str, float | None]
    host: HostInfo
    stalled_launches: int  # fused_v2 launches since cascade last activated while enabled
    source: str
    url: str | None
    can_control: bool
    poll: int  # how many polls succeeded, for the status line
    history: "History | None" = None

    @property
    def stalled(self) -> bool:
        return self.stalled_launches >= STALL_LAUNCHES

    def rate(self, path: str) -> float | None:
        return self.rates.get(launch_key(path))

    def means(self) -> tuple[float | None, float | None]:
        """(shared tokens, member sequences) per cascade launch, from the counters."""
        n = launches(self.metrics, "cascade")
        if not n:
            return None, None
        return self.metrics.get(CASCADE_SHARED_TOKENS, 0.0) / n, self.metrics.get(CASCADE_MEMBERS, 0.0) / n


def pending_switch(snapshot: dict) -> str | None:
    """Between a cascade switch and the next decode step the last step's plan
    and reason still describe the old setting: say so instead of showing them."""
    enabled, reason = snapshot["cascade"]["enabled"], snapshot["decline_reason"]
    if enabled and reason == "cascade off":
        return "switched on: the next decode step plans"
    if not enabled and (snapshot["plan"] is not None or (reason and reason != "cascade off")):
        return "switched off: the next decode step runs flat"
    return None


@dataclass(frozen=True)
class SharingGroup:
    name: str  # g1, g2, ... in order of first appearance
    members: tuple[int, ...]  # sequence ids
    shared_pages: int  # leading pages every member has in common


def sharing_groups(sequences: list[dict]) -> list[SharingGroup]:
    """Live sequences grouped by their first page's block id (two or more
    holding it), with the length of the page run all members share."""
    by_first: dict[int, list[dict]] = {}
    for seq in sequences:
        if seq["pages"]:
            by_first.setdefault(seq["pages"][0], []).append(seq)
    groups = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        tables = [m["pages"] for m in members]
        common = 0
        while all(len(t) > common and t[common] == tables[0][common] for t in tables):
            common += 1
        groups.append(SharingGroup(f"g{len(groups) + 1}", tuple(m["id"] for m in members), common))
    return groups


@dataclass(frozen=True)
class Bucket:
    """The decode steps that ended in one stretch of wall time."""

    start: float        # seconds since the epoch
    steps: int
    tokens: int
    seconds: float      # summed step wall time
    host_seconds: float
    device_seconds: float
    cascade_steps: int
    kv_bytes_flat: int
    kv_bytes_saved: int


class History:
    """Every decode step the polls have seen, up to HISTORY_SECONDS back from
    the newest (a snapshot holds only the last few hundred steps, so the
    dashboard keeps them across polls), bucketed for the history plots."""

    def __init__(self, seconds: float = HISTORY_SECONDS) -> None:
        self.seconds = seconds
        self.steps: deque[dict] = deque()

    def update(self, snapshot: dict) -> "History":
        decode = [r for r in snapshot["recent_steps"] if r["kind"] == "decode"]
        if self.steps and decode and decode[-1]["step"] < self.steps[-1]["step"]:
            self.steps.clear()  # the step counter went back: another engine
        last = self.steps[-1]["step"] if self.steps else -1
        self.steps.extend(r for r in decode if r["step"] > last)
        while self.steps and self.steps[0]["timestamp"] < snapshot["timestamp"] - self.seconds:
            self.steps.popleft()
        return self

    def buckets(self, now: float, width: float, count: int) -> list[Bucket | None]:
        """count buckets of width seconds ending at now, oldest first; None where no step ended."""
        sums: dict[int, list] = {}
        for r in self.steps:
            i = int((r["timestamp"] - (now - width * count)) // width)
            if 0 <= i < count:
                b = sums.setdefault(i, [0] * 8)
                b[0] += 1
                b[1] += r["tokens"]
                b[2] += r["seconds"]
                b[3] += r.get("host_seconds", 0.0)
                b[4] += r.get("device_seconds", 0.0)
                b[5] += r["path"] == "cascade"
                b[6] += r.get("kv_bytes_flat", 0)
                b[7] += r.get("kv_bytes_saved", 0)
        start = now - width * count
        return [Bucket(start + i * width, *sums[i]) if i in sums else None for i in range(count)]

    def saved_per_second(self, now: float, window: float = 10.0) -> float | None:
        """KV bytes cascade did not read per second of wall time over the last window seconds."""
        recent = [r for r in self.steps if r["timestamp"] > now - window]
        if not recent:
            return None
        span = min(window, now - self.steps[0]["timestamp"]) if self.steps else window
        return sum(r.get("kv_bytes_saved", 0) for r in recent) / span if span > 0 else None
