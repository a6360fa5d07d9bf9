"""A measured model of what a cascade step saves on this device against the
flat step it replaces, per layer:

    time = launches * launch_s + kv_bytes / bytes_per_s + state_elements * state_s

A plan of depth D adds D + 1 launches to the flat step (a stacked launch per
depth and the merge), reads each span's pages once instead of once per
member, and adds one softmax state (Hq x D floats) per member of each span to
the merge. A span is kept when its own saving, bytes less states, is
positive; the plan when the sum of its spans' savings covers the extra
launches.

The constants are measured on the device by the dispatched kernels
(``calibrate``: a launch over one page, a launch over many, a merge of many
states; about a second) and kept in ``$MLXCEL_HOME/cascade-cost.json`` per
backend and device. ``mlxcel calibrate`` writes them; a fused backend's first
cascade step measures them itself when no file has them.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import AttentionShape, PagedCsrView
from mlxcel.kernels.csr import host_csr

from .cascade import CascadePlan
from .model_cache import mlxcel_home

FILE_NAME = "cascade-cost.json"


@dataclass(frozen=True)
class CostModel:
    backend: str
    device: str
    launch_s: float       # fixed cost of one more launch
    bytes_per_s: float    # KV bytes the partial kernel reads per second
    state_s: float        # merging one float of one softmax state

    def span_saving(self, shape: AttentionShape, pages: int, members: int) -> float:
        """Seconds a span of ``pages`` pages for ``members`` rows saves (launches aside)."""
        read_once = pages * (members - 1) * shape.page_bytes / self.bytes_per_s
        return read_once - members * shape.q_heads * shape.head_dim * self.state_s

    def plan_saving(self, shape: AttentionShape, plan: CascadePlan) -> float:
        """Seconds the plan saves per layer against the flat step."""
        spans = sum(self.span_saving(shape, s.pages, len(s.members)) for s in plan.spans)
        return spans - (plan.depth + 1) * self.launch_s

    def describe(self) -> str:
        return (f"{self.backend} on {self.device}: {self.launch_s * 1e6:.1f} us a launch, "
                f"{self.bytes_per_s / 1e9:.1f} GB/s, {self.state_s * 1e12:.2f} ps a state float")


def model_file(home: Path | None = None) -> Path:
    return mlxcel_home(home) / FILE_NAME


def device_key() -> tuple[str, str]:
    return kernels.backend_name(), str(mx.default_device())


def load(home: Path | None = None) -> CostModel | None:
    """The stored constants for this backend and device, or None."""
    backend, device = device_key()
    try:
        stored = json.loads(model_file(home).read_text())
        return CostModel(**stored[f"{backend}/{device}"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(model: CostModel, home: Path | None = None) -> Path:
    """Add this device's constants to the file (written atomically)."""
    path = model_file(home)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    stored[f"{model.backend}/{model.device}"] = asdict(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(stored, indent=2) + "\n")
    os.replace(staging, path)
    return path


def timed(call, reps: int, chain: int) -> float:
    """Median seconds of one call, ``chain`` calls evaluated together per sample."""
    mx.eval(call())
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        mx.eval([call() for _ in range(chain)])
        samples.append((time.perf_counter() - start) / chain)
    return statistics.median(samples)


def calibrate(reps: int = 7) -> CostModel:
    """Measure the constants with the kernels dispatched for the default device."""
    gpu = mx.default_device().type == mx.DeviceType.gpu
    # The serving shape on a GPU (bf16 pools); a small float32 one on the CPU.
    hq, hkv, d, block = (32, 8, 128, 32) if gpu else (8, 2, 64, 32)
    dtype = mx.bfloat16 if gpu else mx.float32
    rows, pages = (32, 128) if gpu else (8, 32)
    groups, width = (4096, 8) if gpu else (256, 8)
    chain = 20 if gpu else 1
    keys = iter(mx.random.split(mx.random.key(0), 6))   # two pools, two queries, states, lses
    normal = lambda shape, dtype=mx.float32: mx.random.normal(shape, key=next(keys)).astype(dtype)  # noqa: E731
    blocks = rows * pages
    k_pool, v_pool = normal((blocks, block, hkv, d), dtype), normal((blocks, block, hkv, d), dtype)
    shape = AttentionShape(hq, hkv, d, dtype, dtype, block, d ** -0.5)

    def partial_time(tables) -> float:
        csr = PagedCsrView.from_host(host_csr(tables, [len(t) * block for t in tables], block))
        q = normal((len(tables), hq, d), dtype)
        launch = kernels.prepare_partial(csr, shape)
        return timed(lambda: launch(q, k_pool, v_pool, csr.last_page_len), reps, chain)

    small = partial_time([[0]])
    large = partial_time([list(range(r * pages, (r + 1) * pages)) for r in range(rows)])
    states, lses = normal((groups * width, hq, d)), normal((groups * width, hq))
    merge = kernels.prepare_merge(np.arange(groups + 1) * width, d)
    merged = timed(lambda: merge(states, lses), reps, chain)
    backend, device = device_key()
    kv_bytes = rows * pages * shape.page_bytes
    return CostModel(backend, device, launch_s=small,
                     bytes_per_s=kv_bytes / max(large - small, 1e-9),
                     state_s=max(merged - small, 0.0) / (groups * width * hq * d))


_current: dict[tuple[str, str], CostModel | None] = {}


def current(measure: bool) -> CostModel | None:
    """This device's model: stored, else measured and stored when ``measure``
    (a fused backend's first cascade step), else None. Read once per process."""
    key = device_key()
    if key not in _current or (_current[key] is None and measure):
        model = load()
        if model is None and measure:
            model = calibrate()
            save(model)
        _current[key] = model
    return _current[key]
