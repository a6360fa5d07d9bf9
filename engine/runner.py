"""One forward pass over the pool, built and enqueued: a decode step for a
batch or a prefill chunk. Nothing here waits for the device; the sampled
tokens come back as a lazy array the engine reads once the step has run."""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.kernels import AttentionShape, CsrBuilder, PagedCsrView
from mlxcel.kernels.csr import host_csr

from .config import CascadeSettings
from .decode_plan import DecodeOutcome, DecodePlanner, gather_outcome, log_first_launch
from .model import LoadedModel, StepContext, output_logits
from .pool import BlockPool
from .sampler import Sampler
from .sequence import Sequence


@dataclass(frozen=True)
class Launched:
    """A step on its way: its sampled tokens (one per sampling row, lazy),
    what its attention launches did, and when its graph was built (what
    follows is MLX's: encoding the kernels, on the CPU running all but the
    last few of them)."""

    tokens: mx.array
    outcome: DecodeOutcome
    built: float    # perf_counter when the graph was complete


class ModelRunner:
    def __init__(self, loaded: LoadedModel, pool: BlockPool) -> None:
        self.loaded = loaded
        self.pool = pool
        self.sampler = Sampler()
        self.csr_builder = CsrBuilder(pool.block_size)
        self.planner = DecodePlanner()
        self.shape = AttentionShape(loaded.num_heads, loaded.num_kv_heads, loaded.head_dim, loaded.dtype,
                                    pool.geometry.dtype, pool.block_size, loaded.scale)

    def _enqueue(self, outputs: list[mx.array]) -> float:
        """Start evaluating a built step; returns when its graph was complete.
        The pool arrays are outputs of every step: evaluating them with the
        tokens keeps each layer's write in place and the graph from growing."""
        built = time.perf_counter()
        mx.async_eval(*outputs, self.pool.keys, self.pool.values)
        return built

    def decode(self, seqs: list[Sequence], last_tokens: mx.array, settings: CascadeSettings) -> Launched:
        """Feed each sequence's last token (``last_tokens`` [rows], possibly the
        previous step's lazy output) at position num_cached_tokens; the page
        tables must already cover that position."""
        bs = self.pool.block_size
        positions = np.fromiter((s.num_cached_tokens for s in seqs), np.int32, len(seqs))
        csr = self.csr_builder.build(
            tuple((s.id, s.table_version) for s in seqs),
            [s.block_table for s in seqs],
            positions + 1,
        )
        plan = self.planner.plan(csr, settings, self.shape)
        blocks = [s.block_table[p // bs] for s, p in zip(seqs, positions.tolist())]
        ctx = StepContext(self.pool, mx.array(positions), mx.array(blocks, dtype=mx.int32),
                          mx.array(positions % bs), decode_rows=len(seqs), decode_csr=csr, plan=plan)
        tokens = self.sampler.sample(output_logits(self.loaded.model, last_tokens[:, None], ctx, None), seqs)
        outcome = plan.outcome                # after the layers: a launch that failed in one of them shows
        log_first_launch(outcome)
        return Launched(tokens, outcome, self._enqueue([tokens]))

    def prefill(self, seq: Sequence, end: int) -> Launched:
        """Compute K/V for tokens num_cached_tokens..end-1; samples the next
        token (one row) only when the chunk reaches the end of the sequence."""
        start = seq.num_cached_tokens
        csr = PagedCsrView.from_host(host_csr([seq.block_table], [end], self.pool.block_size))
        blocks, offsets = self.pool.slots(seq.block_table, start, end - start)
        ctx = StepContext(self.pool, mx.arange(start, end, dtype=mx.int32), mx.array(blocks, dtype=mx.int32),
                          mx.array(offsets, dtype=mx.int32), decode_rows=0, prefill_csr=csr)
        tokens = mx.array(seq.token_ids[start:end], dtype=mx.int32)[:, None]
        logits = output_logits(self.loaded.model, tokens, ctx, mx.array([end - start - 1], dtype=mx.int32))
        # A middle chunk is run for its K/V only: its logits are never evaluated.
        sampled = self.sampler.sample(logits, [seq]) if end == len(seq) else mx.zeros((0,), mx.int32)
        outcome = gather_outcome(1, end - start)
        log_first_launch(outcome)
        return Launched(sampled, outcome, self._enqueue([sampled]))
