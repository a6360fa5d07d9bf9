"""The model cache: layout, byte-identical rebuilds across processes and concurrent
builders, damaged or outdated folders rebuilt, failures that leave nothing behind."""

import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from mlxcel.engine.builtin_models import TINY_MODEL_DIRNAME, tiny_model_path
from mlxcel.engine.model_cache import MANIFEST, ModelCacheError, cached_dir, is_intact, mlxcel_home
from mlxcel.engine.random_model import TINY_QWEN3, cached_random_model

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json")
pytestmark = pytest.mark.usefixtures("no_network")  # nothing here may download


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("home"))


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def generate_in_subprocess(home: Path) -> subprocess.Popen:
    code = "import sys, pathlib; from mlxcel.engine.builtin_models import tiny_model_path; " \
           "tiny_model_path(pathlib.Path(sys.argv[1]))"
    return subprocess.Popen([sys.executable, "-c", code, str(home)],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_layout_and_default_home(model_dir, tmp_path, monkeypatch):
    assert model_dir.name == TINY_MODEL_DIRNAME and model_dir.parent.name == "models"
    assert sorted(p.name for p in model_dir.iterdir()) == sorted((*MODEL_FILES, MANIFEST))
    monkeypatch.setenv("MLXCEL_HOME", str(tmp_path))
    assert mlxcel_home() == tmp_path


def test_generation_is_byte_identical_across_processes_and_concurrent_writers(model_dir, tmp_path):
    # Two fresh processes race to generate into one home; a third home has its own.
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    procs = [generate_in_subprocess(shared), generate_in_subprocess(shared), generate_in_subprocess(alone)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    expected = file_bytes(model_dir)
    for home in (shared, alone):
        assert file_bytes(home / "models" / TINY_MODEL_DIRNAME) == expected
        assert [p.name for p in (home / "models").iterdir()] == [TINY_MODEL_DIRNAME]  # no staging left


@pytest.mark.parametrize("damage", ["truncate_weights", "edit_tokenizer", "delete_config", "delete_manifest"])
def test_damaged_folder_is_regenerated(model_dir, tmp_path, damage):
    home = tmp_path / "home"
    target = tiny_model_path(home)
    pristine = file_bytes(target)
    if damage == "truncate_weights":
        (target / "model.safetensors").write_bytes(pristine["model.safetensors"][:1000])
    elif damage == "edit_tokenizer":
        (target / "tokenizer.json").write_bytes(pristine["tokenizer.json"].replace(b"BPE", b"XYZ"))
    elif damage == "delete_config":
        (target / "config.json").unlink()
    else:
        (target / MANIFEST).unlink()
    assert not is_intact(target, asdict(TINY_QWEN3))
    assert tiny_model_path(home) == target
    assert file_bytes(target) == pristine
    assert [p.name for p in target.parent.iterdir()] == [TINY_MODEL_DIRNAME]  # stale copy removed


def test_changed_spec_regenerates(tmp_path):
    small = replace(TINY_QWEN3, num_layers=1)
    path = cached_random_model("probe", small, tmp_path)
    assert is_intact(path, asdict(small)) and not is_intact(path, asdict(TINY_QWEN3))
    cached_random_model("probe", TINY_QWEN3, tmp_path)
    assert is_intact(path, asdict(TINY_QWEN3))


def test_unwritable_home_is_one_clear_error_and_leaves_nothing(tmp_path):
    # Root may write anywhere, so the home sits below a plain file instead of a read-only folder.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ModelCacheError, match=r"cannot write the model cache .*a-file/home/models: "
                                              r"Not a directory \(set MLXCEL_HOME"):
        tiny_model_path(blocker / "home")


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def build(path):
        (path / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        cached_dir("probe", {"v": 1}, build, tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
