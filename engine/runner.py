"""One forward pass over the pool: a decode step for a batch, or a prefill chunk."""

from __future__ import annotations

import mlx.core as mx

from mlxcel.kernels import CsrBuilder, PagedCsrView
from mlxcel.kernels.csr import host_csr

from .config import CascadeConfig
from .metrics import EngineMetrics
from .model import LoadedModel, StepContext, make_layer_caches
from .pool import BlockPool
from .sampler import Sampler
from .sequence import Sequence


class ModelRunner:
    def __init__(self, loaded: LoadedModel, pool: BlockPool, cascade: CascadeConfig,
                 metrics: EngineMetrics | None = None) -> None:
        self.loaded = loaded
        self.pool = pool
        self.cascade = cascade
        self.metrics = metrics
        self.sampler = Sampler()
        self.csr_builder = CsrBuilder(pool.block_size)

    def _forward(self, tokens: mx.array, ctx: StepContext, offset: mx.array | int) -> mx.array:
        caches = make_layer_caches(ctx, self.loaded.num_layers, offset)
        logits = self.loaded.model(tokens, cache=caches)[:, -1, :]
        # The pool arrays are part of the graph; evaluating them with the logits
        # keeps each layer's write in place and the graph from growing.
        mx.eval(logits, self.pool.keys, self.pool.values)
        return logits

    def decode(self, seqs: list[Sequence]) -> list[int]:
        return self.sampler.sample(self.decode_logits(seqs), seqs)

    def decode_logits(self, seqs: list[Sequence]) -> mx.array:
        """Feed each sequence's last token (position num_cached_tokens); the page
        tables must already cover that position. Returns logits [rows, vocab]."""
        bs = self.pool.block_size
        positions = [s.num_cached_tokens for s in seqs]
        csr = self.csr_builder.build(
            tuple((s.id, s.table_version) for s in seqs),
            [s.block_table for s in seqs],
            [p + 1 for p in positions],
        )
        ctx = StepContext(
            self.pool, csr,
            mx.array([s.block_table[p // bs] for s, p in zip(seqs, positions)], dtype=mx.int32),
            mx.array([p % bs for p in positions], dtype=mx.int32),
            decode=True, cascade=self.cascade, metrics=self.metrics,
        )
        tokens = mx.array([[s.token_ids[-1]] for s in seqs], dtype=mx.int32)
        return self._forward(tokens, ctx, mx.array(positions, dtype=mx.int32))

    def prefill(self, seq: Sequence, end: int) -> int | None:
        """Compute K/V for tokens num_cached_tokens..end-1; returns the next token
        when the chunk reaches the end of the sequence."""
        logits = self.prefill_logits(seq, end)
        return self.sampler.sample(logits, [seq])[0] if end == len(seq) else None

    def prefill_logits(self, seq: Sequence, end: int) -> mx.array:
        """The chunk's forward pass; logits [1, vocab] of its last position."""
        start = seq.num_cached_tokens
        csr = PagedCsrView.from_host(host_csr([seq.block_table], [end], self.pool.block_size))
        blocks, offsets = self.pool.slots(seq.block_table, start, end - start)
        ctx = StepContext(self.pool, csr, mx.array(blocks, dtype=mx.int32), mx.array(offsets, dtype=mx.int32),
                          decode=False, cascade=self.cascade, metrics=self.metrics)
        tokens = mx.array([seq.token_ids[start:end]], dtype=mx.int32)
        return self._forward(tokens, ctx, start)
