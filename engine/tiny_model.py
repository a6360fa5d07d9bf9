"""The embedded default model, and random-weight models for tests and benchmarks.

The default is a tiny Qwen3-architecture model with random weights and a
byte-level BPE tokenizer trained on an English corpus embedded below. It is
generated deterministically on first use into ``$MLXCEL_HOME/models/`` (default
``~/.cache/mlxcel``) and then loaded through ``mlx_lm.load(path)`` like any
real model directory, so the engine has one loading path and nothing is ever
downloaded.

Every generated directory carries ``manifest.json`` with the sha256 of each
file and the spec it was generated from; a cached directory whose files or
spec do not match is regenerated. Directories are built in a temporary folder
and renamed into place, so concurrent generators never expose a partial one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

DEFAULT_MODEL_NAME = "mlxcel-tiny-qwen3"

# Bump the suffix whenever the generator's output changes (corpus, init, files),
# so caches written by an older version are left alone and a fresh one is made.
TINY_MODEL_DIRNAME = "tiny-qwen3-v1"

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
INIT_STD = 0.02

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
MANIFEST = "manifest.json"


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


TINY_QWEN3 = ModelSpec(
    model_type="qwen3",
    num_layers=4,
    hidden_size=256,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=768,
    seed=0,
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


# --- public API --------------------------------------------------------------


def mlxcel_home(home: Path | None = None) -> Path:
    """The cache root: ``home``, else ``$MLXCEL_HOME``, else ``~/.cache/mlxcel``."""
    if home is not None:
        return Path(home)
    return Path(os.environ.get("MLXCEL_HOME", "~/.cache/mlxcel")).expanduser()


def default_model_path(home: Path | None = None) -> Path:
    """Directory of the embedded default model, generated on first use."""
    return cached_model_path(TINY_MODEL_DIRNAME, TINY_QWEN3, home)


def cached_model_path(dirname: str, spec: ModelSpec, home: Path | None = None) -> Path:
    """``$MLXCEL_HOME/models/<dirname>`` holding ``spec``, (re)generated unless intact."""
    target = mlxcel_home(home) / "models" / dirname
    if is_intact(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dirname}.staging-", dir=target.parent))
    try:
        generate_random_model(staged, **asdict(spec))
        _move_into_place(staged, target, spec)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already when the rename won
    return target


def generate_random_model(
    path: Path,
    *,
    model_type: str = "qwen3",
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    seed: int,
    dtype: str = "float32",
) -> Path:
    """Write a random-weight model directory that ``mlx_lm.load`` accepts.

    All families share the embedded tokenizer and tie their word embeddings.
    The same arguments give the same bytes on every machine.
    """
    spec = ModelSpec(
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        seed=seed,
        dtype=dtype,
    )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer_json = _tokenizer_json()
    _write_json(path / "config.json", _model_config(spec))
    _write_json(path / "generation_config.json", _generation_config())
    (path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    _write_json(path / "tokenizer_config.json", _tokenizer_config())
    mx.save_safetensors(
        str(path / "model.safetensors"), _random_weights(spec), metadata={"format": "mlx"}
    )
    _write_json(path / MANIFEST, _manifest(path, spec))
    return path


def is_intact(path: Path, spec: ModelSpec) -> bool:
    """True when ``path`` holds every model file unchanged since it was generated from ``spec``."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest.get("spec") != asdict(spec) or set(manifest.get("files", {})) != set(MODEL_FILES):
        return False
    try:
        return all(_sha256(path / name) == digest for name, digest in manifest["files"].items())
    except OSError:
        return False


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
    """Norm weights are 1; everything else (biases too, so they matter) is N(0, 0.02)."""
    rng = np.random.default_rng(spec.seed)
    weights = {}
    for name, shape in _weight_shapes(spec).items():
        if "norm" in name:
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
        weights[name] = mx.array(values).astype(getattr(mx, spec.dtype))
    return weights


# --- files ---------------------------------------------------------------------


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(path: Path, spec: ModelSpec) -> dict:
    return {"spec": asdict(spec), "files": {name: _sha256(path / name) for name in MODEL_FILES}}


def _move_into_place(staged: Path, target: Path, spec: ModelSpec) -> None:
    """Rename ``staged`` to ``target``, replacing a damaged ``target``.

    A concurrent generator may install an intact copy first; that copy wins.
    """
    if target.exists() and not is_intact(target, spec):
        _remove_aside(target)
    try:
        os.rename(staged, target)
    except OSError:
        if not is_intact(target, spec):
            raise


def _remove_aside(path: Path) -> None:
    """Rename ``path`` out of the way first so no reader sees it half deleted."""
    aside = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process moved it already
    shutil.rmtree(aside, ignore_errors=True)


# --- embedded text ---------------------------------------------------------------

TRAINING_CORPUS = """\
A language model serving engine turns a trained network into a service that many people can use at the same time. Each request arrives as a prompt, a sequence of tokens, and leaves as a stream of generated tokens. The engine decides which requests run together, where their state lives in memory, and how each step of the model is computed.

Generation has two phases. During prefill the engine reads the whole prompt in one pass and writes the keys and values of every layer into the key value cache. During decode it produces one new token per sequence per step, reading the cache to attend to everything that came before. Prefill is limited by compute, decode is limited by memory bandwidth, and a good scheduler mixes the two so that neither the arithmetic units nor the memory sit idle.

Attention compares the query of the current token with the keys of all earlier tokens, turns the scores into weights with a softmax, and returns a weighted sum of the values. Grouped query attention lets several query heads share one key head and one value head, which shrinks the cache by the same factor without changing the shape of the computation very much. Rotary position embeddings rotate queries and keys by an angle that depends on the position, so relative distance shows up directly in the scores.

The cache grows with every token, and sequences finish at different times, so storing each sequence in one contiguous buffer wastes memory. Paged attention splits the cache into fixed size blocks, much like pages of virtual memory. A page table lists the blocks that belong to each sequence, blocks are allocated when a sequence grows and returned to a free list when it ends, and the attention kernel follows the page table instead of assuming contiguous storage.

Many requests begin with the same text: a system prompt, a set of instructions, or a shared document. A prefix cache remembers the blocks that hold such a prefix, keyed by a hash of the tokens, so a new request that starts the same way can reuse them instead of computing them again. Reference counts record how many sequences point at each block, and a block is only freed when the last of them lets go.

Cascade attention goes one step further. When a batch of sequences shares a long prefix, the engine reads the shared blocks once for the whole group and the private blocks once for each member, then merges the two partial results with their softmax statistics. The answer is the same as ordinary attention, but the shared part of the cache is read from memory only once per step instead of once per sequence.

Continuous batching lets requests join and leave between steps rather than waiting for a whole batch to finish. When memory runs short, a new request waits in a queue, or a running one is preempted and recomputed later. Metrics such as tokens per second, step latency, queue length and cache occupancy tell an operator how the engine behaves under load, and a dashboard makes those numbers easy to watch.

Sampling chooses the next token from the logits. Greedy decoding always takes the most likely token, which makes the output repeatable and easy to test. Temperature, top p and top k sampling trade some of that certainty for variety. Stop tokens end a sequence, and a maximum token count bounds the cost of every request.

Quantization stores weights with fewer bits, which saves memory and bandwidth at a small cost in accuracy. Kernels fuse several small operations into one launch to avoid writing intermediate results to memory. Careful engineering of these details is what separates a fast engine from a slow one running the very same model.
"""

DEFAULT_SYSTEM_PROMPT = """\
You are a helpful, patient and precise assistant running inside a local language model serving engine. The people who talk to you are engineers who want to understand how such an engine works: how requests are scheduled, how the key value cache is stored in pages, how a shared prompt like this one is computed once and reused, and how attention reads the cache at every decoding step. Answer their questions clearly, with short paragraphs, plain words and concrete examples. When a question is vague, say what you assume before you answer it. When you do not know something, say so instead of guessing.

Some background that you may use in your answers follows. A serving engine receives prompts from many clients at once. Each prompt is split into tokens by a tokenizer, and the model processes those tokens in two phases. In the prefill phase the whole prompt is read in one pass, and the keys and values of every layer are written into the key value cache. In the decode phase the model produces one token per step for every running sequence, and each new token attends to all the keys and values that came before it. Prefill is limited by compute, while decode is limited by how fast the cache and the weights can be read from memory.

The cache is stored in fixed size blocks, also called pages. A block holds the keys and values of a fixed number of tokens, for example thirty two, for every layer and every key value head. Each sequence owns a list of blocks called its page table. When a sequence grows past the end of its last block, the engine takes a new block from the free list. When a sequence finishes, its blocks go back to the free list at once, so the memory can be used by the next request without any copying. Because blocks do not need to be next to each other in memory, the engine wastes at most part of one block per sequence.

Blocks can be shared. Every client session of this engine begins with the same system prompt, the text you are reading now. The prefix cache stores the blocks of that prompt under a hash of their tokens, so when a new request begins with the same tokens the engine finds the blocks, increases their reference counts and skips the work of computing them again. Only the short question at the end of each request needs a fresh prefill. A block is freed only when no sequence and no cache entry refers to it any longer. Reference counts must always be right: a block that is freed too early would let one conversation read the memory of another.

During decode, many sequences in a batch may point at the same shared blocks. Ordinary paged attention reads those shared blocks once for every sequence, which wastes memory bandwidth when the shared prompt is long. Cascade attention splits the work in two. First it computes attention of all the queries in the group over the shared blocks, reading them from memory only once. Then it computes attention of each query over the private blocks of its own sequence. Each part returns a partial output together with the maximum score and the sum of the exponentials, and the two parts are merged with the same rules that make a softmax stable. The result is the same as ordinary attention up to rounding, but the step reads far less memory. The engine only uses cascade attention when a group shares enough pages and has enough members to make it worth the extra launch.

The scheduler runs a loop. At every step it admits waiting requests if there is room in the pool, runs prefill for new sequences, runs one decode step for every running sequence, samples the next tokens, and releases the blocks of sequences that have finished. If the pool is full, new requests wait in a queue, and if a running sequence cannot grow, it may be preempted and computed again later. No running sequence may ever be corrupted by this. After each step the engine publishes a snapshot of its state: the page tables, the reference counts, the cascade plan, the step latency and the number of tokens per second. The dashboard shows this snapshot so that people can watch the engine work.

Grouped query attention is used by the model behind this engine. Several query heads share one key head and one value head, which makes the cache smaller by the same factor. Rotary position embeddings encode the position of every token by rotating its query and key vectors, so the cache stores keys that already carry their position. RMS normalization keeps the scale of the hidden state stable from one layer to the next. The feed forward block uses a gated linear unit with the SiLU activation. None of these details change how the cache is paged or shared, but they decide how large each block is in bytes and how much memory each step has to read.

When you explain these ideas, prefer small numbers that people can check by hand. For example, with a block size of thirty two tokens, a prompt of one thousand tokens fills thirty one full blocks and part of a thirty second one. If four sessions share that prompt, the pool holds thirty two blocks for it instead of one hundred and twenty eight, and cascade attention reads those thirty two blocks once per step instead of four times. If a question is about performance, explain which resource is the limit, compute or memory, and why. If a question is about correctness, explain what must stay true, such as a reference count that never drops below zero or a page table that never points at a free block.

Keep your answers focused on the question. Use lists when you compare several options, and use a short example when a definition alone would be hard to follow. Do not invent numbers about a particular machine; if a number depends on the hardware, say what it depends on and how to measure it. If someone asks you to write code, keep it short and explain what each part does. If someone asks about a topic far from serving engines, answer briefly and politely, and offer to return to the engine if they would like. Above all, be honest about what you know, be kind to the person asking, and help them build a clear picture of how the parts fit together."""

DEFAULT_QUESTIONS = (
    "What is a key value cache, in one paragraph?",
    "Why is decoding limited by memory bandwidth?",
    "How does paged attention avoid wasting memory?",
    "What happens to the blocks of a sequence when it finishes?",
    "How does the prefix cache find a shared system prompt?",
    "What does cascade attention save at each step?",
    "Why must reference counts never drop below zero?",
    "How does grouped query attention shrink the cache?",
    "What is the difference between prefill and decode?",
    "When should the engine skip cascade attention?",
    "How do rotary position embeddings encode position?",
    "What does the scheduler do when the pool is full?",
    "How is a softmax merged from two partial results?",
    "Why does continuous batching improve throughput?",
    "What does greedy decoding make easier to test?",
    "How many blocks does a prompt of 100 tokens need?",
)
