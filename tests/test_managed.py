"""Host-written arrays prefetched to the GPU (mlxcel.kernels.managed): off CUDA nothing happens; on a CUDA
device the prefetch runs (the driver accepts the managed buffer MLX made) and leaves every value as it was,
including an array the GPU reads right after, while the prefetch may still be moving it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.kernels import managed
from mlxcel.kernels.csr import upload

needs_cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="prefetching needs a CUDA device (CI has none)")


@pytest.mark.skipif(mx.cuda.is_available(), reason="the no-GPU path")
def test_without_cuda_an_array_is_returned_as_it_is():
    array = mx.array(np.arange(5, dtype=np.int32))
    assert managed.prefetcher() is None
    assert managed.to_device(array) is array


@needs_cuda
def test_a_prefetched_upload_keeps_its_values():
    rng = np.random.default_rng()
    parts = [rng.integers(-2**31, 2**31 - 1, size, dtype=np.int64).astype(np.int32) for size in (3, 4096, 70000)]
    views = upload(*parts)
    move = managed.prefetcher()
    assert move is not None and move.enabled          # the driver took the prefetch of MLX's buffer
    total = sum(mx.sum(v.astype(mx.int64) * (i + 1)) for i, v in enumerate(views))   # read on the GPU at once
    assert total.item() == sum(int(p.astype(np.int64).sum()) * (i + 1) for i, p in enumerate(parts))
    for view, part in zip(views, parts):
        np.testing.assert_array_equal(np.array(view), part)
    single, = upload(parts[1].reshape(64, 64))          # one array: itself, no view
    assert single.shape == (64, 64)
    np.testing.assert_array_equal(np.array(single), parts[1].reshape(64, 64))
