"""Model names the benchmark accepts: a local model directory, ``default`` (the
embedded tiny Qwen3) or ``benchmark-qwen3`` (the larger random-weight Qwen3,
generated on first use)."""

from __future__ import annotations

from pathlib import Path

DEFAULT = "default"
BENCHMARK_QWEN3 = "benchmark-qwen3"
BENCHMARK_QWEN3_DIRNAME = "benchmark-qwen3-v1"


def resolve_model(name: str) -> Path:
    """The model directory for a name, generating an embedded one if needed."""
    from mlxcel.engine import builtin_models, random_model

    if name == DEFAULT:
        return builtin_models.tiny_model_path()
    if name == BENCHMARK_QWEN3:
        return random_model.cached_random_model(BENCHMARK_QWEN3_DIRNAME, random_model.BENCHMARK_QWEN3)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise SystemExit(f"{name}: not a model directory (no config.json), nor '{DEFAULT}' / '{BENCHMARK_QWEN3}'")
    return path


def server_model_argument(name: str, path: Path) -> Path | None:
    """What `mlxcel-tui serve` is given: nothing for the embedded default, else the directory."""
    return None if name == DEFAULT else path

