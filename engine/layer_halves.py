"""A decoder layer traced by ``mx.compile`` for the decode steps that take
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
- ``whole``: before, the K/V store where the ops leave it to the pool's
  scatters (the pool's new arrays are then outputs), a traceable attention
  launch (the fused cascade; on the CPU the portable flat launch and
  composed cascade: its layout's arrays are inputs, what it bakes in fixed
  by its signature), after: one call a layer (the model passes the
  host-bound variant of the step's ops: their projections are the launches
  cheapest to encode, ``layer_ops.host_bound``). The page layout moves every few steps, but the
  layout's arrays keep their shapes and the launches their options, so the
  trace replays (the portable launches' tile width grows a page at a time:
  a new trace each time the longest row crosses a page); an attention that
  is not traceable (a GPU's flat launch) runs between the traced halves.

Layers alike (``structure``: the same modules, settings and weight shapes,
every layer of the supported families) share their traces, each layer's
weights passed as the trace's inputs: making a trace costs the host ~0.5 ms
at 8B, and with a trace a layer every step that met a new attention
signature (each change of batch size) paid it 36 times, ~20 ms more a step.

Traced by default (``MLXCEL_TRACED_LAYERS=off`` opts out, ``halves`` keeps
the attention out of the traces), in decode-only steps: their row count is
bounded by the batch, where a prefill chunk's length would leave a trace per
length. On the CPU a trace's fused kernels are C++ built by the system
compiler the first time a machine meets them (MLX keeps them under its temp
folder): ~2 s more on a new machine's first decode steps.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from enum import Enum
from functools import partial
from typing import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlxcel.kernels.kv_quant import Pages, store
from mlxcel.kernels.layer_ops import ComposedOps, PoolSlots

from .attention import TraceableAttention
from .config import parse_flag

TRACED_LAYERS_ENV = "MLXCEL_TRACED_LAYERS"
# Whole-layer traces kept, one per attention signature: each batch size has
# its own (the launches' grids), and a server's concurrency moves over a few
# dozen of them; a trace costs the host milliseconds to make again (the
# halves' traces, one per row count, are never dropped either).
KEPT_WHOLE_TRACES = 64


class TracedLayers(str, Enum):
    """What of a decode layer runs traced."""

    OFF = "off"
    HALVES = "halves"     # the ops around the attention; the attention's launches called between them
    WHOLE = "whole"       # the whole layer where its attention is traceable (else its halves)


def traced_layers_wanted() -> TracedLayers:
    """The env (on / halves / off), else whole."""
    choice = os.environ.get(TRACED_LAYERS_ENV, "").strip().lower()
    if choice in (TracedLayers.HALVES, TracedLayers.WHOLE):
        return TracedLayers(choice)
    return TracedLayers.OFF if parse_flag(choice) is False else TracedLayers.WHOLE


def before(layer: nn.Module, ops: ComposedOps, residual: mx.array | None, h: mx.array, positions: mx.array,
           slot_blocks: mx.array | None = None, slot_offsets: mx.array | None = None,
           k_pool: Pages | None = None, v_pool: Pages | None = None, rope: tuple[mx.array, mx.array] | None = None):
    """(the stream, q [T, Hq, D], k, v [T, Hkv, D]) from the stream's pair
    (model.py; ``residual`` None: h is the stream). With the pool's arrays
    the ops may store k and v themselves (then both None); ``rope``: the
    ops' tables of the step's positions (``step_rope``)."""
    slots = None if k_pool is None else PoolSlots(k_pool, v_pool, slot_blocks, slot_offsets)
    return layer.self_attn.project(ops, residual, h, layer.input_layernorm, positions, slots, rope)


def after(layer: nn.Module, ops: ComposedOps, residual: mx.array, o: mx.array) -> tuple[mx.array | None, mx.array]:
    """The stream's pair (model.py) after o_proj of the attention's o [T, Hq, D] and the MLP."""
    residual, h = layer.self_attn.output(ops, residual, o)
    return layer.mlp(ops, residual, h, layer.post_attention_layernorm)


def whole(layer: nn.Module, ops: ComposedOps, attention: TraceableAttention, in_kernel: bool,
          residual: mx.array | None, h: mx.array, positions: mx.array, slot_blocks: mx.array,
          slot_offsets: mx.array, k_pool: Pages, v_pool: Pages, last_page_len: mx.array,
          arrays: tuple[mx.array, ...], rope: tuple[mx.array, mx.array] | None = None) -> tuple:
    """The layer: ``before``, ``attention`` over ``arrays``, ``after``: the stream's pair, and where K/V are
    not stored by the ops (``in_kernel``: the step lets them, StepContext.store_in_kernel) but by the pool's
    scatters (``store``), the pool's arrays after them."""
    pools = (k_pool, v_pool) if in_kernel else (None, None)
    residual, q, k, v = before(layer, ops, residual, h, positions, slot_blocks, slot_offsets, *pools, rope)
    if k is not None:
        store(k_pool, slot_blocks, slot_offsets, k)
        store(v_pool, slot_blocks, slot_offsets, v)
    stream = after(layer, ops, residual, attention.rebind(arrays)(q, k_pool, v_pool, last_page_len))
    return stream if k is None else (*stream, k_pool, v_pool)


def transposing_linears(layer: nn.Module) -> list[nn.Module]:
    """The layer's engine Linears (model.py), whose evaluated transposes a trace takes beside the weights."""
    return [module for module in layer.modules() if hasattr(module, "transposed")]


def mapped_linears(layer: nn.Module) -> list[nn.Module]:
    """The layer's engine Linears that carry a TMA tensor map (model.Linear), which a trace takes too."""
    return [linear for linear in transposing_linears(layer) if linear.tensor_map() is not None]


def layer_weights(layer: nn.Module) -> list[mx.array]:
    """What a shared trace takes as the layer's inputs: its parameters (``tree_flatten``'s order), then each
    engine Linear's transpose, then each tensor map."""
    return [array for _, array in tree_flatten(layer.parameters())] + [
        linear.transposed() for linear in transposing_linears(layer)] + [
        linear.tensor_map() for linear in mapped_linears(layer)]


def scalar_settings(obj: object) -> tuple:
    return tuple(sorted((key, value) for key, value in vars(obj).items()
                        if isinstance(value, (bool, int, float, str, type(None)))))


def structure(layer: nn.Module) -> tuple:
    """What a trace of the layer holds besides the inputs ``layer_weights`` lists: each module's type and
    settings (norms' eps, head counts, quantization), the weights' names, shapes and dtypes, and the rope
    (its settings and frequencies). Layers of one structure trace alike."""
    modules = tuple((name, type(module).__name__, scalar_settings(module)) for name, module in layer.named_modules())
    weights = tuple((name, array.shape, array.dtype) for name, array in tree_flatten(layer.parameters()))
    weights += tuple(len(mapped_linears(layer)) * ["tensor map"])
    rope = layer.self_attn.heads.rope
    rope_arrays = [np.asarray(array).tolist() for _, array in tree_flatten(dict(rope))]
    frequencies = layer.self_attn.heads.frequencies
    if frequencies is not None:
        rope_arrays.append(np.asarray(frequencies[0]).tolist())
    return modules, weights, type(rope).__name__, scalar_settings(rope), str(rope_arrays)


@contextmanager
def weights_bound(layer: nn.Module, weights: list[mx.array]) -> Iterator[None]:
    """The layer running on ``weights`` (``layer_weights``' order) instead of its own, while a trace is made."""
    names = [name for name, _ in tree_flatten(layer.parameters())]
    linears, mapped = transposing_linears(layer), mapped_linears(layer)
    own = layer_weights(layer)

    def bind(arrays: list[mx.array]) -> None:
        layer.update(tree_unflatten(list(zip(names, arrays[: len(names)]))))
        for linear, transposed in zip(linears, arrays[len(names):]):
            linear.__dict__["_transposed"] = (linear.weight, transposed)
        for linear, tensor_map in zip(mapped, arrays[len(names) + len(linears):]):
            linear.__dict__["_tensor_map"] = (linear.weight, tensor_map)

    bind(weights)
    try:
        yield
    finally:
        bind(own)


class LayerTraces:
    """The traces shared by layers of one structure: the halves per step's ops, the whole layer per ops and
    attention signature. A trace runs ``template`` (one of the layers) with the weights it is given."""

    def __init__(self, template: nn.Module) -> None:
        self.template = template
        self._halves: dict[ComposedOps, tuple[Callable, Callable]] = {}
        self._whole: OrderedDict[tuple, Callable] = OrderedDict()

    def __len__(self) -> int:
        return len(self._halves) + len(self._whole)

    def clear(self) -> None:
        self._halves.clear()
        self._whole.clear()

    def _run(self, step: Callable, fixed: tuple, weights: list[mx.array], *args):
        with weights_bound(self.template, weights):
            return step(self.template, *fixed, *args)

    def halves(self, ops: ComposedOps) -> tuple[Callable, Callable]:
        """``before`` and ``after`` traced for ``ops``, each taking a layer's weights first."""
        pair = self._halves.get(ops)
        if pair is None:
            pair = self._halves[ops] = (mx.compile(partial(self._run, before, (ops,))),
                                        mx.compile(partial(self._run, after, (ops,))))
        return pair

    def whole(self, ops: ComposedOps, attention: TraceableAttention, in_kernel: bool) -> Callable:
        """``whole`` traced for ``ops``, attentions of ``attention``'s signature and where K/V are stored
        (``in_kernel``), taking a layer's weights first."""
        key = (ops, attention.signature, in_kernel)
        traced = self._whole.get(key)
        if traced is None:
            traced = self._whole[key] = mx.compile(partial(self._run, whole, (ops, attention, in_kernel)))
            if len(self._whole) > KEPT_WHOLE_TRACES:
                self._whole.popitem(last=False)
        else:
            self._whole.move_to_end(key)
        return traced


def shared_traces(layers: list[nn.Module]) -> list[LayerTraces]:
    """Each layer's traces, shared by the layers of one structure (``structure``)."""
    groups: dict[tuple, LayerTraces] = {}
    return [groups.setdefault(structure(layer), LayerTraces(layer)) for layer in layers]


class LayerHalves:
    """One decoder layer's ops around its attention, plain or traced (the traces shared with its like)."""

    def __init__(self, layer: nn.Module, traces: LayerTraces) -> None:
        self.layer = layer
        self.traces = traces
        self._weights: list[mx.array] | None = None

    def weights(self) -> list[mx.array]:
        if self._weights is None:
            self._weights = layer_weights(self.layer)
        return self._weights

    def before(self, ops: ComposedOps, *args):
        return before(self.layer, ops, *args)

    def after(self, ops: ComposedOps, residual: mx.array, o: mx.array) -> tuple[mx.array | None, mx.array]:
        return after(self.layer, ops, residual, o)

    def forget_traces(self) -> None:
        """Drop the traces and the weights they were given (called when the weights change)."""
        self.traces.clear()
        self._weights = None

    def traced_whole(self, ops: ComposedOps, attention: TraceableAttention, in_kernel: bool) -> Callable:
        """``whole`` traced for ``ops``, attentions of ``attention``'s signature and ``in_kernel``, on this
        layer."""
        return partial(self.traces.whole(ops, attention, in_kernel), self.weights())

    def traced(self, ops: ComposedOps) -> tuple[Callable, Callable]:
        """``before`` and ``after`` traced for ``ops`` (the step's layer ops), on this layer."""
        weights = self.weights()
        traced_before, traced_after = self.traces.halves(ops)
        return partial(traced_before, weights), partial(traced_after, weights)
