"""The random-weight models: mlx-lm loads every family, the tiny fixture's tokenizer
and template, greedy output that varies."""

from dataclasses import asdict, replace
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache
from transformers import AutoTokenizer

from mlxcel.engine import random_model
from mlxcel.engine.builtin_models import tiny_model_path
from mlxcel.engine.random_model import (
    BENCHMARK_QWEN3,
    TINY_QWEN3,
    ModelSpec,
    generate_random_model,
)
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT

CASCADE_MIN_SHARED_PAGES, BLOCK_SIZE = 16, 32
pytestmark = pytest.mark.usefixtures("no_network")  # nothing here may download


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return mlx_lm.load(str(model_dir))


def test_config_is_qwen3_with_gqa(loaded):
    model, _ = loaded
    args = model.args
    assert model.model_type == "qwen3" and type(model).__module__ == "mlx_lm.models.qwen3"
    assert args.num_attention_heads == 8 and args.num_key_value_heads == 2
    assert args.num_attention_heads > args.num_key_value_heads
    assert (args.num_hidden_layers, args.hidden_size, args.head_dim) == (4, 256, 64)
    assert args.vocab_size == 1024 and args.tie_word_embeddings and args.rope_theta == 1e6


def test_greedy_generation_repeats_and_varies(loaded):
    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": DEFAULT_QUESTIONS[0]}],
                                           add_generation_prompt=True)

    def greedy_tokens():
        return [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=8)]

    tokens = greedy_tokens()
    assert len(tokens) == 8 and all(0 <= t < 1024 for t in tokens)
    assert len(set(tokens)) > 1  # token-equality tests on this model compare sequences that vary
    assert greedy_tokens() == tokens


def test_chat_template_is_chatml(loaded):
    _, tokenizer = loaded
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert tokenizer.eos_token_ids == {0, 2}  # <|im_end|> and <|endoftext|>


def test_tokenizer_round_trips_text(loaded):
    _, tokenizer = loaded
    for text in ["Paged attention reads the cache.", "  spaces,\ttabs\nand lines ",
                 "naïve café — 東京 🚀", DEFAULT_SYSTEM_PROMPT]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_end|>") == [2]


def test_transformers_loads_tokenizer_offline(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert len(tokenizer) == 1024
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.encode("serving engine") == tokenizer.encode("serving engine", add_special_tokens=False)


def test_system_prompt_spans_cascade_threshold(loaded):
    _, tokenizer = loaded
    raw_tokens = len(tokenizer.encode(DEFAULT_SYSTEM_PROMPT))
    assert raw_tokens >= 1100

    def conversation(question):
        return tokenizer.apply_chat_template(
            [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": question}],
            add_generation_prompt=True)

    first, second = conversation(DEFAULT_QUESTIONS[0]), conversation(DEFAULT_QUESTIONS[1])
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared >= raw_tokens
    assert shared // BLOCK_SIZE > CASCADE_MIN_SHARED_PAGES


def test_default_questions_are_short_and_distinct():
    assert len(DEFAULT_QUESTIONS) == len(set(DEFAULT_QUESTIONS)) == 16
    assert all(0 < len(q) < 80 for q in DEFAULT_QUESTIONS)


@pytest.mark.parametrize("model_type, module", [
    ("llama", "llama"), ("mistral", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3"),
])
def test_random_family_decodes_with_mlx_lm_cache(tmp_path, model_type, module):
    # mlx-lm's qwen2 derives head_dim from hidden_size, so give it a matching one.
    spec = replace(TINY_QWEN3, model_type=model_type, num_layers=2, seed=7,
                   head_dim=32 if model_type == "qwen2" else 64)
    model, _, config = mlx_lm.load(str(generate_random_model(tmp_path, **asdict(spec))), return_config=True)
    assert type(model).__module__ == f"mlx_lm.models.{module}"
    assert config["model_type"] == model_type
    assert config["num_attention_heads"] > config["num_key_value_heads"]
    assert ("bias" in model.layers[0].self_attn.q_proj) == (model_type == "qwen2")

    tokens = mx.array([[5, 17, 99, 3, 250, 42, 7, 1000, 64, 12, 8, 300, 77]])
    cache = make_prompt_cache(model)
    model(tokens[:, :-1], cache=cache)
    step_logits = model(tokens[:, -1:], cache=cache)[0, -1]
    full_logits = model(tokens)[0, -1]
    assert cache[0].offset == tokens.shape[1]
    np.testing.assert_allclose(np.array(step_logits), np.array(full_logits), atol=1e-4)


def test_benchmark_shape_matches_mlx_lm_qwen3():
    config = random_model._model_config(BENCHMARK_QWEN3)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    expected = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
    assert random_model._weight_shapes(BENCHMARK_QWEN3) == expected
    assert (config["num_hidden_layers"], config["hidden_size"]) == (8, 1024)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (16, 4, 64)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma"}, "gemma"),
    ({"num_kv_heads": 3}, "multiple"),
    ({"dtype": "int8"}, "dtype"),
    ({"model_type": "qwen2"}, "qwen2"),
])
def test_invalid_spec_is_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**asdict(TINY_QWEN3), **change})
