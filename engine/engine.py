"""The serving engine: step() reads as schedule -> launch -> postprocess.

The host stays ahead of the device, as mlx-lm's generate loop does: a step is
built and enqueued (``mx.async_eval``) before the previous one's tokens are
read, so the device runs step n while the host builds step n+1. Step n+1
takes step n's sampled tokens as lazy inputs; everything else it needs
(positions, page tables) is known on the host once step n is launched. A token
is streamed only after its step ran, and a sequence that finished at step n
(end of sequence, a cancel) drops step n+1's token unseen.

It runs on its own thread; other threads talk to it only through
submit/cancel (an inbox drained between steps), the shared CascadeConfig, and
the snapshot (built when read) and metrics it publishes."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Callable

import mlx.core as mx
import numpy as np
import psutil

from . import buffer_cache
from .cascade import best_span
from .config import CascadeConfig, EngineConfig
from .decode_plan import DecodeOutcome
from .metrics import EngineMetrics
from .model import LoadedModel
from .pool import BlockPool, PoolGeometry, dtype_name
from .prefix_cache import PrefixCache
from .runner import Launched, ModelRunner
from .scheduler import Scheduler, ScheduledStep
from .sequence import SamplingParams, Sequence, SequenceStatus, TokenLogprob
from .snapshot import (EngineSnapshot, PlanView, PoolView, RankView, SequenceView, SpanView, StepRecord,
                       TensorParallelView)
from .stat_logger import StatLogger
from .tensor_parallel import PoolFacts, Ranks, model_facts

log = logging.getLogger("mlxcel.engine")

# Called on the engine thread: (sequence, new token or None, finish reason or None).
EventCallback = Callable[[Sequence, "int | None", "str | None"], None]

RECENT_STEPS = 512
TEXT_TOKENS = 32  # a snapshot's prompt head and latest text, in tokens each
PROCESS = psutil.Process()  # this process, for the snapshot's `extra` figures


@contextmanager
def collector_paused():
    """Python's cyclic collector held off while a step is built: the
    collections its allocations would trigger there (over every object of the
    process: ~40% of a 36-layer build on a 2-core machine) run later, while
    the device works on the step."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new requests."""


@dataclass
class InFlight:
    """A launched step whose tokens have not been read yet."""

    batch: ScheduledStep
    launched: Launched
    started: float          # perf_counter when the engine began scheduling it
    enqueued: float         # perf_counter when MLX took it
    rows: dict[int, int]    # sequence id -> its row in launched.tokens
    kv_bytes_flat: int = 0  # KV bytes the decode rows' attention reads flat, all layers


def prompt_ids(token_ids, vocab_size: int) -> list[int]:
    """The prompt as Python ints in [0, vocab_size) (NumPy's integers too), or
    ValueError naming the first that is not: one bad id would otherwise fail the
    step of every sequence batched with it."""
    ids = np.asarray(token_ids)
    if ids.size == 0:
        return []
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        at = next(i for i, t in enumerate(token_ids)
                  if not isinstance(t, (int, np.integer)) or isinstance(t, (bool, np.bool_)))
        raise ValueError(f"prompt token {at} is not an integer: {token_ids[at]!r}")
    outside = (ids < 0) | (ids >= vocab_size)
    if outside.any():
        at = int(outside.argmax())
        raise ValueError(f"prompt token {at} is {int(ids[at])}, outside the vocabulary [0, {vocab_size})")
    return ids.tolist()


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None,
                 cascade: CascadeConfig | None = None, metrics: EngineMetrics | None = None,
                 ranks: Ranks | None = None) -> None:
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.cascade = cascade or CascadeConfig.from_env()
        self.metrics = metrics or EngineMetrics()
        try:
            geometry = PoolGeometry.named(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim,
                                          self.config.block_size, self.config.kv_dtype or dtype_name(loaded.dtype))
            self.pool = BlockPool(geometry, self.config.pool_blocks(geometry))
        except ValueError:   # a pool the model cannot have: the other ranks, waiting for its facts, stop too
            if ranks is not None:
                ranks.call_off(model_facts(loaded))
            raise
        # The same pages at the model's own dtype: what the snapshot and /metrics compare the format with.
        self.model_dtype_geometry = replace(geometry, dtype=loaded.dtype, quant=None)
        if ranks is not None:   # rank 0 of several: the other ranks size their pools (their own heads) alike
            facts = PoolFacts(self.pool.num_blocks, geometry.block_size, geometry.kv_dtype)
            ranks.share_pool(model_facts(loaded), facts)
            ranks.on_fault.append(self._fail)
        self.cache = PrefixCache(self.pool, enabled=self.config.prefix_caching)
        self.scheduler = Scheduler(self.cache, self.config.max_running, self.config.max_batched_tokens)
        self.runner = ModelRunner(loaded, self.pool, ranks)
        self.runner.build_kernels(self.config.max_running)
        self.ranks = ranks
        self.device = str(mx.default_device())
        self.metrics.bind_engine(self)
        self.stat_logger = StatLogger(self)
        self._callbacks: dict[int, EventCallback] = {}
        self._inbox: deque[tuple[str, Sequence | None, str | None]] = deque()  # (op, sequence, reason)
        self._wake = threading.Condition()
        # Held while the engine thread changes what a snapshot reads (not while
        # it waits for the device), and while a snapshot is built.
        self._state = threading.RLock()
        self._inflight: InFlight | None = None
        self._last_done = 0.0   # perf_counter when the last step's tokens were read
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self.paused = False
        self.step_count = 0
        self._recent: deque[StepRecord] = deque(maxlen=RECENT_STEPS)
        self._switches: list[tuple[int, float, bool]] = [(0, time.time(), self.cascade.enabled)]
        self._last_plan: PlanView | None = None
        self._last_decode: DecodeOutcome | None = None  # the last decode step's launch
        # What the process that runs the engine says of itself for its
        # snapshots (the CLI: the BLAS it preloaded), so viewers in other
        # processes see it too.
        self.process_facts: dict[str, str] = {}

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
        """The engine as it stands between steps, built now (not every step),
        with in `extra` this process's memory and CPU as read now, for viewers
        in other processes."""
        with self._state:
            snapshot, tokens = self._build_snapshot()
        decode = self.tokenizer.decode
        sequences = tuple(replace(view, prompt_head=decode(head), latest_text=decode(tail))
                          for view, (head, tail) in zip(snapshot.sequences, tokens))
        extra = {**self.process_facts,
                 "process_rss_bytes": PROCESS.memory_info().rss,
                 "process_cpu_percent": PROCESS.cpu_percent(None),  # since the previous read
                 "mlx_active_memory_bytes": mx.get_active_memory(),
                 "mlx_cache_memory_bytes": mx.get_cache_memory(),
                 "mlx_peak_memory_bytes": mx.get_peak_memory()}
        return replace(snapshot, sequences=sequences, extra=extra)

    # -- requests (any thread) ------------------------------------------

    def submit(self, token_ids: list[int], params: SamplingParams | None = None,
               on_event: EventCallback | None = None, label: str = "") -> Sequence:
        """Queue a request; raises RequestRejected (nothing queued) if it can never
        fit, EngineClosed once the engine is shutting down."""
        ids = prompt_ids(token_ids, self.vocab_size)
        if not ids:
            raise ValueError("a request needs at least one prompt token")
        seq = Sequence(ids, params or SamplingParams(), label=label)
        self.scheduler.check(len(seq) + seq.params.max_tokens)
        with self._wake:  # checked and queued at once, so close() ends every request it let in
            if self._closed:
                raise EngineClosed("the engine is shutting down; it takes no new requests")
            if on_event:
                self._callbacks[seq.id] = on_event
            seq.submitted_at = time.perf_counter()
            self._post("add", seq)
        return seq

    def cancel(self, seq: Sequence, reason: str = "cancelled") -> None:
        """Stop a request; it finishes with `reason` and its pages are released
        at the next step boundary."""
        self._post("cancel", seq, reason)

    def close(self, reason: str = "cancelled") -> None:
        """Take no new requests; end every queued or running one with `reason`
        at the next step boundary (even while paused). Under tensor parallelism
        the boundary must come soon: a step that waits on a lost rank is a fault
        within seconds (Ranks.hurry), not at the rank timeout."""
        with self._wake:
            self._closed = True
            self._post("close", None, reason)
        if self.ranks:
            self.ranks.hurry()

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
        """Launch the next step and read back the one before it; False when
        there was nothing to do."""
        start = time.perf_counter()
        with self._state, collector_paused():
            self._drain_inbox()
            self._note_cascade_switch()
            batch = self.scheduler.schedule()
            launched = self._launch(batch, start) if batch is not None else None
        # Outside the lock: on the CPU MLX's async_eval runs most of the step before it returns (a prompt's
        # chunk: seconds), and a snapshot's read (a dashboard's poll) need not wait for it.
        launched = self._enqueue(launched) if launched is not None else None
        finished = self._complete(self._inflight)
        self._inflight = launched
        if buffer_cache.trim():
            self.metrics.mlx_cache_clears.inc()
        return launched is not None or finished

    def _launch(self, batch: ScheduledStep, start: float) -> InFlight | None:
        for seq in batch.preempted:
            self.metrics.preemptions.inc()
            log.info("preempted sequence %d (pool exhausted); it will be recomputed", seq.id)
        settings = self.cascade.snapshot()   # the whole step runs with one reading
        try:
            launched = self.runner.step(batch, self._last_tokens(batch.decode) if batch.decode else None, settings)
        except Exception as err:
            if self.ranks:   # the other ranks may have built the step: they and this one can no longer agree
                self.ranks.fault(f"rank 0 could not build a step: {err}")
            self._end_failed_step(batch)
            return None
        now = time.perf_counter()
        for seq in batch.seqs:
            if seq.scheduled_at is None:
                seq.scheduled_at = now
        self._advance(batch)
        for outcome in launched.outcomes:   # every layer launched alike
            self.metrics.record_decode(outcome, self.loaded.num_layers)
        if batch.decode:
            self._last_decode = launched.outcomes[0]
            self._last_plan = self._plan_view(batch.decode, launched.outcomes[0])
        sampling = batch.decode + ([batch.prefill] if batch.finishes_prefill else [])
        flat = sum(len(seq.block_table) for seq in batch.decode) * self.pool.geometry.bytes_per_block
        return InFlight(batch, launched, start, launched.built, {seq.id: row for row, seq in enumerate(sampling)},
                        flat)

    def _enqueue(self, inflight: InFlight) -> InFlight | None:
        """Hand a built step to MLX; a step MLX refuses ends its sequences (as one whose tokens fail)."""
        try:
            self.runner.launch(inflight.launched)
        except Exception as err:
            if self.ranks:   # the other ranks may have enqueued the step: they and this one can no longer agree
                self.ranks.fault(f"rank 0 could not enqueue a step: {err}")
            self._end_failed_step(inflight.batch)
            return None
        inflight.enqueued = time.perf_counter()
        return inflight

    def _end_failed_step(self, batch: ScheduledStep) -> None:
        """A step that failed (the exception being handled says why): its sequences end with finish reason
        'error'."""
        log.exception("step failed; its sequences are ended with finish reason 'error'")
        with self._state:
            for seq in batch.seqs:
                if not seq.is_finished:
                    self._finish(seq, "error")

    def _last_tokens(self, seqs: list[Sequence]) -> mx.array:
        """Each row's input token: on the host, or the in-flight step's sampled one."""
        pending = [self._inflight.rows[s.id] if s.pending_tokens else -1 for s in seqs]
        if pending == list(range(len(seqs))):   # the in-flight step's first rows, in order: nothing to upload
            launched = self._inflight.launched.tokens
            return launched if launched.shape[0] == len(seqs) else launched[:len(seqs)]
        tokens = mx.array([0 if s.pending_tokens else s.token_ids[-1] for s in seqs], dtype=mx.int32)
        if not any(p >= 0 for p in pending):
            return tokens
        source = mx.array([max(p, 0) for p in pending], dtype=mx.int32)
        return mx.where(mx.array([p >= 0 for p in pending]), self._inflight.launched.tokens[source], tokens)

    def _advance(self, batch: ScheduledStep) -> None:
        """The host's state as of the launched step: K/V positions written,
        tokens on their way, sequences whose last token this is retired."""
        sampled = list(batch.decode)
        for seq in batch.decode:
            seq.num_cached_tokens += 1
        if batch.prefill is not None:
            seq = batch.prefill
            seq.num_cached_tokens = batch.prefill_end
            self.cache.commit(seq)
            if batch.finishes_prefill:
                self.scheduler.prefill_done(seq)
                sampled.append(seq)
        for seq in sampled:
            seq.pending_tokens += 1
            if seq.num_completion_tokens + seq.pending_tokens >= seq.params.max_tokens:
                self.scheduler.retire(seq)

    def _complete(self, inflight: InFlight | None) -> bool:
        """Wait for a launched step, then stream its tokens; False if there was none."""
        if inflight is None:
            return False
        waited = time.perf_counter()
        try:
            with self.ranks.watch("a step's tokens") if self.ranks else nullcontext():
                sampled = [a.tolist() if a is not None else None for a in (
                    inflight.launched.sampled.tokens, inflight.launched.sampled.logprobs,
                    inflight.launched.sampled.top_ids, inflight.launched.sampled.top_logprobs)]
        except Exception:
            self._end_failed_step(inflight.batch)
            return True
        done = time.perf_counter()
        with self._state:
            self._postprocess(inflight, *sampled)
            self._record(inflight, done, done - waited)
        return True

    def _postprocess(self, inflight: InFlight, tokens: list[int], logprobs: list[float] | None,
                     top_ids: list[list[int]] | None, top_logprobs: list[list[float]] | None) -> None:
        now = time.perf_counter()
        read, gaps = 0, []   # the step's tokens and inter-token gaps, counted at once (before any finish)
        for seq in inflight.batch.seqs:
            row = inflight.rows.get(seq.id)
            if row is None or seq.is_finished:   # a middle prefill chunk, or ended since its launch
                continue
            token = tokens[row]
            seq.pending_tokens -= 1
            seq.token_ids.append(token)
            self.cache.commit(seq)
            if seq.first_token_at is None:
                seq.first_token_at = now
                self.metrics.first_token(seq)
            else:
                gaps.append(now - seq.last_token_at)
            seq.last_token_at = now
            read += 1
            wanted = seq.params.logprobs
            if wanted is not None:
                top = tuple(zip(top_ids[row][:wanted], top_logprobs[row][:wanted])) if wanted else ()
                seq.logprobs.append(TokenLogprob(logprobs[row], top))
            reason = self._stop_reason(seq, token)
            if reason:
                read, gaps = self._count_tokens(read, gaps)
                self._finish(seq, reason, token=token)
            else:
                self._emit(seq, token, None)
        self._count_tokens(read, gaps)

    def _count_tokens(self, read: int, gaps: list[float]) -> tuple[int, list[float]]:
        if read:
            self.metrics.completion_tokens.inc(read)
        self.metrics.inter_token_latency.observe(gaps)
        return 0, []

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

    def _finish(self, seq: Sequence, reason: str, emit: bool = True, token: int | None = None) -> None:
        """End a sequence; its last event (with its last token, if any) goes out
        after it is counted, so a client that reads /metrics on its answer sees it.
        Its pages may still be written by a launched step: every later step that
        reuses them is ordered after it on the device."""
        self.scheduler.remove(seq)
        self.runner.sampler.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.metrics.request_finished(seq, reason, time.perf_counter())
        if emit:
            self._emit(seq, token, reason)
        self._callbacks.pop(seq.id, None)

    # -- snapshots ----------------------------------------------------------

    def _note_cascade_switch(self) -> None:
        if self.cascade.enabled != self._switches[-1][2]:
            self._switches.append((self.step_count, time.time(), self.cascade.enabled))

    def _record(self, inflight: InFlight, done: float, waited: float) -> None:
        """One step's figures, once. Its wall time runs from its launch, or
        from the previous step's end when the two overlapped; its host time is
        the engine's (scheduling, planning, building the graph), the rest is
        MLX's (encoding and running the kernels, waiting for them)."""
        batch, outcome = inflight.batch, inflight.launched.outcomes[0]
        host = inflight.launched.built - inflight.started
        device = inflight.enqueued - inflight.launched.built + waited
        seconds = done - max(inflight.started, self._last_done)
        self._last_done = done
        self.step_count += 1
        self._recent.append(StepRecord(self.step_count, batch.kind, seconds, len(batch.seqs),
                                       len(batch.decode) if batch.decode else batch.prefill_tokens,
                                       outcome.path, self.cascade.enabled, time.time(), host, device,
                                       batch.prefill_tokens, inflight.kv_bytes_flat if batch.decode else 0,
                                       outcome.kv_bytes_saved * self.loaded.num_layers if batch.decode else 0))
        if batch.kind == "decode":
            self.metrics.decode_step.observe(seconds)
            self.metrics.decode_step_host.observe(host)

    def _plan_view(self, rows: list[Sequence], outcome: DecodeOutcome) -> PlanView | None:
        """A decode launch's cascade plan in sequence ids and block ids."""
        plan = outcome.plan
        if plan is None:
            return None
        bs = self.pool.block_size
        best = best_span(plan.spans)
        outermost = plan.levels[0]
        savings = outcome.span_savings_s or (None,) * len(plan.spans)
        spans = tuple(
            SpanView(next(g for g, o in enumerate(outermost) if s.members[0] in o.members), depth,
                     tuple(rows[m].id for m in s.members), s.start, s.end, s.pages * bs, saving)
            for (s, saving), depth in ((pair, plan.depth_of(pair[0])) for pair in zip(plan.spans, savings)))
        per_layer = outcome.predicted_saving_s
        return PlanView(tuple(rows[m].id for m in best.members), best.pages, best.pages * bs,
                        tuple(rows[best.members[0]].block_table[best.start:best.end]), spans,
                        None if per_layer is None else per_layer * self.loaded.num_layers)

    def _sequence_view(self, seq: Sequence, now: float) -> SequenceView:
        bs, pool = self.pool.block_size, self.pool
        status = "prefilling" if seq is self.scheduler.prefilling else seq.status.value
        submitted, first = seq.submitted_at, seq.first_token_at
        ttft = first - submitted if first is not None and submitted is not None else None
        after_first = seq.num_completion_tokens - 1
        rate = after_first / (now - first) if first is not None and after_first > 0 and now > first else None
        return SequenceView(seq.id, seq.label, status, len(seq), seq.num_prompt_tokens, seq.num_cached_tokens,
                            tuple(seq.block_table), tuple(pool.refcount[b] for b in seq.block_table),
                            0, (seq.num_cached_tokens - 1) % bs + 1 if seq.num_cached_tokens else 0,
                            ttft_seconds=ttft, tokens_per_second=rate)

    def _build_snapshot(self) -> tuple[EngineSnapshot, list[tuple[list[int], list[int]]]]:
        """The snapshot, and each live sequence's prompt head and latest
        completion tokens (decoded by the caller, outside the engine's lock)."""
        pool, bs = self.pool, self.pool.block_size
        sched = self.scheduler
        live = sched.holders
        now = time.perf_counter()
        views = tuple(self._sequence_view(s, now) for s in live)
        tokens = [(s.token_ids[:TEXT_TOKENS], s.completion_token_ids[-TEXT_TOKENS:]) for s in live]
        with self._wake:  # requests submitted but not drained into the scheduler yet count as waiting
            inbox = [seq for op, seq, _ in self._inbox if op == "add"]
        queued = tuple(self._sequence_view(s, now) for s in [*sched.waiting, *inbox])
        outcome = self._last_decode
        stats = self.cache.stats()
        return EngineSnapshot(
            step=self.step_count, timestamp=time.time(), model=self.loaded.name, device=self.device,
            sequences=views, plan=self._last_plan,
            decline_reason=outcome.reason if outcome and outcome.plan is None else None,
            last_path=outcome.path if outcome else "",
            recent_steps=tuple(self._recent),
            pool=PoolView(pool.num_blocks, bs, pool.num_live, len(pool.free), pool.num_shared,
                          len(pool.reusable), pool.geometry.bytes_per_block, pool.geometry.kv_dtype,
                          self.model_dtype_geometry.kv_dtype, self.model_dtype_geometry.bytes_per_block),
            prefix_cache={"queries": stats.queries, "hits": stats.hits, "misses": stats.misses,
                          "prefix_tokens_reused": stats.prefix_tokens_reused, "evictions": stats.evictions,
                          "cached_blocks": stats.cached_blocks},
            cascade=self.cascade.as_dict(),
            cascade_switches=tuple(self._switches),
            waiting=len(sched.waiting), running=len(live), preemptions=sched.num_preemptions,
            paused=self.paused, queued=queued, tensor_parallel=self._tensor_parallel_view(),
        ), tokens

    def _tensor_parallel_view(self) -> TensorParallelView | None:
        if self.ranks is None:
            return None
        pool_bytes = self.pool.num_blocks * self.pool.geometry.bytes_per_block
        ranks = tuple(RankView(rank, self.loaded.num_kv_heads, pool_bytes, active, peak)
                      for rank, (active, peak) in enumerate(self.ranks.memory()))
        return TensorParallelView(self.ranks.size, self.ranks.backend, ranks)

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
        with self._state:
            self._drain_inbox()
        if self.ranks:
            self.ranks.stop()

    def _fail(self, message: str) -> None:
        """The ranks cannot go on: every request ends with finish reason 'error'
        and no new one is taken (the process ends next)."""
        log.error("tensor-parallel fault: %s", message)
        locked = self._state.acquire(timeout=1.0)
        try:
            with self._wake:
                self._closed = True
            # Without the lock too: its holder waits inside MLX for a rank that is gone and will
            # not return before the process ends, which is the moment after this.
            self._finish_all("error")
        finally:
            if locked:
                self._state.release()

    def _finish_all(self, reason: str) -> None:
        for seq in [*self.scheduler.holders, *self.scheduler.waiting]:
            self._finish(seq, reason)

    def set_paused(self, paused: bool) -> None:
        with self._wake:
            self.paused = paused
            self._wake.notify()

    def _idle(self) -> bool:
        return not self._stopping and not self._inbox and self._inflight is None and (
            self.paused or not self.scheduler.has_work)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._idle():
                    self._wake.wait(0.5)
                if self._stopping:
                    break
                idle, paused = self._idle(), self.paused
            self.stat_logger.tick()
            if idle:
                if self.ranks:   # outside the lock: a heartbeat waits for every rank
                    self.ranks.heartbeat()
            elif paused:  # no new steps: the one in flight streams, cancellations release their pages
                self._complete(self._inflight)
                self._inflight = None
                with self._state:
                    self._drain_inbox()
            else:
                self.step()
        self._complete(self._inflight)   # never leave the thread with a step on the device
        self._inflight = None

    def run_until_idle(self, max_steps: int | None = None) -> None:
        """Step on the calling thread until nothing is left (tests, `mlxcel stats --run`)."""
        steps = 0
        while (self._inbox or self.scheduler.has_work or self._inflight) and (
                max_steps is None or steps < max_steps):
            self.step()
            steps += 1

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Synchronous batch generation: completion token ids per prompt."""
        seqs = [self.submit(p, params) for p in prompts]
        self.run_until_idle()
        return [s.completion_token_ids for s in seqs]
