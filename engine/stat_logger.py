"""The engine's one-line summary at info every few seconds, as vLLM logs it:
throughput since the last line, running and waiting requests, KV pool use,
the prefix cache's hit rate and cascade's share of decode launches. Nothing
is logged while the engine stays idle. Once, at start, the KV pool it sized:
blocks, page format and bytes, and the pages gained over the model's dtype."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("mlxcel.stats")

LOG_INTERVAL = 10.0  # seconds between lines


class StatLogger:
    def __init__(self, engine, interval: float = LOG_INTERVAL) -> None:
        self.engine = engine
        self.interval = interval
        self._last = time.monotonic()
        self._seen = self._counts()
        pool, model = engine.pool, engine.model_dtype_geometry
        page = pool.geometry.bytes_per_block
        log.info("KV cache: %d blocks of %d tokens, %s pages of %.1f KiB (%.2fx the pages of %s), %.1f MiB",
                 pool.num_blocks, pool.block_size, pool.geometry.kv_dtype, page / 2**10,
                 model.bytes_per_block / page, model.kv_dtype, pool.num_blocks * page / 2**20)

    def _counts(self) -> tuple[float, ...]:
        value = self.engine.metrics.registry.get_sample_value
        return tuple(value(name, labels or {}) or 0.0 for name, labels in (
            ("mlxcel_prompt_tokens_total", None), ("mlxcel_completion_tokens_total", None),
            ("mlxcel_prompt_cache_queries_total", None), ("mlxcel_prompt_cache_hits_total", None),
            ("mlxcel_paged_decode_launches_total", {"path": "fused_v2"}),
            ("mlxcel_paged_decode_launches_total", {"path": "cascade"})))

    def tick(self) -> None:
        """Called by the engine loop between steps; logs when the interval has passed."""
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        counts = self._counts()
        prompt, generated, queries, hits, flat, cascade = (new - old for new, old in zip(counts, self._seen))
        sched, pool = self.engine.scheduler, self.engine.pool
        running, waiting = len(sched.holders), len(sched.waiting)
        seconds, self._last, self._seen = now - self._last, now, counts
        if not (prompt or generated or running or waiting):
            return
        log.info("prompt throughput: %.1f tokens/s, generation throughput: %.1f tokens/s, running: %d reqs, "
                 "waiting: %d reqs, KV cache usage: %.1f%%, prefix cache hit rate: %s, cascade: %s of decode "
                 "launches", prompt / seconds, generated / seconds, running, waiting,
                 100 * pool.num_live / pool.num_blocks, _share(hits, queries), _share(cascade, flat))


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
