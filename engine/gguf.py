"""A llama.cpp GGUF file converted to a model directory that ``mlx_lm.load`` accepts.

MLX reads the file itself (``mx.load(path, return_metadata=True)``): float
tensors as they are, Q4_0/Q4_1/Q8_0 tensors as MLX's affine quantization
(weight, scales, biases; group size 32). This module maps llama.cpp's names to
Hugging Face's, dequantizes to a float dtype, undoes the row permutation
llama.cpp's converter applies to q and k, and rebuilds the byte-level BPE
tokenizer, the config and the chat template from the metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .model_cache import write_json

ARCHITECTURES = {"llama": "LlamaForCausalLM"}
DTYPES = ("float32", "bfloat16", "float16")
READABLE_TYPES = "F32, F16, Q4_0, Q4_1 and Q8_0"
GROUP_SIZE = 32  # every quantized type MLX reads has 32-value blocks
CONTROL_TOKEN = 3  # llama.cpp's token type for special tokens

# llama.cpp pre-tokenizer name -> the Hugging Face pre-tokenizers it matches
PRE_TOKENIZERS = {
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]),
}

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFError(ValueError):
    """A GGUF file this converter cannot turn into a model; the message says why."""


def convert_gguf(path: Path, out: Path, dtype: str = "float32",
                 progress: Callable[[int, int], None] | None = None) -> None:
    """Write the model of the GGUF file ``path`` into the folder ``out`` with
    float weights of ``dtype``; ``progress(done, total)`` follows the tensors."""
    if dtype not in DTYPES:
        raise GGUFError(f"dtype {dtype!r} is not supported (choose one of {', '.join(DTYPES)})")
    path, out = Path(path), Path(out)
    tensors, meta = read_gguf(path)
    config = model_config(meta, path.name)
    tokenizer = build_tokenizer(meta, path.name)
    weights = convert_tensors(tensors, config, getattr(mx, dtype), progress)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    config["torch_dtype"] = dtype
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(meta))
    write_json(out / "generation_config.json", {"bos_token_id": config["bos_token_id"],
                                                "eos_token_id": [config["eos_token_id"]]})
    write_json(out / "config.json", config)


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict]:
    try:
        return mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as err:
        reason = str(err).replace("[load_gguf] ", "")
        if "gguf_tensor_to_f16" in reason:  # MLX's words for a tensor type it does not decode
            reason = f"it holds a tensor type MLX cannot read (MLX reads {READABLE_TYPES})"
        raise GGUFError(f"cannot read {path}: {reason}") from None


# --- metadata ------------------------------------------------------------------


def _value(meta: dict, key: str, source: str, default=None):
    """A metadata value as a Python scalar (MLX gives numbers as 0-d arrays)."""
    value = meta.get(key, default)
    if value is None:
        raise GGUFError(f"{source}: metadata key {key!r} is missing")
    return value.item() if isinstance(value, mx.array) and value.ndim == 0 else value


def model_config(meta: dict, source: str) -> dict:
    """config.json (Hugging Face names, as mlx-lm's ModelArgs reads them) from the metadata."""
    arch = _value(meta, "general.architecture", source)
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{source}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFError(f"{source}: RoPE scaling {scaling!r} is not supported")
    get = lambda key, default=None: _value(meta, f"{arch}.{key}", source, default)  # noqa: E731
    hidden, heads = get("embedding_length"), get("attention.head_count")
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_scaling": None,
        "max_position_embeddings": get("context_length"),
        "vocab_size": get("vocab_size", len(_value(meta, "tokenizer.ggml.tokens", source))),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _value(meta, "tokenizer.ggml.bos_token_id", source),
        "eos_token_id": _value(meta, "tokenizer.ggml.eos_token_id", source),
    }


def build_tokenizer(meta: dict, source: str) -> Tokenizer:
    """The byte-level BPE tokenizer the metadata describes (vocabulary, merges,
    special tokens, pre-tokenizer)."""
    kind = _value(meta, "tokenizer.ggml.model", source)
    if kind != "gpt2":
        raise GGUFError(f"{source}: tokenizer model {kind!r} is not supported (supported: gpt2, byte-level BPE)")
    pre = _value(meta, "tokenizer.ggml.pre", source, "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{source}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = _value(meta, "tokenizer.ggml.tokens", source)
    merges = [tuple(m.split(" ", 1)) for m in _value(meta, "tokenizer.ggml.merges", source)]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None:
        special = [tokens[i] for i, t in enumerate(types.tolist()) if t == CONTROL_TOKEN]
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


def tokenizer_config(meta: dict) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else tokens[value.item()]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


# --- tensors -------------------------------------------------------------------


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q`` -> ``model.layers.3.self_attn.q_proj`` (names without the .weight suffix)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    raise GGUFError(f"tensor {gguf_name!r} has no counterpart in the llama architecture")


def unpermute(weight: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's q/k row order (each head's rotary pairs interleaved) back
    to Hugging Face's (each head's two halves)."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def convert_tensors(tensors: dict[str, mx.array], config: dict, dtype: mx.Dtype,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, mx.array]:
    bases = sorted({name.rsplit(".", 1)[0] for name in tensors})
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    if progress:
        progress(0, len(bases))
    for done, base in enumerate(bases, 1):
        weight = dequantized(tensors, base)
        role = base.rsplit(".", 1)[-1]
        if role in heads:
            weight = unpermute(weight, heads[role])
        out[hf_name(base) + ".weight"] = weight.astype(dtype)
        mx.eval(out[hf_name(base) + ".weight"])  # one tensor at a time: peak memory stays one model
        if progress:
            progress(done, len(bases))
    return out


def dequantized(tensors: dict[str, mx.array], base: str) -> mx.array:
    """A tensor in float32, from MLX's affine form where the file quantized it."""
    weight = tensors[base + ".weight"]
    if base + ".scales" not in tensors:
        return weight.astype(mx.float32)
    scales, biases = tensors[base + ".scales"], tensors[base + ".biases"]
    bits = weight.shape[-1] // scales.shape[-1]  # 32-bit words per group of 32 values
    return mx.dequantize(weight, scales.astype(mx.float32), biases.astype(mx.float32),
                         group_size=GROUP_SIZE, bits=bits)
