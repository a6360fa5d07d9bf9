"""One forward pass over the pool, built and enqueued: the decode rows of a
step and the prefill chunk beside them share every matmul. Nothing here
waits for the device; the sampled tokens come back as a lazy array the
engine reads once the step has run."""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import AttentionShape, CsrBuilder, PagedCsrView
from mlxcel.kernels.csr import host_csr
from mlxcel.kernels.layer_ops import layer_ops

from .config import CascadeSettings
from .decode_plan import DecodeOutcome, DecodePlanner, gather_outcome, log_first_launch
from .model import LoadedModel, StepContext, output_logits
from .pool import BlockPool
from .sampler import Sampler
from .scheduler import ScheduledStep


@dataclass(frozen=True)
class Launched:
    """A step on its way: its sampled tokens (one per sampling row, lazy),
    what its attention launches did (the decode rows', the prefill chunk's),
    and when its graph was built (what follows is MLX's: encoding the
    kernels, on the CPU running all but the last few of them)."""

    tokens: mx.array
    outcomes: tuple[DecodeOutcome, ...]
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

    def step(self, batch: ScheduledStep, last_tokens: mx.array | None, settings: CascadeSettings) -> Launched:
        """One forward pass: each decode row feeds its last token (``last_tokens``,
        possibly the previous step's lazy output) at position num_cached_tokens,
        the prefill chunk its prompt tokens; the page tables must already cover
        every position. Samples the decode rows, and the chunk's last token when
        it ends the prompt."""
        bs = self.pool.block_size
        decode, seq = batch.decode, batch.prefill
        positions = np.fromiter((s.num_cached_tokens for s in decode), np.int32, len(decode))
        blocks = [s.block_table[p // bs] for s, p in zip(decode, positions.tolist())]
        tokens = [last_tokens] if decode else []
        ops = layer_ops()
        ctx = StepContext(self.pool, mx.array(positions), mx.array(blocks, dtype=mx.int32),
                          mx.array(positions % bs), decode_rows=len(decode), ops=ops,
                          # Only where every read of the pool takes q (what orders the store before the reads):
                          # the fused decode kernels do, a prefill chunk's gather does not.
                          store_in_kernel=seq is None and ops.stores_in_place and kernels.fused_takes(self.shape))
        outcomes = []
        if decode:
            ctx.decode_csr = self.csr_builder.build(tuple((s.id, s.table_version) for s in decode),
                                                    [s.block_table for s in decode], positions + 1)
            ctx.plan = self.planner.plan(ctx.decode_csr, settings, self.shape)
        if seq is not None:
            start, end = batch.prefill_start, batch.prefill_end
            ctx.prefill_csr = PagedCsrView.from_host(host_csr([seq.block_table], [end], bs))
            chunk_blocks, chunk_offsets = self.pool.slots(seq.block_table, start, end - start)
            ctx.positions = mx.concatenate([ctx.positions, mx.arange(start, end, dtype=mx.int32)])
            ctx.slot_blocks = mx.concatenate([ctx.slot_blocks, mx.array(chunk_blocks, dtype=mx.int32)])
            ctx.slot_offsets = mx.concatenate([ctx.slot_offsets, mx.array(chunk_offsets, dtype=mx.int32)])
            tokens.append(mx.array(seq.token_ids[start:end], dtype=mx.int32))
        sampling = decode + ([seq] if batch.finishes_prefill else [])
        # Rows that sample nothing (a middle chunk's) get no logits: their graph is never evaluated. A step of
        # decode rows only samples every row, with no gather of the rows.
        rows = None
        if seq is not None:
            last = [len(decode) + batch.prefill_tokens - 1] if batch.finishes_prefill else []
            rows = mx.array(list(range(len(decode))) + last, dtype=mx.int32)
        logits = output_logits(self.loaded.model, mx.concatenate(tokens)[:, None], ctx, rows)
        sampled = self.sampler.sample(logits, sampling) if sampling else mx.zeros((0,), mx.int32)
        if decode:
            outcomes.append(ctx.plan.outcome)     # after the layers: a launch that failed in one of them shows
        if seq is not None:
            outcomes.append(gather_outcome(1, batch.prefill_tokens))
        for outcome in outcomes:
            log_first_launch(outcome)
        built = time.perf_counter()
        # The pool arrays are outputs of every step: evaluating them with the
        # tokens keeps each layer's write in place and the graph from growing.
        mx.async_eval(sampled, self.pool.keys, self.pool.values)
        return Launched(sampled, tuple(outcomes), built)
