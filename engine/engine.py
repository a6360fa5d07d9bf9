"""The serving engine: step() reads as schedule -> run -> postprocess, then
publishes an immutable snapshot. It runs on its own thread; other threads talk
to it only through submit/cancel (an inbox drained between steps), the shared
CascadeConfig, and the snapshots and metrics it publishes."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Callable

import mlx.core as mx
import psutil

from .config import CascadeConfig, EngineConfig
from .metrics import DecodeOutcome, EngineMetrics
from .model import LoadedModel, load_model
from .pool import BlockPool, PoolGeometry
from .prefix_cache import PrefixCache
from .runner import ModelRunner
from .scheduler import Scheduler, ScheduledStep
from .sequence import SamplingParams, Sequence, SequenceStatus
from .snapshot import EngineSnapshot, PlanView, PoolView, SequenceView, StepRecord

log = logging.getLogger("mlxcel.engine")

# Called on the engine thread: (sequence, new token or None, finish reason or None).
EventCallback = Callable[[Sequence, "int | None", "str | None"], None]

RECENT_STEPS = 512
PROCESS = psutil.Process()  # this process, for the snapshot's `extra` figures


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new requests."""


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 cascade: CascadeConfig | None = None, metrics: EngineMetrics | None = None) -> None:
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.cascade = cascade or CascadeConfig.from_env()
        self.metrics = metrics or EngineMetrics()
        geometry = PoolGeometry(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim,
                                self.config.block_size, self.config.pool_dtype(loaded))
        num_blocks = self.config.num_blocks or geometry.blocks_for_bytes(self.config.pool_bytes)
        self.pool = BlockPool(geometry, num_blocks)
        self.cache = PrefixCache(self.pool, enabled=self.config.prefix_caching)
        self.scheduler = Scheduler(self.cache, self.config.max_running, self.config.prefill_chunk)
        self.runner = ModelRunner(loaded, self.pool, self.cascade, self.metrics)
        self.metrics.bind_engine(self)
        self.device = str(mx.default_device())
        self._callbacks: dict[int, EventCallback] = {}
        self._submitted_at: dict[int, float] = {}
        self._inbox: deque[tuple[str, Sequence | None, str | None]] = deque()  # (op, sequence, reason)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self.paused = False
        self.step_count = 0
        self._recent: deque[StepRecord] = deque(maxlen=RECENT_STEPS)
        self._switches: list[tuple[int, float, bool]] = [(0, time.time(), self.cascade.enabled)]
        self._last_plan: PlanView | None = None
        self._last_decode: DecodeOutcome | None = None  # the last decode step's launch
        self.snapshot = self._build_snapshot()

    @classmethod
    def from_path(cls, path, config: EngineConfig | None = None, **kwargs) -> "Engine":
        return cls(load_model(path), config, **kwargs)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold lie in [0, vocab_size)."""
        return self.loaded.model.args.vocab_size

    @property
    def max_sequence_tokens(self) -> int:
        """The most tokens (prompt and completion) one sequence can ever hold: the whole pool."""
        return self.pool.num_blocks * self.pool.block_size

    @property
    def snapshot(self) -> EngineSnapshot:
        """The snapshot published after the last step, with the cascade settings
        and pause state as they are now (both change between steps, and an idle
        or paused engine publishes no step), and in `extra` this process's
        memory and CPU as read now, for viewers in other processes."""
        extra = {"process_rss_bytes": PROCESS.memory_info().rss,
                 "process_cpu_percent": PROCESS.cpu_percent(None),  # since the previous read
                 "mlx_active_memory_bytes": mx.get_active_memory(),
                 "mlx_peak_memory_bytes": mx.get_peak_memory()}
        return replace(self._snapshot, cascade=self.cascade.as_dict(), paused=self.paused, extra=extra)

    @snapshot.setter
    def snapshot(self, snapshot: EngineSnapshot) -> None:
        self._snapshot = snapshot

    # -- requests (any thread) ------------------------------------------

    def submit(self, token_ids: list[int], params: SamplingParams | None = None,
               on_event: EventCallback | None = None, label: str = "") -> Sequence:
        """Queue a request; raises RequestRejected (nothing queued) if it can never
        fit, EngineClosed once the engine is shutting down."""
        if not token_ids:
            raise ValueError("a request needs at least one prompt token")
        seq = Sequence(list(token_ids), params or SamplingParams(), label=label)
        self.scheduler.check(len(seq) + seq.params.max_tokens)
        with self._wake:  # checked and queued at once, so close() ends every request it let in
            if self._closed:
                raise EngineClosed("the engine is shutting down; it takes no new requests")
            if on_event:
                self._callbacks[seq.id] = on_event
            self._submitted_at[seq.id] = time.perf_counter()
            self._post("add", seq)
        return seq

    def cancel(self, seq: Sequence, reason: str = "cancelled") -> None:
        """Stop a request; it finishes with `reason` and its pages are released
        at the next step boundary."""
        self._post("cancel", seq, reason)

    def close(self, reason: str = "cancelled") -> None:
        """Take no new requests; end every queued or running one with `reason`
        at the next step boundary (even while paused)."""
        with self._wake:
            self._closed = True
            self._post("close", None, reason)

    def _post(self, op: str, seq: Sequence | None, reason: str | None = None) -> None:
        with self._wake:
            self._inbox.append((op, seq, reason))
            self._wake.notify()

    def _drain_inbox(self) -> None:
        while self._inbox:
            op, seq, reason = self._inbox.popleft()
            if op == "add":
                self.scheduler.add(seq)
            elif op == "close":
                self._finish_all(reason)
            elif not seq.is_finished:
                self._finish(seq, reason)

    # -- the step ---------------------------------------------------------

    def step(self) -> bool:
        """Run one step; False when there was nothing to do."""
        self._drain_inbox()
        self._note_cascade_switch()
        batch = self.scheduler.schedule()
        if batch is None:
            return False
        for seq in batch.preempted:
            self.metrics.preemptions.inc()
            log.info("preempted sequence %d (pool exhausted); it will be recomputed", seq.id)
        start = time.perf_counter()
        try:
            tokens = self._run(batch)
        except Exception:
            log.exception("step failed; its sequences are ended with finish reason 'error'")
            for seq in batch.seqs:
                self._finish(seq, "error")
            return True
        seconds = time.perf_counter() - start
        if batch.kind == "decode":
            self._last_decode = self.metrics.last_outcome
            self._last_plan = self._plan_view(batch.seqs)  # before finished sequences drop their pages
        self._postprocess(batch, tokens)
        self._record(batch, seconds)
        return True

    def _run(self, batch: ScheduledStep) -> list[int | None]:
        if batch.kind == "decode":
            return self.runner.decode(batch.seqs)
        return [self.runner.prefill(batch.seqs[0], batch.prefill_end)]

    def _postprocess(self, batch: ScheduledStep, tokens: list[int | None]) -> None:
        if batch.kind == "prefill":
            seq = batch.seqs[0]
            seq.num_cached_tokens = batch.prefill_end
            self.cache.commit(seq)
            if tokens[0] is None:
                return
            self.scheduler.prefill_done(seq)
        else:
            for seq in batch.seqs:
                seq.num_cached_tokens += 1
                self.cache.commit(seq)
        now = time.perf_counter()
        for seq, token in zip(batch.seqs, tokens):
            first = seq.num_completion_tokens == 0
            seq.token_ids.append(token)
            if first and seq.id in self._submitted_at:
                self.metrics.request_ttft.observe(now - self._submitted_at[seq.id])
            reason = self._stop_reason(seq, token)
            self._emit(seq, token, reason)
            if reason:
                self._finish(seq, reason, emit=False)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.tokenizer.eos_token_ids):
            return "stop"
        if seq.num_completion_tokens >= p.max_tokens:
            return "length"
        return None

    def _emit(self, seq: Sequence, token: int | None, reason: str | None) -> None:
        callback = self._callbacks.get(seq.id)
        if callback is None:
            return
        try:
            callback(seq, token, reason)
        except Exception:  # a broken consumer must not stop the engine
            log.exception("event callback for sequence %d failed", seq.id)

    def _finish(self, seq: Sequence, reason: str, emit: bool = True) -> None:
        self.scheduler.remove(seq)
        self.runner.sampler.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.metrics.request_finished(reason, seq.num_prompt_tokens, seq.num_completion_tokens)
        if emit:
            self._emit(seq, None, reason)
        self._callbacks.pop(seq.id, None)
        self._submitted_at.pop(seq.id, None)

    # -- snapshots ----------------------------------------------------------

    def _note_cascade_switch(self) -> None:
        if self.cascade.enabled != self._switches[-1][2]:
            self._switches.append((self.step_count, time.time(), self.cascade.enabled))

    def _record(self, batch: ScheduledStep, seconds: float) -> None:
        self.step_count += 1
        outcome = self._last_decode
        path = outcome.path if outcome and batch.kind == "decode" else "gather"
        self._recent.append(StepRecord(self.step_count, batch.kind, seconds, len(batch.seqs),
                                       len(batch.seqs) if batch.kind == "decode" else
                                       batch.prefill_end - batch.prefill_start,
                                       path, self.cascade.enabled, time.time()))
        if batch.kind == "decode":
            self.metrics.decode_step.observe(seconds)
        self.snapshot = self._build_snapshot()

    def _plan_view(self, rows: list[Sequence]) -> PlanView | None:
        """The last decode launch's cascade plan in sequence ids and block ids."""
        outcome = self._last_decode
        if outcome is None or outcome.plan is None:
            return None
        n = outcome.plan.shared_pages
        return PlanView(tuple(rows[m].id for m in outcome.plan.members), n, n * self.pool.block_size,
                        tuple(rows[outcome.plan.members[0]].block_table[:n]))

    def _build_snapshot(self) -> EngineSnapshot:
        pool, bs = self.pool, self.pool.block_size
        sched = self.scheduler
        live = ([sched.prefilling] if sched.prefilling else []) + list(sched.running)
        views = tuple(
            SequenceView(s.id, s.label, s.status.value, len(s), s.num_prompt_tokens, s.num_cached_tokens,
                         tuple(s.block_table), tuple(pool.refcount[b] for b in s.block_table),
                         0, (s.num_cached_tokens - 1) % bs + 1 if s.num_cached_tokens else 0)
            for s in live
        )
        outcome = self._last_decode
        stats = self.cache.stats()
        return EngineSnapshot(
            step=self.step_count, timestamp=time.time(), model=self.loaded.name, device=self.device,
            sequences=views, plan=self._last_plan,
            decline_reason=outcome.reason if outcome and outcome.plan is None else None,
            last_path=outcome.path if outcome else "",
            recent_steps=tuple(self._recent),
            pool=PoolView(pool.num_blocks, bs, pool.num_live, len(pool.free), pool.num_shared,
                          len(pool.reusable), pool.geometry.bytes_per_block),
            prefix_cache={"queries": stats.queries, "hits": stats.hits, "misses": stats.misses,
                          "prefix_tokens_reused": stats.prefix_tokens_reused, "evictions": stats.evictions,
                          "cached_blocks": stats.cached_blocks},
            cascade=self.cascade.as_dict(),
            cascade_switches=tuple(self._switches),
            waiting=len(sched.waiting), running=len(sched.running), preemptions=sched.num_preemptions,
            paused=self.paused,
        )

    # -- the thread ---------------------------------------------------------

    def start(self) -> "Engine":
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="mlxcel-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread:
            self._thread.join(timeout)
            self._thread = None

    def shutdown(self, reason: str = "cancelled") -> None:
        """Close, stop the thread and end every queued or running request with `reason`.
        Waits for a step in progress however long it takes: returning (and so letting
        the process exit) while the engine thread is inside MLX aborts the process."""
        self.close(reason)
        self.stop(timeout=None)
        self._drain_inbox()
        self.snapshot = self._build_snapshot()

    def _finish_all(self, reason: str) -> None:
        sched = self.scheduler
        for seq in [*([sched.prefilling] if sched.prefilling else []), *sched.running, *sched.waiting]:
            self._finish(seq, reason)

    def set_paused(self, paused: bool) -> None:
        with self._wake:
            self.paused = paused
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._inbox and (self.paused or not self.scheduler.has_work):
                    self._wake.wait(0.5)
                if self._stopping:
                    return
                paused = self.paused
            if paused:  # no steps, but cancellations still release their pages
                self._drain_inbox()
                self.snapshot = self._build_snapshot()
            else:
                self.step()

    def run_until_idle(self, max_steps: int | None = None) -> None:
        """Step on the calling thread until nothing is left (tests, `mlxcel stats --run`)."""
        steps = 0
        while (self._inbox or self.scheduler.has_work) and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Synchronous batch generation: completion token ids per prompt."""
        seqs = [self.submit(p, params) for p in prompts]
        self.run_until_idle()
        return [s.completion_token_ids for s in seqs]
