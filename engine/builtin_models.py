"""The models `mlxcel-tui serve` knows by name, built on first use into the
model cache and then loaded through ``mlx_lm.load`` like any model directory.

``tiny``: a random-weight Qwen3-architecture model (4 layers, hidden 256), the
test fixture; its output is gibberish by design.
"""

from __future__ import annotations

from pathlib import Path

from .random_model import TINY_QWEN3, cached_random_model

TINY = "tiny"
TINY_MODEL_NAME = "mlxcel-tiny-qwen3"
# Bump the suffix whenever the generator's output changes (corpus, prompts,
# init, files), so caches written by an older version are left alone.
TINY_MODEL_DIRNAME = "tiny-qwen3-v2"


def tiny_model_path(home: Path | None = None) -> Path:
    """Directory of the tiny random model, generated on first use."""
    return cached_random_model(TINY_MODEL_DIRNAME, TINY_QWEN3, home)
