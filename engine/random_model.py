"""Random-weight models for tests and benchmarks, written as model directories
that ``mlx_lm.load`` accepts.

Every family (Qwen3, Qwen2, Llama, Mistral) shares one byte-level BPE tokenizer
trained on the embedded corpus and the built-in session prompts, and ties its
word embeddings. The same spec gives the same bytes on every machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .corpus import TRAINING_CORPUS
from .model_cache import cached_dir, write_json
from .session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT

ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
}
DTYPES = ("float32", "float16", "bfloat16")

VOCAB_SIZE = 1024
ROPE_THETA = 1_000_000.0
RMS_NORM_EPS = 1e-6
MAX_POSITION_EMBEDDINGS = 32768

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a generated model directory's bytes."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    seed: int
    dtype: str = "float32"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; "
                f"choose one of {sorted(ARCHITECTURES)}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; choose one of {DTYPES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        # mlx-lm's qwen2 derives head_dim from hidden_size and ignores the field.
        if self.model_type == "qwen2" and self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError("qwen2 needs num_heads * head_dim == hidden_size")


# The test fixture. At the usual 0.02 init its greedy output is one token
# repeated (the tied embedding dominates the logits); at 0.1 the context moves
# the argmax, so token-equality tests compare sequences that vary.
TINY_QWEN3 = ModelSpec(
    model_type="qwen3",
    num_layers=4,
    hidden_size=256,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=768,
    seed=0,
    init_std=0.1,
)

BENCHMARK_QWEN3 = ModelSpec(
    model_type="qwen3",
    num_layers=8,
    hidden_size=1024,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=3072,
    seed=1,
)


def cached_random_model(dirname: str, spec: ModelSpec, home: Path | None = None) -> Path:
    """``$MLXCEL_HOME/models/<dirname>`` holding ``spec``, (re)generated unless intact."""
    return cached_dir(dirname, asdict(spec), lambda path: generate_random_model(path, **asdict(spec)), home)


def generate_random_model(path: Path, **spec_fields) -> Path:
    """Write a random-weight model directory for ``ModelSpec(**spec_fields)``."""
    spec = ModelSpec(**spec_fields)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / "config.json", _model_config(spec))
    write_json(path / "generation_config.json", _generation_config())
    (path / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    write_json(path / "tokenizer_config.json", _tokenizer_config())
    mx.save_safetensors(str(path / "model.safetensors"), _random_weights(spec), metadata={"format": "mlx"})
    return path


# --- tokenizer -----------------------------------------------------------------


@cache
def _tokenizer_json() -> str:
    """The trained tokenizer, serialized; BPE training on a fixed corpus is deterministic."""
    return _train_tokenizer().to_str(pretty=True)


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocabulary, so any text encodes without unknowns.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(), trainer)
    return tokenizer


def _training_texts() -> list[str]:
    """The corpus plus the built-in prompts, so served text tokenizes compactly."""
    paragraphs = TRAINING_CORPUS.split("\n\n") + DEFAULT_SYSTEM_PROMPT.split("\n\n")
    return paragraphs + list(DEFAULT_QUESTIONS)


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "chat_template": CHAT_TEMPLATE,
    }


def _special_token_id(token: str) -> int:
    return SPECIAL_TOKENS.index(token)


# --- config and weights --------------------------------------------------------


def _model_config(spec: ModelSpec) -> dict:
    """An HF-style config.json carrying every field mlx-lm's ModelArgs needs."""
    return {
        "architectures": [ARCHITECTURES[spec.model_type]],
        "model_type": spec.model_type,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "tie_word_embeddings": True,
        "attention_bias": spec.model_type == "qwen2",
        "sliding_window": None,
        "eos_token_id": _special_token_id(IM_END),
        "pad_token_id": _special_token_id(ENDOFTEXT),
        "torch_dtype": spec.dtype,
    }


def _generation_config() -> dict:
    # mlx-lm takes eos_token_id from here over config.json: stop on either end token.
    return {"eos_token_id": [_special_token_id(IM_END), _special_token_id(ENDOFTEXT)]}


def _weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """HF/mlx-lm weight names and shapes, in the fixed order they are drawn."""
    q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {"model.embed_tokens.weight": (VOCAB_SIZE, spec.hidden_size)}
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}"
        shapes[f"{p}.input_layernorm.weight"] = (spec.hidden_size,)
        shapes[f"{p}.self_attn.q_proj.weight"] = (q_dim, spec.hidden_size)
        shapes[f"{p}.self_attn.k_proj.weight"] = (kv_dim, spec.hidden_size)
        shapes[f"{p}.self_attn.v_proj.weight"] = (kv_dim, spec.hidden_size)
        if spec.model_type == "qwen2":
            shapes[f"{p}.self_attn.q_proj.bias"] = (q_dim,)
            shapes[f"{p}.self_attn.k_proj.bias"] = (kv_dim,)
            shapes[f"{p}.self_attn.v_proj.bias"] = (kv_dim,)
        if spec.model_type == "qwen3":
            shapes[f"{p}.self_attn.q_norm.weight"] = (spec.head_dim,)
            shapes[f"{p}.self_attn.k_norm.weight"] = (spec.head_dim,)
        shapes[f"{p}.self_attn.o_proj.weight"] = (spec.hidden_size, q_dim)
        shapes[f"{p}.post_attention_layernorm.weight"] = (spec.hidden_size,)
        shapes[f"{p}.mlp.gate_proj.weight"] = (spec.intermediate_size, spec.hidden_size)
        shapes[f"{p}.mlp.up_proj.weight"] = (spec.intermediate_size, spec.hidden_size)
        shapes[f"{p}.mlp.down_proj.weight"] = (spec.hidden_size, spec.intermediate_size)
    shapes["model.norm.weight"] = (spec.hidden_size,)
    return shapes


def _random_weights(spec: ModelSpec) -> dict[str, mx.array]:
    """Norm weights are 1; everything else (biases too, so they matter) is N(0, init_std)."""
    rng = np.random.default_rng(spec.seed)
    weights = {}
    for name, shape in _weight_shapes(spec).items():
        if "norm" in name:
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(spec.init_std)
        weights[name] = mx.array(values).astype(getattr(mx, spec.dtype))
    return weights
