"""Per-engine Prometheus metrics, vLLM's set as the model: request latencies
(end to end, queue, prefill, decode, time to first token, between tokens),
tokens per request, HTTP requests by route and status, the configuration as
an `_info` gauge, this process's `process_*` figures, and the engine's own
(launch paths, cascade savings, pool and prefix cache).

One CollectorRegistry per engine, so two engines in a process (tests, say)
never share counters. The engine records each step's launches once, from the
outcome the runner hands back, and each request's figures when it finishes.
"""

from __future__ import annotations

import math
import threading

import mlx.core as mx
import numpy as np
import prometheus_client
from prometheus_client import (GC_COLLECTOR, PLATFORM_COLLECTOR, CollectorRegistry, Counter, Histogram, Info,
                               ProcessCollector)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .decode_plan import CASCADE, CASCADE_FALLBACK, GATHER, DecodeOutcome
from .pool import dtype_name

# No `_created` series beside each counter and histogram: scrapers ignore them and they double the output.
prometheus_client.disable_created_metrics()

LAUNCH_PATHS = ("fused_v2", "gather", "cascade")
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                   1800.0)
INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
TOKEN_BUCKETS = tuple(float(2**i) for i in range(17))  # 1 .. 65536 tokens


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.paged_decode_launches = Counter(
            "mlxcel_paged_decode_launches_total",
            "Paged attention launches by path (cascade is the subset of fused_v2 that ran two levels)",
            ["path"], registry=self.registry)
        # Every path exported from the start.
        self._launches = {path: self.paged_decode_launches.labels(path=path) for path in LAUNCH_PATHS}
        self.cascade_shared_tokens = Counter(
            "mlxcel_cascade_shared_tokens_total",
            "KV tokens of shared spans attended once by cascade launches", registry=self.registry)
        self.cascade_member_sequences = Counter(
            "mlxcel_cascade_member_sequences_total",
            "Sequences in the cascade subgroup, summed over cascade launches", registry=self.registry)
        self.cascade_failures = Counter(
            "mlxcel_cascade_failures_total",
            "Planned cascade launches that failed and fell back to the flat launch", registry=self.registry)
        self.cascade_spans = Counter(
            "mlxcel_cascade_spans_total", "Shared spans attended once, summed over cascade launches",
            registry=self.registry)
        self.cascade_kv_bytes_saved = Counter(
            "mlxcel_cascade_kv_bytes_saved_total",
            "KV bytes cascade launches did not read compared with the flat launch", registry=self.registry)
        self.requests = Counter("mlxcel_requests", "Finished requests by finish reason", ["finish_reason"],
                                registry=self.registry)
        self.prompt_tokens = Counter("mlxcel_prompt_tokens",
                                     "Prompt tokens of requests, counted when each one's prefill ends "
                                     "(tokens adopted from the prefix cache included)", registry=self.registry)
        self.completion_tokens = Counter("mlxcel_completion_tokens", "Tokens generated, counted as each is read",
                                         registry=self.registry)
        self.preemptions = Counter("mlxcel_preemptions", "Sequences preempted back to the queue (pool exhausted)",
                                   registry=self.registry)
        self.mlx_cache_clears = Counter("mlxcel_mlx_cache_clears",
                                        "Times the engine emptied MLX's buffer cache between steps (it and the live "
                                        "arrays near MLX's memory limit)", registry=self.registry)
        self.decode_step = Histogram("mlxcel_decode_step_seconds",
                                     "Wall time of one decode step (all layers), from its launch or the previous "
                                     "step's end to its tokens on the host", registry=self.registry,
                                     buckets=STEP_BUCKETS)
        self.decode_step_host = Histogram("mlxcel_decode_step_host_seconds",
                                          "Engine host time of one decode step: scheduling, planning, building "
                                          "the graph (the device runs the previous step meanwhile)",
                                          registry=self.registry,
                                          buckets=STEP_BUCKETS)
        self.request_ttft = Histogram("mlxcel_request_ttft_seconds", "Time from submission to first token",
                                      registry=self.registry, buckets=TTFT_BUCKETS)
        self.inter_token_latency = BatchHistogram(
            "mlxcel_inter_token_latency_seconds", "Time between a request's consecutive tokens reaching the host",
            self.registry, INTER_TOKEN_BUCKETS)
        self.e2e_latency = Histogram("mlxcel_e2e_request_latency_seconds",
                                     "Time from submission to finish of finished requests",
                                     registry=self.registry, buckets=REQUEST_BUCKETS)
        self.queue_time = Histogram("mlxcel_request_queue_time_seconds",
                                    "Time a request waited from submission to its first scheduled step",
                                    registry=self.registry, buckets=REQUEST_BUCKETS)
        self.prefill_time = Histogram("mlxcel_request_prefill_time_seconds",
                                      "Time from a request's first scheduled step to its first token",
                                      registry=self.registry, buckets=REQUEST_BUCKETS)
        self.decode_time = Histogram("mlxcel_request_decode_time_seconds",
                                     "Time from a request's first token to its last", registry=self.registry,
                                     buckets=REQUEST_BUCKETS)
        self.request_prompt_tokens = Histogram("mlxcel_request_prompt_tokens",
                                               "Prompt tokens per finished request", registry=self.registry,
                                               buckets=TOKEN_BUCKETS)
        self.request_generation_tokens = Histogram("mlxcel_request_generation_tokens",
                                                   "Generated tokens per finished request",
                                                   registry=self.registry, buckets=TOKEN_BUCKETS)
        self.http_requests = Counter("mlxcel_http_requests", "HTTP requests answered, by method, route and status",
                                     ["method", "route", "status"], registry=self.registry)
        self.http_duration = Histogram("mlxcel_http_request_duration_seconds",
                                       "Time from an HTTP request's arrival to the end of its response body",
                                       ["method", "route"], registry=self.registry, buckets=REQUEST_BUCKETS)
        self.info = Info("mlxcel_engine", "The served model and the KV cache configuration",
                         registry=self.registry)
        ProcessCollector(registry=self.registry)   # process_*: CPU seconds, resident memory, open fds
        self.registry.register(GC_COLLECTOR)
        self.registry.register(PLATFORM_COLLECTOR)

    def first_token(self, seq) -> None:
        """A request's first token was read (its prefill ended)."""
        self.request_ttft.observe(seq.first_token_at - seq.submitted_at)
        self.prompt_tokens.inc(seq.num_prompt_tokens)

    def request_finished(self, seq, reason: str, now: float) -> None:
        """A request ended (any reason); each span is observed once it began."""
        self.requests.labels(finish_reason=reason).inc()
        self.e2e_latency.observe(now - seq.submitted_at)
        if seq.scheduled_at is not None:
            self.queue_time.observe(seq.scheduled_at - seq.submitted_at)
        if seq.first_token_at is not None:
            self.prefill_time.observe(seq.first_token_at - seq.scheduled_at)
            self.decode_time.observe(seq.last_token_at - seq.first_token_at)
        self.request_prompt_tokens.observe(seq.num_prompt_tokens)
        self.request_generation_tokens.observe(seq.num_completion_tokens)

    def http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method=method, route=route, status=str(status)).inc()
        self.http_duration.labels(method=method, route=route).observe(seconds)

    def bind_engine(self, engine) -> None:
        """Expose the engine's configuration, and its pool, prefix cache and
        queue, read at scrape time."""
        pool, config = engine.pool, engine.config
        self.info.info({"model": engine.loaded.name, "device": engine.device, "dtype": dtype_name(engine.loaded.dtype),
                        "kv_dtype": pool.geometry.kv_dtype, "block_size": str(pool.block_size),
                        "num_blocks": str(pool.num_blocks),
                        "kv_cache_bytes": str(pool.num_blocks * pool.geometry.bytes_per_block),
                        "max_running": str(config.max_running),
                        "max_batched_tokens": str(config.max_batched_tokens),
                        "prefix_caching": str(config.prefix_caching).lower()})
        self.registry.register(_EngineCollector(engine))

    def record_decode(self, outcome: DecodeOutcome, launches: int = 1) -> None:
        """Count ``launches`` launches of one outcome (a step's layers all launch alike)."""
        self._launches["gather" if outcome.kind == GATHER else "fused_v2"].inc(launches)
        if outcome.kind == CASCADE:
            self._launches["cascade"].inc(launches)
            self.cascade_shared_tokens.inc(outcome.shared_tokens * launches)
            self.cascade_member_sequences.inc(outcome.member_rows * launches)
            self.cascade_spans.inc(outcome.spans * launches)
            self.cascade_kv_bytes_saved.inc(outcome.kv_bytes_saved * launches)
        elif outcome.kind == CASCADE_FALLBACK:
            self.cascade_failures.inc(launches)


class BatchHistogram:
    """A histogram observed a batch of samples at a time (a decode step's,
    one per row), exposed as prometheus_client's Histogram is (its buckets,
    +Inf, _count, _sum summed sample by sample): that one takes a lock and
    searches the buckets once per sample."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry, buckets: tuple[float, ...]):
        self.name, self.documentation = name, documentation
        self._bounds = np.array([*buckets, math.inf])
        self._labels = [floatToGoString(b) for b in self._bounds]
        self._counts = np.zeros(len(self._bounds), np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, values: list[float]) -> None:
        if not values:
            return
        # A sample falls in the first bucket whose bound it does not exceed.
        counts = np.bincount(np.searchsorted(self._bounds, values), minlength=len(self._bounds))
        with self._lock:
            self._counts += counts
            for value in values:
                self._sum += value

    def collect(self):
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        yield HistogramMetricFamily(self.name, self.documentation, buckets=list(zip(self._labels, cumulative)),
                                    sum_value=total)


class _EngineCollector:
    """Pool, prefix-cache and queue figures straight from the engine at scrape
    time (nothing on the decode path keeps them up to date)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        pool, sched = self.engine.pool, self.engine.scheduler
        stats = self.engine.cache.stats()
        for state, value in (("allocated", pool.num_blocks), ("live", pool.num_live),
                             ("free", len(pool.free)), ("shared", pool.num_shared),
                             ("reusable", len(pool.reusable))):
            yield GaugeMetricFamily(f"mlxcel_cache_pool_paged_blocks_{state}",
                                    f"KV pool blocks: {POOL_STATE_HELP[state]}", value=value)
        for name, value, doc in (("queries", stats.queries, "Prefix-cache lookups"),
                                 ("hits", stats.hits, "Lookups that adopted at least one cached block"),
                                 ("misses", stats.misses, "Lookups that adopted nothing"),
                                 ("prefix_tokens_reused", stats.prefix_tokens_reused,
                                  "Prompt tokens adopted from the prefix cache instead of computed"),
                                 ("evictions", stats.evictions, "Cached blocks reclaimed by the allocator")):
            yield CounterMetricFamily(f"mlxcel_prompt_cache_{name}", doc, value=value)
        yield GaugeMetricFamily("mlxcel_kv_cache_usage_ratio",
                                "Share of the KV pool's blocks held by page tables (0-1)",
                                value=pool.num_live / pool.num_blocks)
        page_bytes = pool.geometry.bytes_per_block
        yield GaugeMetricFamily("mlxcel_kv_cache_page_bytes",
                                "Bytes of one KV page (block): K and V of its tokens in every layer, "
                                "quantized pages' scales included", value=page_bytes)
        yield GaugeMetricFamily("mlxcel_kv_cache_pages_vs_model_dtype_ratio",
                                "Pages a KV byte budget holds in the pool's format per page it holds at the "
                                "model's own dtype (engine_info's dtype; 1 there)",
                                value=self.engine.model_dtype_geometry.bytes_per_block / page_bytes)
        yield GaugeMetricFamily("mlxcel_queue_depth", "Requests waiting for admission (the snapshot's waiting)",
                                value=len(sched.waiting))
        yield GaugeMetricFamily("mlxcel_running_sequences",
                                "Sequences prefilling, decoding or reading their last token (the snapshot's "
                                "running)", value=len(sched.holders))
        yield GaugeMetricFamily("mlxcel_cascade_enabled", "1 while cascade attention is enabled",
                                value=int(self.engine.cascade.enabled))
        yield GaugeMetricFamily("mlxcel_mlx_active_memory_bytes", "MLX memory this process holds now",
                                value=mx.get_active_memory())
        yield GaugeMetricFamily("mlxcel_mlx_cache_memory_bytes",
                                "Freed MLX buffers this process keeps for reuse (mx.get_cache_memory)",
                                value=mx.get_cache_memory())
        yield GaugeMetricFamily("mlxcel_mlx_peak_memory_bytes",
                                "Most MLX memory this process has held (mx.get_peak_memory)",
                                value=mx.get_peak_memory())
        if self.engine.ranks is not None:   # tensor parallel: every rank's, as of a recent message between them
            active = GaugeMetricFamily("mlxcel_rank_mlx_active_memory_bytes", "MLX memory each rank holds",
                                       labels=["rank"])
            peak = GaugeMetricFamily("mlxcel_rank_mlx_peak_memory_bytes", "Most MLX memory each rank has held",
                                     labels=["rank"])
            for rank, (now, most) in enumerate(self.engine.ranks.memory()):
                active.add_metric([str(rank)], now)
                peak.add_metric([str(rank)], most)
            yield active
            yield peak


POOL_STATE_HELP = {
    "allocated": "the pool's size",
    "live": "held by at least one page table",
    "free": "on the free list (allocation also takes reusable ones)",
    "shared": "held by more than one page table",
    "reusable": "unreferenced, kept for the prefix cache until needed",
}
