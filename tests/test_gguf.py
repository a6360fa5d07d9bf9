"""GGUF conversion, round-tripped: a random-weight mlx-lm Llama model is written
as llama.cpp would write it (q/k rows permuted, Q4_1 or F32 tensors, tokenizer
in the metadata) by the gguf package's own writer and quantizer, converted back,
and compared with the original (weights against a float64 NumPy dequantization,
logits, token ids); bad files give one clear error and leave nothing behind."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import gguf
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from mlxcel.engine.gguf import GGUFError, convert_gguf, unpermute
from mlxcel.engine.model_cache import cached_dir
from mlxcel.engine.random_model import TINY_QWEN3, generate_random_model

SPEC = replace(TINY_QWEN3, model_type="llama", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
               head_dim=32, intermediate_size=256, seed=11)
TEXTS = ["The capital of France is Paris.", "  spaces,\ttabs\nand 12345 digits ", "naïve café — 東京 🚀"]
GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes q and k."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return generate_random_model(tmp_path_factory.mktemp("original"), **asdict(SPEC))


def write_gguf(original: Path, path: Path, quant: T, arch: str = "llama", permute: bool = True) -> dict:
    """The original model as a GGUF file; returns the tensors as written (HF names, float64)."""
    weights = {k: np.array(v, dtype=np.float32) for k, v in mx.load(str(original / "model.safetensors")).items()}
    tokenizer = json.loads((original / "tokenizer.json").read_text())
    config = json.loads((original / "config.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["id"] for t in tokenizer["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(SPEC.num_layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(SPEC.hidden_size)
    writer.add_feed_forward_length(SPEC.intermediate_size)
    writer.add_head_count(SPEC.num_heads)
    writer.add_head_count_kv(SPEC.num_kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(len(vocab))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if i in specials else 1 for _, i in vocab])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(json.loads((original / "tokenizer_config.json").read_text())["chat_template"])
    written = {}
    for name, value in weights.items():
        if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
            value = llama_cpp_permute(value, SPEC.num_heads if "q_proj" in name else SPEC.num_kv_heads)
        if value.ndim == 2 and quant not in (T.F32, T.F16):
            data = gguf.quants.quantize(value, quant)
            writer.add_tensor(gguf_name(name), data, raw_dtype=quant)
            written[name] = gguf.quants.dequantize(data, quant).astype(np.float64)
        else:
            data = value.astype(np.float16 if quant == T.F16 and value.ndim == 2 else np.float32)
            writer.add_tensor(gguf_name(name), data)
            written[name] = data.astype(np.float64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


@pytest.mark.parametrize("quant", [T.Q4_1, T.Q8_0, T.F16])
def test_weights_match_a_float64_dequantization_with_q_and_k_unpermuted(original, tmp_path, quant):
    written = write_gguf(original, tmp_path / "model.gguf", quant)
    convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    converted = mx.load(str(tmp_path / "out" / "model.safetensors"))
    assert set(converted) == set(written)
    for name, values in written.items():
        got = np.array(converted[name], dtype=np.float64)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = SPEC.num_heads if "q_proj" in name else SPEC.num_kv_heads
            want = np.array(unpermute(mx.array(values), heads), dtype=np.float64)
            assert np.array_equal(want, inverse_permute(values, heads))
        else:
            want = values
        # float32 storage of values that are f16 * int + f16: one float32 rounding apart at most
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-8, err_msg=name)
    assert converted["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32


def inverse_permute(values: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of llama.cpp's permutation, from the row indices it moves."""
    moved = llama_cpp_permute(np.arange(values.shape[0])[:, None], heads)[:, 0]
    out = np.empty_like(values)
    out[moved] = values
    return out


def test_an_f32_gguf_converts_back_to_the_same_model(original, tmp_path):
    write_gguf(original, tmp_path / "model.gguf", T.F32)
    convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    model, tokenizer = mlx_lm.load(str(tmp_path / "out"))
    want_model, want_tokenizer = mlx_lm.load(str(original))
    for text in TEXTS:
        assert tokenizer.encode(text) == want_tokenizer.encode(text)
        assert tokenizer.decode(tokenizer.encode(text)) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids == want_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.eos_token_ids == {2}
    logits, want = model(mx.array([ids]))[0], want_model(mx.array([ids]))[0]
    np.testing.assert_allclose(np.array(logits), np.array(want), rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["model_type"] == "llama"
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 32)


def test_without_the_unpermute_the_logits_differ(original, tmp_path):
    """The negative control: a file whose q/k rows were not permuted converts to another model."""
    write_gguf(original, tmp_path / "model.gguf", T.F32, permute=False)
    convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    ids = mx.array([[5, 17, 99, 3, 250, 42, 7]])
    model, _ = mlx_lm.load(str(tmp_path / "out"))
    want_model, _ = mlx_lm.load(str(original))
    assert not np.allclose(np.array(model(ids)), np.array(want_model(ids)), atol=1e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_other_dtypes_are_the_float32_weights_rounded(original, tmp_path, dtype):
    write_gguf(original, tmp_path / "model.gguf", T.Q4_1)
    convert_gguf(tmp_path / "model.gguf", tmp_path / "f32")
    convert_gguf(tmp_path / "model.gguf", tmp_path / dtype, dtype)
    f32 = mx.load(str(tmp_path / "f32" / "model.safetensors"))
    other = mx.load(str(tmp_path / dtype / "model.safetensors"))
    for name, value in other.items():
        assert value.dtype == getattr(mx, dtype)
        assert mx.array_equal(value, f32[name].astype(value.dtype)).item(), name
    assert json.loads((tmp_path / dtype / "config.json").read_text())["torch_dtype"] == dtype


def test_progress_follows_every_tensor(original, tmp_path):
    write_gguf(original, tmp_path / "model.gguf", T.Q4_1)
    seen = []
    convert_gguf(tmp_path / "model.gguf", tmp_path / "out", progress=lambda done, total: seen.append((done, total)))
    tensors = 2 + 9 * SPEC.num_layers  # embedding, final norm (the head is tied) and nine per layer
    assert seen == [(i, tensors) for i in range(tensors + 1)]


def converted_in_cache(path: Path, home: Path) -> Path:
    return cached_dir("converted", {"source": str(path)}, lambda out: convert_gguf(path, out), home)


@pytest.mark.parametrize("damage, message", [
    ("architecture", r"architecture 'gemma' is not supported \(supported: llama\)"),
    ("quantization", r"holds a tensor type MLX cannot read \(MLX reads F32, F16, Q4_0, Q4_1 and Q8_0\)"),
    ("truncated", r"extends past the end of the file"),
    ("not_gguf", r"gguf_init failed"),
])
def test_bad_files_are_one_clear_error_and_leave_nothing(original, tmp_path, damage, message):
    path = tmp_path / "model.gguf"
    if damage == "architecture":
        write_gguf(original, path, T.F32, arch="gemma")
    elif damage == "quantization":
        write_gguf(original, path, T.Q5_0)
    elif damage == "truncated":
        write_gguf(original, path, T.Q4_1)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_text("not a model\n")
    home = tmp_path / "home"
    with pytest.raises(GGUFError, match=message) as err:
        converted_in_cache(path, home)
    assert "\n" not in str(err.value)
    assert list((home / "models").iterdir()) == []


def test_unknown_dtype_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="dtype 'int4' is not supported"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out", "int4")
