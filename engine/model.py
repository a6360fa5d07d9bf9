"""mlx-lm models on the paged pool.

A model directory loads through ``mlx_lm.load``; then each layer's attention
and MLP are replaced by modules that keep mlx-lm's weights, norms and rope
but run the engine's step:

- q/k/v (and gate/up) are one matmul each: their weights concatenated at
  load time (quantized ones too, when their quantization agrees), split after;
- every token of a step is a row of its own (``[T, 1]``), carrying its
  position as its rope offset (``mx.fast.rope`` takes a per-row offset
  array), so decode rows of different lengths and a prefill chunk share
  every matmul of one forward pass;
- each layer writes its new K/V into the pool and reads through the paged
  kernels, as the step's context (set once by the runner) says;
- the forward pass is the engine's own (``hidden_states``), so the residual
  add and the next norm are one op, and the q/k/v split, q/k norms and rope
  another (``mlxcel.kernels.layer_ops``: one launch each on CUDA).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from mlxcel.kernels import PagedCsrView
from mlxcel.kernels.layer_ops import COMPOSED, ComposedOps, HeadSplit, PoolSlots

from .attention import TraceableAttention, paged_prefill_attention
from .decode_plan import DecodePlan
from .layer_halves import LayerHalves, TracedLayers, shared_traces
from .pool import FLOAT_KV_DTYPES, BlockPool, PoolGeometry

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
    dtype: mx.Dtype      # the activations' dtype
    scale: float         # attention's softmax scale
    vocab_size: int

    def set_dtype(self, dtype: mx.Dtype) -> None:
        """Cast the float weights (quantized ones stay quantized); the activations follow."""
        self.model.set_dtype(dtype)
        prepare_linears(self.model)
        prepare_head(self.model)
        for layer in self.model.layers:
            layer.halves.forget_traces()
        attn = self.model.layers[0].self_attn
        self.dtype = activation_dtype(attn.qkv_proj if "qkv_proj" in attn else attn.q_proj)


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


def attention_heads(config: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a config.json's attention."""
    heads = config["num_attention_heads"]
    return heads, config.get("num_key_value_heads", heads), config.get("head_dim") or config["hidden_size"] // heads


def config_pool_geometry(path: Path, block_size: int, kv_dtype: str | None) -> PoolGeometry:
    """The pool geometry of the model directory at ``path``, read from its
    config.json before the model loads; ``kv_dtype`` None: the config's
    torch_dtype where it names a float one, else float32 (the larger pages)."""
    read_model_type(path)
    config = json.loads((path / "config.json").read_text())
    _, kv_heads, head_dim = attention_heads(config)
    own = config.get("torch_dtype")
    return PoolGeometry.named(config["num_hidden_layers"], kv_heads, head_dim, block_size,
                              kv_dtype or (own if own in FLOAT_KV_DTYPES else "float32"))


def load_model(path: str | Path, name: str | None = None, group: mx.distributed.Group | None = None) -> LoadedModel:
    """Load a local model directory through mlx_lm.load and put it on the
    pool. Never downloads: only existing directories are accepted. With a
    group of several ranks, this rank's shard: mlx-lm's own ``shard(group)``
    splits every layer's heads and MLP before the engine fuses q/k/v and
    gate/up, so each rank fuses its own slices (Hq/N query and Hkv/N KV heads)."""
    import mlx_lm

    path = Path(path).expanduser().resolve()
    model_type = read_model_type(path)
    if group is not None:
        check_shardable(path, group.size(), name)
    try:
        # Lazy when sharding: each rank reads only the slices it keeps.
        model, tokenizer = mlx_lm.load(str(path), lazy=group is not None)
    except Exception as err:  # mlx-lm raises many kinds on bad weights or tokenizers
        raise ModelLoadError(f"could not load {path}: {err}") from err
    if group is not None:
        model.shard(group)
    loaded = on_pool(model, tokenizer, name or path.name, path, model_type)
    mx.eval(model.parameters())   # what on_pool's layers leave lazy (embedding, last norm), on this thread
    return loaded


def check_shardable(path: Path, ranks: int, name: str | None = None) -> None:
    """Refuse, with the reason, a model that cannot be split over ``ranks``
    ranks: its family has no ``shard()`` in mlx-lm, or its heads, KV heads,
    MLP width or quantization groups do not divide."""
    import importlib

    model_type = read_model_type(path)
    name = name or path.name
    config = json.loads((path / "config.json").read_text())
    module = importlib.import_module(f"mlx_lm.models.{SUPPORTED_MODEL_TYPES[model_type]}")
    if not hasattr(module.Model, "shard"):
        raise ModelLoadError(f"mlx-lm cannot shard model type '{model_type}' (its Model has no shard())")
    heads, kv_heads, head_dim = attention_heads(config)
    widths = {"attention heads": heads, "KV heads": kv_heads, "MLP width": config["intermediate_size"]}
    for what, count in widths.items():
        if ranks < 1 or count % ranks:
            raise ModelLoadError(f"{name} cannot be split over {ranks} ranks: its {count} {what} "
                                 f"do not divide by {ranks}")
    group_size = (config.get("quantization") or {}).get("group_size")
    for what, width in (("attention output", heads * head_dim), ("MLP width", config["intermediate_size"])):
        if group_size and (width // ranks) % group_size:
            raise ModelLoadError(f"{name} cannot be split over {ranks} ranks: each rank's {what} slice "
                                 f"({width // ranks}) is not a whole number of quantization groups ({group_size})")


def on_pool(model: nn.Module, tokenizer: Any, name: str, path: Path, model_type: str) -> LoadedModel:
    """An mlx-lm model of a supported family with its layers made paged (in
    place: the model no longer runs with mlx-lm's own caches)."""
    if any(getattr(layer, "use_sliding", False) for layer in model.layers):
        raise ModelLoadError(f"{name} has sliding-window attention layers, which the paged pool does not serve")
    attn = model.layers[0].self_attn
    head_dim = attn.head_dim if hasattr(attn, "head_dim") else attn.q_proj.weight.shape[0] // attn.n_heads
    dtype = activation_dtype(attn.q_proj)
    for layer in model.layers:
        layer.self_attn = PagedAttention(layer.self_attn, head_dim)
        layer.mlp = FusedMLP(layer.mlp)
        mx.eval(layer.parameters())  # the concatenated weights now, so the separate ones are freed layer by layer
        prepare_linears(layer)
    prepare_head(model)
    for layer, traces in zip(model.layers, shared_traces(model.layers)):
        layer.halves = LayerHalves(layer, traces)
    return LoadedModel(model, tokenizer, name, path, model_type, len(model.layers),
                       attn.n_heads, attn.n_kv_heads, head_dim, dtype, attn.scale, model.args.vocab_size)


def activation_dtype(linear: nn.Module) -> mx.Dtype:
    # Quantized weights are integers; their activations run in the scales' dtype.
    weight = linear.weight
    return weight.dtype if mx.issubdtype(weight.dtype, mx.floating) else linear.scales.dtype


ARRAY_KEYS = ("weight", "scales", "biases", "bias")


def fuse_linears(parts: list[nn.Module]) -> nn.Module | None:
    """One linear layer computing ``parts``' outputs side by side, or None
    where they cannot be one (quantized differently, say)."""
    first = parts[0]
    def settings(m: nn.Module) -> tuple:
        return (type(m), getattr(m, "group_size", None), getattr(m, "bits", None), getattr(m, "mode", None),
                tuple(k for k in ARRAY_KEYS if isinstance(m.get(k), mx.array)))

    if any(settings(p) != settings(first) for p in parts):
        return None
    fused = copy.copy(first)
    for key in settings(first)[-1]:
        fused[key] = mx.concatenate([p[key] for p in parts])
    return fused


def on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu


def transposed_rows(weight: mx.array) -> tuple[mx.array, mx.array]:
    """(the weight, its transpose), evaluated; on the CPU the transpose is stored row-major and the weight is a
    view of it. BLAS packs a product's weight at every call, and it packed a transposed view (the weight's own
    rows) 1.3-1.6x slower than a row-major transpose, with OpenBLAS and the reference BLAS alike (a decode row
    times SmolLM2's tied 49152 x 576 head: 18.8 ms against 11.6); the memory is the same."""
    transposed = weight.T
    if on_cpu():
        transposed = mx.contiguous(transposed)
        weight = transposed.T
    mx.eval(weight, transposed)
    return weight, transposed


class Linear(nn.Module):
    """nn.Linear whose weight's transpose is an evaluated view, made once
    (``prepare``; on the CPU the transpose is the stored array and the weight
    its view, ``transposed_rows``): nn.Linear adds a transpose to the graph at
    every call, one more op a step for the host to build and for MLX to encode
    (four a layer); the matmul is the same. A weight replaced since is
    transposed per call. On Hopper a weight the TMA-fed product serves
    (``cuda_matmul.takes_tensor_map``: gate/up's) also gets its tensor map,
    made once as the transpose is."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        if "bias" in linear:
            self.bias = linear.bias
        self._transposed: tuple[mx.array, mx.array] | None = None   # (the weight, its evaluated transpose)
        self._tensor_map: tuple[mx.array, mx.array] | None = None   # (the weight, its TMA tensor map)

    def prepare(self) -> None:
        self.weight, transposed = transposed_rows(self.weight)
        self.__dict__["_transposed"] = (self.weight, transposed)   # an attribute, not a parameter
        if not on_cpu():
            from mlxcel.kernels import cuda_matmul
            tensor_map = cuda_matmul.weight_map(self.weight) if cuda_matmul.takes_tensor_map(self.weight) else None
            if tensor_map is not None:
                self.__dict__["_tensor_map"] = (self.weight, tensor_map)

    def tensor_map(self) -> mx.array | None:
        prepared = self._tensor_map
        return prepared[1] if prepared is not None and prepared[0] is self.weight else None

    def transposed(self) -> mx.array:
        prepared = self._transposed
        return prepared[1] if prepared is not None and prepared[0] is self.weight else self.weight.T

    def __call__(self, x: mx.array, ops: ComposedOps = COMPOSED) -> mx.array:
        if "bias" in self:
            return mx.addmm(self.bias, x, self.transposed())
        return ops.matmul(x, self.weight, self.transposed())


def project(ops: ComposedOps, linear: nn.Module, x: mx.array) -> mx.array:
    """A layer's projection of x: the engine's ``Linear`` through the step's ops, any other layer (quantized;
    a tensor-parallel shard, whose call includes its collective) as it is."""
    return linear(x, ops) if isinstance(linear, Linear) else linear(x)


# The residual stream between a layer's ops is a pair (residual, h) whose sum
# it is, the add left to the next norm (add_rms_norm folds it in); residual
# None: h is the stream itself (the embedding, or a product whose launch added
# the residual: where the ops fold it, ``project_add``).

def folds(ops: ComposedOps, linear: nn.Module, x: mx.array) -> bool:
    """Whether the ops fold the norm before, or the add after, this projection of x into its launch."""
    return isinstance(linear, Linear) and "bias" not in linear and ops.folds(x, linear.weight)


def norm_project(ops: ComposedOps, residual: mx.array | None, h: mx.array, norm: nn.Module,
                 linears: tuple[nn.Module, ...]) -> tuple[mx.array, list[mx.array]]:
    """(the stream, each linear's projection of its norm)."""
    if residual is None and all(folds(ops, linear, h) for linear in linears):
        return h, [ops.normed_matmul(h, norm.weight, norm.eps, linear.weight, linear.transposed())
                   for linear in linears]
    stream, x = (h, norm(h)) if residual is None else ops.add_rms_norm(residual, h, norm.weight, norm.eps)
    return stream, [project(ops, linear, x) for linear in linears]


def project_add(ops: ComposedOps, linear: nn.Module, x: mx.array,
                residual: mx.array) -> tuple[mx.array | None, mx.array]:
    """The stream once linear(x) joins ``residual``: (None, the sum) where the ops fold the add into the
    product's launch, else (residual, the product)."""
    if folds(ops, linear, x):
        return None, ops.matmul_add(x, linear.weight, linear.transposed(), residual)
    return residual, project(ops, linear, x)


def engine_linear(linear: nn.Module) -> nn.Module:
    """A float nn.Linear as the engine's ``Linear``; other layers (quantized: their matmul takes the weight as
    stored) as they are."""
    return Linear(linear) if type(linear) is nn.Linear else linear


def prepare_linears(model: nn.Module) -> None:
    """Transpose every engine ``Linear``'s weight once, after the weights are final."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.prepare()


def prepare_head(model: nn.Module) -> None:
    """The output head's weight laid out as the engine's Linears' (``transposed_rows``): an untied float head
    becomes one; a tied float embedding table is stored transposed on the CPU (its lookups read a view)."""
    if not model.args.tie_word_embeddings:
        model.lm_head = engine_linear(model.lm_head)
        if isinstance(model.lm_head, Linear):
            model.lm_head.prepare()
        return
    embed = model.model.embed_tokens
    if type(embed) is nn.Embedding and on_cpu():
        embed.weight, _ = transposed_rows(embed.weight)


class PagedAttention(nn.Module):
    """mlx-lm's Llama/Mistral/Qwen2/Qwen3 attention on the pool."""

    def __init__(self, attn: nn.Module, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = attn.n_heads, attn.n_kv_heads, head_dim
        self.scale = attn.scale
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        fused = fuse_linears(projections)
        if fused is not None:
            self.qkv_proj = engine_linear(fused)
        else:
            self.q_proj, self.k_proj, self.v_proj = map(engine_linear, projections)
        self.o_proj = engine_linear(attn.o_proj)
        if "q_norm" in attn:  # Qwen3 normalizes each head's q and k
            self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.heads = HeadSplit(self.n_heads, self.n_kv_heads, head_dim, attn.rope,
                               self.get("q_norm"), self.get("k_norm"))

    def linears(self) -> tuple[nn.Module, ...]:
        """The projections of the stream: q/k/v fused, or each."""
        return (self.qkv_proj,) if "qkv_proj" in self else (self.q_proj, self.k_proj, self.v_proj)

    def project(self, ops: ComposedOps, residual: mx.array | None, h: mx.array, norm: nn.Module,
                positions: mx.array, slots: PoolSlots | None, rope: tuple[mx.array, mx.array] | None = None):
        """(the stream, q [T, Hq, D], k and v [T, Hkv, D]) from the stream's pair (residual, h [T, 1, hidden])
        through ``norm``, q and k normalized and roped at ``positions`` (``rope``: the ops' tables of them);
        with ``slots`` the ops may store k and v into the pool themselves (then both None)."""
        stream, projections = norm_project(ops, residual, h, norm, self.linears())
        if len(projections) == 1:
            return (stream, *ops.split_heads(self.heads, projections[0], positions, slots, rope))
        return (stream, *self.heads.rotate(*projections, positions))

    def output(self, ops: ComposedOps, residual: mx.array, o: mx.array) -> tuple[mx.array | None, mx.array]:
        """The stream's pair once o_proj of the attention's o [T, Hq, D] joins ``residual``."""
        return project_add(ops, self.o_proj, o.reshape(o.shape[0], 1, self.n_heads * self.head_dim), residual)


class FusedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up one matmul."""

    def linears(self) -> tuple[nn.Module, ...]:
        up = (self.gate_up_proj,) if "gate_up_proj" in self else (self.gate_proj, self.up_proj)
        return (*up, self.down_proj)

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        parts = [mlp.gate_proj, mlp.up_proj]
        fused = fuse_linears(parts)
        if fused is not None:
            self.gate_up_proj = engine_linear(fused)
            self.hidden = mlp.gate_proj.weight.shape[0]
        else:
            self.gate_proj, self.up_proj = map(engine_linear, parts)
        self.down_proj = engine_linear(mlp.down_proj)

    def __call__(self, ops: ComposedOps, residual: mx.array | None, h: mx.array,
                 norm: nn.Module) -> tuple[mx.array | None, mx.array]:
        """The stream's pair once the MLP of its norm joins it."""
        if "gate_up_proj" in self and residual is None and folds(ops, self.gate_up_proj, h):
            linear = self.gate_up_proj
            stream, activation = h, ops.normed_swiglu(h, norm.weight, norm.eps, linear.weight, linear.transposed(),
                                                      linear.tensor_map())
        elif "gate_up_proj" in self:
            stream, (gate_up,) = norm_project(ops, residual, h, norm, (self.gate_up_proj,))
            activation = swiglu(*mx.split(gate_up, [self.hidden], axis=-1))
        else:
            stream, (gate, up) = norm_project(ops, residual, h, norm, (self.gate_proj, self.up_proj))
            activation = swiglu(gate, up)
        return project_add(ops, self.down_proj, activation, stream)


@dataclass
class StepContext:
    """What every layer of one forward pass reads, set once by the runner.

    Tokens are rows: the first ``decode_rows`` are decode rows (one per
    sequence, attending through the step's decode plan), the rest one
    sequence's prefill chunk (causal, through ``prefill_csr``)."""

    pool: BlockPool
    positions: mx.array     # [T] each token's position: its rope offset
    slot_blocks: mx.array   # [T] pool slot each token's K/V goes to
    slot_offsets: mx.array
    decode_rows: int
    decode_csr: PagedCsrView | None = None
    plan: DecodePlan | None = None
    prefill_csr: PagedCsrView | None = None
    ops: ComposedOps = COMPOSED    # the layer ops' implementation for this step
    store_in_kernel: bool = False  # the q/k/v op writes K/V into the pool itself (layer_ops says when)
    # The last layer's q where its q/k/v op stored K/V: what the step must evaluate to write every layer's
    # K/V (a middle prefill chunk samples nothing, and the pool's arrays are not the stores' outputs).
    stored: mx.array | None = None
    traced: TracedLayers = TracedLayers.OFF   # what of each layer runs traced (layer_halves says when)

    def traced_attention(self) -> TraceableAttention | None:
        """The decode plan's attention where each layer runs as one trace: a
        traced decode-only step with a traceable plan; else None."""
        if not (self.traced == TracedLayers.WHOLE and self.plan is not None and self.prefill_csr is None):
            return None
        return self.plan.traceable

    def attend(self, layer: int, q: mx.array, scale: float) -> mx.array:
        """q [T, Hq, D] -> o [T, Hq, D] in q's dtype."""
        k_pool, v_pool = self.pool.keys[layer], self.pool.values[layer]
        parts = []
        if self.decode_rows:
            decode_q = q if self.prefill_csr is None else q[: self.decode_rows]
            parts.append(self.plan.attend(decode_q, k_pool, v_pool, self.decode_csr.last_page_len))
        if self.prefill_csr is not None:
            chunk = q[self.decode_rows:].transpose(1, 0, 2)[None]                    # [1, Hq, L, D]
            o = paged_prefill_attention(chunk, k_pool, v_pool, self.prefill_csr, scale=scale,
                                        stored_with=q if self.store_in_kernel else None)
            parts.append(o[0].transpose(1, 0, 2))
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)


def hidden_states(model: nn.Module, tokens: mx.array, ctx: StepContext) -> mx.array:
    """The final norm's output [T, 1, hidden]: mlx-lm's pre-norm decoder
    (Llama, Mistral, Qwen2 and Qwen3 alike) with each residual add folded
    into the norm that follows it, each layer traced where the step says
    (``layer_halves``: whole where its attention is traceable, else its
    halves)."""
    inner, ops = model.model, ctx.ops
    h = inner.embed_tokens(tokens)
    residual = None
    whole = ctx.traced_attention()
    arrays = whole.arrays() if whole is not None else ()
    # The fused cascade reads a shared span once for all its rows, so the host
    # sets such a step's pace: its projections take the kernels cheapest to launch.
    whole_ops = ops.host_bound() if whole is not None else None
    for index, layer in enumerate(inner.layers):
        halves: LayerHalves = layer.halves
        k_pool, v_pool = ctx.pool.keys[index], ctx.pool.values[index]
        if whole is not None:
            rope = whole_ops.step_rope(layer.self_attn.heads, ctx.positions, h.dtype)
            try:
                residual, h, *stored = halves.traced_whole(whole_ops, whole, ctx.store_in_kernel)(
                    residual, h, ctx.positions, ctx.slot_blocks, ctx.slot_offsets, k_pool, v_pool,
                    ctx.decode_csr.last_page_len, arrays, rope)
                if stored:
                    ctx.pool.replace(index, *stored)
                continue
            except Exception as error:  # a launch that cannot be traced: flat serves the rest of the step
                ctx.plan.fail(error)
                whole = None
        before, after = (halves.traced(ops) if ctx.traced != TracedLayers.OFF
                         else (partial(halves.before, ops), partial(halves.after, ops)))
        pools = (k_pool, v_pool) if ctx.store_in_kernel else (None, None)
        rope = ops.step_rope(layer.self_attn.heads, ctx.positions, h.dtype)
        residual, q, k, v = before(residual, h, ctx.positions, ctx.slot_blocks, ctx.slot_offsets, *pools, rope)
        if k is not None:     # else the ops stored them (layer_ops: the pool written in place)
            ctx.pool.write(index, ctx.slot_blocks, ctx.slot_offsets, k, v)
        else:
            ctx.stored = q
        residual, h = after(residual, ctx.attend(index, q, layer.self_attn.scale))
    return inner.norm(h) if residual is None else ops.add_rms_norm(residual, h, inner.norm.weight, inner.norm.eps)[1]


def build_projection_kernels(model: nn.Module, ops: ComposedOps, rows: list[int]) -> bool:
    """One layer's projections through ``ops`` once at each row count, evaluated: kernels that are an
    instance of their own for a row count (``ops.instance_rows``) compile now, not in the first step that
    meets them. Only a model of the engine's float ``Linear``s: others run MLX's own kernels (and a sharded
    one's projections hold collectives). Whether it ran them."""
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if not rows or not all(isinstance(linear, Linear) for linear in (*attn.linears(), *mlp.linears())):
        return False
    hidden, dtype = layer.input_layernorm.weight.shape[0], attn.o_proj.weight.dtype
    products = []
    for count in rows:
        h = mx.zeros((count, 1, hidden), dtype)
        _, projections = norm_project(ops, None, h, layer.input_layernorm, attn.linears())
        residual, h = attn.output(ops, h, mx.zeros((count, attn.n_heads, attn.head_dim), dtype))
        stream = mlp(ops, residual, h, layer.post_attention_layernorm)
        products += [*projections, *(part for part in stream if part is not None)]
    mx.eval(products)
    return True


def output_logits(model: nn.Module, tokens: mx.array, ctx: StepContext, rows: mx.array | None) -> mx.array:
    """Logits [len(rows), vocab] of the given token rows (all when None): the
    model's head runs only on the rows that sample."""
    return head_logits(model, final_hidden(model, tokens, ctx, rows))


def final_hidden(model: nn.Module, tokens: mx.array, ctx: StepContext, rows: mx.array | None) -> mx.array:
    """The last norm's output [len(rows), hidden] (all rows when None): what
    a tensor-parallel rank that samples nothing evaluates (every layer's
    collectives are upstream of it)."""
    hidden = hidden_states(model, tokens, ctx)[:, 0]
    return hidden if rows is None else hidden[rows]


def head_logits(model: nn.Module, hidden: mx.array) -> mx.array:
    if model.args.tie_word_embeddings:
        return model.model.embed_tokens.as_linear(hidden)
    return model.lm_head(hidden)
