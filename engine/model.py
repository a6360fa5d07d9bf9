"""mlx-lm models on the paged pool.

mlx-lm attention modules call ``self.rope(x, offset=cache.offset)``, then
``cache.update_and_fetch(keys, values)``, then their module-level
``scaled_dot_product_attention(q, k, v, cache=cache, ...)``. A pool-backed
cache object per layer fits that protocol: ``offset`` carries each row's
position (``mx.fast.rope`` takes a per-row offset array), ``update_and_fetch``
writes the new K/V into the pool, and the module's attention function is
wrapped so that, given such a cache, it reads through the paged kernels.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel.kernels import PagedCsrView

from .attention import paged_decode_attention, paged_prefill_attention
from .config import CascadeConfig
from .metrics import EngineMetrics
from .pool import BlockPool

# model_type (as in config.json) -> the mlx-lm module implementing it
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


class ModelLoadError(ValueError):
    """A model directory that cannot be served; the message says why."""


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx_lm's TokenizerWrapper
    name: str
    path: Path
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


def read_model_type(path: Path) -> str:
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} holds no config.json: not a model directory")
    try:
        model_type = json.loads(config_file.read_text())["model_type"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ModelLoadError(f"{config_file} is malformed: {err}") from None
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise ModelLoadError(f"model type '{model_type}' is not supported (supported: {supported})")
    return model_type


def load_model(path: str | Path, name: str | None = None) -> LoadedModel:
    """Load a local model directory through mlx_lm.load and route its attention
    through the pool. Never downloads: only existing directories are accepted."""
    import mlx_lm

    path = Path(path).expanduser().resolve()
    model_type = read_model_type(path)
    try:
        model, tokenizer = mlx_lm.load(str(path))
    except Exception as err:  # mlx-lm raises many kinds on bad weights or tokenizers
        raise ModelLoadError(f"could not load {path}: {err}") from err
    install_paged_attention(sys.modules[type(model).__module__])
    attn = model.layers[0].self_attn
    head_dim = attn.head_dim if hasattr(attn, "head_dim") else attn.q_proj.weight.shape[0] // attn.n_heads
    return LoadedModel(model, tokenizer, name or path.name, path, model_type, len(model.layers),
                       attn.n_heads, attn.n_kv_heads, head_dim)


def install_paged_attention(module) -> None:
    """Wrap a model module's attention function once; other caches pass through."""
    original = module.scaled_dot_product_attention
    if getattr(original, "paged", False):
        return

    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, PagedLayerCache):
            return cache.attend(queries, scale)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.paged = True
    module.scaled_dot_product_attention = scaled_dot_product_attention


@dataclass
class StepContext:
    """What every layer of one forward pass shares: the page tables and the
    pool slots the new tokens go to."""

    pool: BlockPool
    csr: PagedCsrView
    slot_blocks: mx.array  # [rows * new tokens], row-major
    slot_offsets: mx.array
    decode: bool  # one new token per row; otherwise one row's prefill chunk
    cascade: CascadeConfig
    metrics: EngineMetrics | None


class PagedLayerCache:
    """The mlx-lm cache protocol for one layer, backed by the block pool."""

    def __init__(self, ctx: StepContext, layer: int, offset: mx.array | int) -> None:
        self.ctx = ctx
        self.layer = layer
        self.offset = offset

    def make_mask(self, *args, **kwargs):
        return None  # the paged kernels mask by page table

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        b, h, n, d = keys.shape
        flat_k = keys.transpose(0, 2, 1, 3).reshape(b * n, h, d)
        flat_v = values.transpose(0, 2, 1, 3).reshape(b * n, h, d)
        self.ctx.pool.write(self.layer, self.ctx.slot_blocks, self.ctx.slot_offsets, flat_k, flat_v)
        return keys, values

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        ctx, pool = self.ctx, self.ctx.pool
        k_pool, v_pool = pool.keys[self.layer], pool.values[self.layer]
        if ctx.decode:
            out = paged_decode_attention(queries[:, :, 0, :], k_pool, v_pool, ctx.csr, scale=scale,
                                         config=ctx.cascade, metrics=ctx.metrics)
            return out[:, :, None, :]
        return paged_prefill_attention(queries, k_pool, v_pool, ctx.csr, scale=scale, metrics=ctx.metrics)


def make_layer_caches(ctx: StepContext, num_layers: int, offset: mx.array | int) -> list[PagedLayerCache]:
    return [PagedLayerCache(ctx, layer, offset) for layer in range(num_layers)]
