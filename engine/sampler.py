"""Next-token choice per row, each row with its own sampling parameters.

mlx-lm's pieces do the work (``mlx_lm.sample_utils``): its logits processors
(logit bias, repetition, presence and frequency penalties) and its filters in
make_sampler's order (top-p, min-p, top-k) before a draw at the temperature.
The draw itself is ``mx.random.categorical`` with the request's own key when it
gave a seed (make_sampler's draws from the global state). Everything stays
lazy: a row's penalty context ends in its input token, which may still be on
the device (the step before it has not been read), so no row forces a sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from .sequence import SamplingParams, Sequence

# min-p through apply_min_p with one constant: it bakes min_p into its compiled
# graph (a compile per new value: ~0.5 s on the engine thread, on the CPU, and
# a cache entry for good), so a row's logprobs are scaled by s = -1/log(min_p)
# first: s*x < s*max + log(MIN_P_BASE) holds exactly when x < max + log(min_p).
MIN_P_BASE = math.exp(-1.0)


@dataclass(frozen=True)
class Sampled:
    """A step's choices, lazy: one token per row and, when a row asked for
    them, every row's chosen log-probability and its ``top`` likeliest tokens
    (ids and log-probabilities, most likely first)."""

    tokens: mx.array                       # [rows] int32
    logprobs: mx.array | None = None       # [rows] float32
    top_ids: mx.array | None = None        # [rows, top] int32
    top_logprobs: mx.array | None = None   # [rows, top] float32

    @property
    def arrays(self) -> list[mx.array]:
        return [a for a in (self.tokens, self.logprobs, self.top_ids, self.top_logprobs) if a is not None]


@dataclass(frozen=True)
class _Processors:
    steps: tuple            # mlx-lm logits processors: (tokens, logits) -> logits
    window: int             # the most recent tokens any of them looks at


def _processors(p: SamplingParams) -> _Processors | None:
    if not p.has_processors:
        return None
    steps = make_logits_processors(dict(p.logit_bias) or None, p.repetition_penalty, p.repetition_context_size,
                                   p.presence_penalty, p.presence_context_size, p.frequency_penalty,
                                   p.frequency_context_size)
    window = max(p.repetition_context_size, p.presence_context_size, p.frequency_context_size)
    return _Processors(tuple(steps), window)


class Sampler:
    def __init__(self) -> None:
        self._keys: dict[int, mx.array] = {}  # per-sequence RNG state for seeded requests
        self._processors: dict[int, _Processors | None] = {}

    def forget(self, seq: Sequence) -> None:
        self._keys.pop(seq.id, None)
        self._processors.pop(seq.id, None)

    def sample(self, logits: mx.array, seqs: list[Sequence], inputs: mx.array | None = None) -> Sampled:
        """logits [rows, vocab] -> Sampled, lazy (the engine reads it once the
        step has run). ``inputs`` are the first rows' input tokens (the decode
        rows': each one's latest token, possibly still on the device)."""
        logits = self._processed(logits.astype(mx.float32), seqs, inputs)
        wanted = [s.params.logprobs for s in seqs if s.params.logprobs is not None]
        if all(s.params.temperature == 0 for s in seqs) and not wanted:
            return Sampled(mx.argmax(logits, axis=-1).astype(mx.int32))
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        tokens = self._draw(logprobs, seqs)
        if not wanted:
            return Sampled(tokens)
        chosen = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
        top = min(max(wanted), logprobs.shape[-1])
        if top == 0:
            return Sampled(tokens, chosen)
        ids = mx.argpartition(-logprobs, kth=top - 1, axis=-1)[:, :top]
        values = mx.take_along_axis(logprobs, ids, axis=-1)
        order = mx.argsort(-values, axis=-1)
        return Sampled(tokens, chosen, mx.take_along_axis(ids, order, axis=-1).astype(mx.int32),
                       mx.take_along_axis(values, order, axis=-1))

    def _processed(self, logits: mx.array, seqs: list[Sequence], inputs: mx.array | None) -> mx.array:
        """Each row's logits through its request's processors (rows without any as they are)."""
        procs = [self._processors_of(s) for s in seqs]
        if not any(procs):
            return logits
        rows = []
        for row, (seq, proc) in enumerate(zip(seqs, procs)):
            row_logits = logits[row : row + 1]
            if proc is not None:
                context = self._context(seq, proc.window, inputs[row : row + 1]
                                        if inputs is not None and row < inputs.size else None)
                for step in proc.steps:
                    row_logits = step(context, row_logits)
            rows.append(row_logits)
        return mx.concatenate(rows)

    def _processors_of(self, seq: Sequence) -> _Processors | None:
        if seq.id not in self._processors:
            self._processors[seq.id] = _processors(seq.params)
        return self._processors[seq.id]

    @staticmethod
    def _context(seq: Sequence, window: int, input_token: mx.array | None) -> mx.array:
        """The row's last ``window`` tokens. A decode row's latest token is its
        input, on the host or still on the device (``pending_tokens``)."""
        if input_token is None:
            return mx.array(seq.token_ids[max(len(seq) - window, 0):], dtype=mx.int32)
        known = len(seq) if seq.pending_tokens else len(seq) - 1
        head = seq.token_ids[max(known - (window - 1), 0):known]
        return mx.concatenate([mx.array(head, dtype=mx.int32), input_token.astype(mx.int32)])

    def _draw(self, logprobs: mx.array, seqs: list[Sequence]) -> mx.array:
        greedy = mx.argmax(logprobs, axis=-1).astype(mx.int32)
        if all(s.params.temperature == 0 for s in seqs):
            return greedy
        picks = []
        for row, seq in enumerate(seqs):
            p = seq.params
            if p.temperature == 0:
                picks.append(greedy[row])
                continue
            row_logprobs = _filtered(logprobs[row : row + 1], p, logprobs.shape[-1])
            key = None
            if p.seed is not None:
                state, key = mx.random.split(self._keys.get(seq.id, mx.random.key(p.seed)))
                self._keys[seq.id] = state
            picks.append(mx.random.categorical(row_logprobs * (1 / p.temperature), key=key)[0].astype(mx.int32))
        return mx.stack(picks)


def _filtered(row_logprobs: mx.array, p: SamplingParams, vocab: int) -> mx.array:
    """make_sampler's filters, in its order. The values reach the compiled
    functions as arrays where they can (top-p; min-p through its scale), since
    every distinct Python float would compile them anew."""
    if 0 < p.top_p < 1:
        row_logprobs = apply_top_p(row_logprobs, mx.array(p.top_p, dtype=mx.float32))
    if 0 < p.min_p < 1:
        scale = mx.array(-1 / math.log(p.min_p), dtype=mx.float32)
        row_logprobs = apply_min_p(row_logprobs * scale, MIN_P_BASE) / scale
    if 0 < p.top_k < vocab:
        row_logprobs = apply_top_k(row_logprobs, p.top_k)
    return row_logprobs
