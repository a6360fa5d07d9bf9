"""main's layer_halves.py as of 64814b8 (each layer traced on its own), kept for run 64's A/B.

A decoder layer traced by ``mx.compile`` for the decode steps that take
it: the two halves around its attention, or the whole layer.

On a GPU every op of a step costs the host twice: building it (Python) and
MLX's encoding of it in ``mx.async_eval``; a decode step of an 8B model is
host-bound at ~13 ops a layer. A traced function replays its ops from one
call (MLX keeps one trace per input shape), which measured ~3x cheaper to
build and ~1.4x cheaper to encode on an H200 host than the same ops called
one by one, with bit-identical results (the CUDA q/k/v kernel's in-place pool
store included).

- ``before``: the residual add folded into the input norm, the q/k/v matmul,
  the head split (q/k norms, rope; with the pool's arrays given, the ops may
  store K/V into their slots and return None for them);
- ``after``: o_proj, the residual add folded into the post-attention norm,
  the MLP;
- ``whole``: before, a traceable attention launch (the fused cascade: its
  layout's arrays are inputs, its launches' options fixed by its signature),
  after: one call a layer (the model passes the host-bound variant of the
  step's ops: their projections are the launches cheapest to encode,
  ``layer_ops.host_bound``). The page layout moves every few steps, but the
  layout's arrays keep their shapes and the launches their options, so the
  trace replays; an attention that is not traceable runs between the traced
  halves.

Traced where MLX encodes each op for a GPU (``MLXCEL_TRACED_LAYERS=off``
opts out, ``halves`` keeps the attention out of the traces, ``on`` traces on
the CPU too, where the attention's ops, not these, take the host's time), in
decode-only steps: their row count is bounded by
the batch, where a prefill chunk's length would leave a trace per length.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from enum import Enum
from functools import partial
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from mlxcel.kernels.kv_quant import Pages
from mlxcel.kernels.layer_ops import ComposedOps, PoolSlots

from mlxcel.engine.attention import TraceableAttention
from mlxcel.engine.config import parse_flag

TRACED_LAYERS_ENV = "MLXCEL_TRACED_LAYERS"
# Whole-layer traces kept per layer, one per attention signature: each batch
# size has its own (the launches' grids), and a server's concurrency moves
# over a few dozen of them; a trace costs the host milliseconds to make again
# (the halves' traces, one per row count, are never dropped either).
KEPT_WHOLE_TRACES = 64


class TracedLayers(str, Enum):
    """What of a decode layer runs traced."""

    OFF = "off"
    HALVES = "halves"     # the ops around the attention; the attention's launches called between them
    WHOLE = "whole"       # the whole layer where its attention is traceable (else its halves)


def traced_layers_wanted() -> TracedLayers:
    """The env (on / halves / off), else whole where the default device is a GPU and off elsewhere."""
    choice = os.environ.get(TRACED_LAYERS_ENV, "").strip().lower()
    if choice in (TracedLayers.HALVES, TracedLayers.WHOLE):
        return TracedLayers(choice)
    flag = parse_flag(choice)
    if flag is None:
        flag = mx.default_device().type == mx.DeviceType.gpu
    return TracedLayers.WHOLE if flag else TracedLayers.OFF


class LayerHalves:
    """One decoder layer's ops around its attention, plain or traced."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self._traced: dict[ComposedOps, tuple[Callable, Callable]] = {}
        self._whole: OrderedDict[tuple, Callable] = OrderedDict()

    def before(self, ops: ComposedOps, residual: mx.array | None, h: mx.array, positions: mx.array,
               slot_blocks: mx.array | None = None, slot_offsets: mx.array | None = None,
               k_pool: Pages | None = None, v_pool: Pages | None = None):
        """(the stream, q [T, Hq, D], k, v [T, Hkv, D]) from the stream's pair
        (model.py; ``residual`` None: h is the stream). With the pool's arrays
        the ops may store k and v themselves (then both None)."""
        slots = None if k_pool is None else PoolSlots(k_pool, v_pool, slot_blocks, slot_offsets)
        return self.layer.self_attn.project(ops, residual, h, self.layer.input_layernorm, positions, slots)

    def after(self, ops: ComposedOps, residual: mx.array, o: mx.array) -> tuple[mx.array | None, mx.array]:
        """The stream's pair (model.py) after o_proj of the attention's o [T, Hq, D] and the MLP."""
        layer = self.layer
        residual, h = layer.self_attn.output(ops, residual, o)
        return layer.mlp(ops, residual, h, layer.post_attention_layernorm)

    def whole(self, ops: ComposedOps, attention: TraceableAttention, residual: mx.array | None, h: mx.array,
              positions: mx.array, slot_blocks: mx.array, slot_offsets: mx.array, k_pool: Pages, v_pool: Pages,
              last_page_len: mx.array, arrays: tuple[mx.array, ...]) -> tuple[mx.array, mx.array]:
        """The layer: ``before`` storing K/V itself, ``attention`` over
        ``arrays``, ``after``."""
        residual, q, _, _ = self.before(ops, residual, h, positions, slot_blocks, slot_offsets, k_pool, v_pool)
        return self.after(ops, residual, attention.rebind(arrays)(q, k_pool, v_pool, last_page_len))

    def forget_traces(self) -> None:
        """Drop the traces: they hold the layer's weights as of their tracing (called when the weights change)."""
        self._traced.clear()
        self._whole.clear()

    def traced_whole(self, ops: ComposedOps, attention: TraceableAttention) -> Callable:
        """``whole`` traced for ``ops`` and attentions of ``attention``'s signature."""
        key = (ops, attention.signature)
        traced = self._whole.get(key)
        if traced is None:
            traced = self._whole[key] = mx.compile(partial(self.whole, ops, attention))
            if len(self._whole) > KEPT_WHOLE_TRACES:
                self._whole.popitem(last=False)
        else:
            self._whole.move_to_end(key)
        return traced

    def traced(self, ops: ComposedOps) -> tuple[Callable, Callable]:
        """``before`` and ``after`` traced for ``ops`` (the step's layer ops)."""
        pair = self._traced.get(ops)
        if pair is None:
            pair = self._traced[ops] = (mx.compile(partial(self.before, ops)), mx.compile(partial(self.after, ops)))
        return pair
