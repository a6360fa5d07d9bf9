"""Next-token choice per row, each row with its own sampling parameters."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

from .sequence import Sequence


class Sampler:
    def __init__(self) -> None:
        self._keys: dict[int, mx.array] = {}  # per-sequence RNG state for seeded requests

    def forget(self, seq: Sequence) -> None:
        self._keys.pop(seq.id, None)

    def sample(self, logits: mx.array, seqs: list[Sequence]) -> mx.array:
        """logits [rows, vocab] -> one token id per row, [rows] int32, lazy
        (the engine reads it once the step has run)."""
        logits = logits.astype(mx.float32)
        greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
        if all(s.params.temperature == 0 for s in seqs):
            return greedy
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picks = []
        for row, seq in enumerate(seqs):
            p = seq.params
            if p.temperature == 0:
                picks.append(greedy[row])
                continue
            row_logprobs = logprobs[row : row + 1]
            if p.top_p < 1:
                # An array, not a float: apply_top_p is mx.compile'd, and every distinct
                # Python float would compile it anew (~2 s on the engine thread, stalling
                # every session, and one more cache entry for good).
                row_logprobs = apply_top_p(row_logprobs, mx.array(p.top_p, dtype=mx.float32))
            key = None
            if p.seed is not None:
                state, key = mx.random.split(self._keys.get(seq.id, mx.random.key(p.seed)))
                self._keys[seq.id] = state
            picks.append(mx.random.categorical(row_logprobs * (1 / p.temperature), key=key)[0].astype(mx.int32))
        return mx.stack(picks)
