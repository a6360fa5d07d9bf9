"""What can be checked of the fused GPU kernels without a GPU: the CUDA
sources compile (nvcc, for sm_90, inside the translation unit MLX builds)
without spills and within the register budget the launch plan assumes; the
Metal twin keeps the CUDA sections in order; dispatch; the host-side fallbacks.
Their numerics are tested on a CUDA device by test_fused_kernels.py."""

from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from cuda_unit import compile_unit, nvcc, resources, translation_unit
from mlxcel import kernels
from mlxcel.engine import attention
from mlxcel.engine.cascade import plan_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.kernels import AttentionShape, PagedCsrView, cuda, fused, metal, portable, tile_plan
from mlxcel.kernels.csr import host_csr
from mlxcel.kernels.kv_quant import INT4, INT8, QuantizedPages
from mlxcel.kernels.reference import as_float64, reference_decode, reference_merge, softmax_state
from paged_cases import FORESTS, forest_batch, mixed_batch

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc not installed: the CUDA sources cannot be compiled here")


@pytest.fixture(autouse=True)
def kernel_library_in_tmp(monkeypatch, tmp_path):
    """The CUDA library file these tests write goes to the test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


# Hopper allocates registers per warp in units of 256: a 4-warp block at
# r registers a lane holds 4 * ceil(32 r / 256) * 256 of an SM's 65536.
def block_registers(registers: int, warps: int = 4) -> int:
    return warps * -(-32 * registers // 256) * 256


def warpgroup_block_warps(warps: int, quant) -> int:
    """The warps a warpgroup block of ``warps`` launches (int8's add the producer's)."""
    layout = replace(tile_plan.head_layout(16 * warps, warps, warps), warpgroup=True)
    return fused.block_threads(layout, quant) // 32


# A quantized format's name -> its codes' dtype name.
CODE_DTYPES = {"int8": "int8", "int4": "uint8"}


def partial_unit(pool: str, head_dim: int, warps_m: int, stacked: bool = False, block_size: int = 32,
                 q_dtype: str = "float32", stages: int | None = None, heads_on_n: bool = False) -> str:
    """The partial kernel's unit for a float pool (its dtype's name) or a quantized one ("int8", "int4");
    ``heads_on_n``: int8 pages' transposed products (at most 8 heads a block)."""
    p = cuda.KERNELS.platform
    element = CODE_DTYPES.get(pool, pool)
    names = fused.QUANTIZED_PARTIAL_INPUTS if pool in CODE_DTYPES else fused.PARTIAL_INPUTS
    dtypes = {"q": q_dtype, "k_pool": element, "v_pool": element}
    return translation_unit(
        "partial", cuda.LIBRARY, cuda.QUANTIZED_PARTIAL_CALL if pool in CODE_DTYPES else cuda.PARTIAL_CALL,
        [(name, dtypes.get(name, "float16" if name.endswith(("scales", "zeros")) else "int32")) for name in names],
        [("out", "float32"), ("out_lse", "float32")],
        [("T", element), ("TQ", q_dtype), ("D", head_dim), ("BLOCK", block_size), ("WM", warps_m),
         ("STACKED", stacked), ("HEADS_ON_N", heads_on_n), ("WARPS", p.warps), ("CHUNK", p.chunk_tokens),
         ("STAGES", stages or p.stages), ("SCALE_BITS", fused.scale_bits(head_dim ** -0.5))])


def partial_registers(tmp_path, pool: str, head_dim: int, warps_m: int, stacked: bool = False,
                      block_size: int = 32, q_dtype: str = "float32", stages: int | None = None) -> int:
    unit = partial_unit(pool, head_dim, warps_m, stacked, block_size, q_dtype, stages)
    registers, spills = resources(compile_unit(unit, tmp_path))
    assert spills == 0
    return registers


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim, warps_m, stacked, block_size", [
    ("bfloat16", 128, 1, False, 32), ("bfloat16", 128, 2, False, 32), ("bfloat16", 128, 1, False, 16),
    ("float16", 64, 1, False, 16), ("bfloat16", 128, tile_plan.LEVEL0_MAX_WARPS_M, True, 32),
])
def test_partial_kernel_fits_three_blocks_per_sm(tmp_path, pool, head_dim, warps_m, stacked, block_size):
    # Three blocks is what the staging memory allows (3 x 68 KB at D=128);
    # the last case is cascade level 0's layout.
    registers = partial_registers(tmp_path, pool, head_dim, warps_m, stacked, block_size)
    assert 3 * block_registers(registers) <= 65536


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim, warps_m, stacked, block_size, q_dtype", [
    ("int8", 128, 1, False, 32, "float32"), ("int8", 128, 2, False, 32, "bfloat16"), ("int8", 128, 1, False, 16, "float32"),
    ("int8", 64, 1, False, 16, "float16"), ("int8", 128, tile_plan.level0_max_warps_m(INT8), True, 32, "bfloat16"),
    ("int4", 128, 1, False, 32, "float32"), ("int4", 128, 1, False, 16, "bfloat16"), ("int4", 64, 1, False, 16, "float16"),
    ("int4", 64, 2, False, 32, "float32"), ("int4", 128, tile_plan.level0_max_warps_m(INT4), True, 32, "bfloat16"),
])
def test_quantized_partial_kernel_fits_three_blocks_per_sm(tmp_path, pool, head_dim, warps_m, stacked, block_size,
                                                            q_dtype):
    # The int8 and int4 variants (codes dequantized in registers) keep the
    # float kernel's budget: no spills, three blocks' registers per SM (their
    # staging is smaller: 37 KB int8, 33 KB int4 at D=128), flat layouts and
    # level 0's (int4 capped at one head-splitting warp: tile_plan).
    registers = partial_registers(tmp_path, pool, head_dim, warps_m, stacked, block_size, q_dtype)
    assert 3 * block_registers(registers) <= 65536
    assert cuda.KERNELS.platform.staging_bytes(head_dim, 4, INT8 if pool == "int8" else INT4) <= 227 * 1024 // 3


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim, q_dtype", [("int8", 128, "bfloat16"), ("int8", 128, "float32"),
                                                     ("int8", 64, "float16"), ("int4", 128, "bfloat16"),
                                                     ("int4", 64, "float32")])
def test_transposed_kernels_fit_their_resident_blocks(tmp_path, pool, head_dim, q_dtype):
    # Quantized pages under at most 8 heads a block (HEADS_ON_N): the heads
    # an n8 tile's columns hold half the accumulators and half of q's
    # fragments the m16 layout does. The blocks the tile plan counts on
    # (tile_plan.transposed_resident_blocks) are the ones an SM holds, by
    # registers and by staging memory, without spills, at the engine's pages
    # of 32 (int8 pages of 16 take 98 registers: four blocks): no more (their
    # waves would be short) and no fewer (the cut would count slots too few).
    quant = INT8 if pool == "int8" else INT4
    blocks = tile_plan.transposed_resident_blocks(quant, head_dim)
    unit = partial_unit(pool, head_dim, 1, q_dtype=q_dtype, heads_on_n=True)
    registers, spills = resources(compile_unit(unit, tmp_path, "sm_90a"))
    assert spills == 0
    by_registers = 65536 // block_registers(registers)
    by_memory = 227 * 1024 // (cuda.KERNELS.platform.staging_bytes(head_dim, 4, quant) + 1024)   # + the block's 1 KB
    assert blocks == min(by_registers, by_memory)


def warpgroup_unit(pool: str, head_dim: int, stages: int, q_dtype: str, warps: int) -> str:
    """The warpgroup kernel's unit for a float pool (its dtype's name) or int8 pages."""
    p = cuda.KERNELS.platform
    element = CODE_DTYPES.get(pool, pool)
    quantized = pool in CODE_DTYPES
    names = fused.QUANTIZED_PARTIAL_INPUTS if quantized else fused.PARTIAL_INPUTS
    dtypes = {"q": q_dtype, "k_pool": element, "v_pool": element}
    return translation_unit(
        "warpgroup_partial", cuda.LIBRARY,
        cuda.WARPGROUP_QUANTIZED_PARTIAL_CALL if quantized else cuda.WARPGROUP_PARTIAL_CALL,
        [(name, dtypes.get(name, "float16" if name.endswith(("scales", "zeros")) else "int32")) for name in names],
        [("out", "float32"), ("out_lse", "float32")],
        [("T", element), ("TQ", q_dtype), ("D", head_dim), ("BLOCK", 32), ("WM", warps), ("STACKED", True),
         ("HEADS_ON_N", False), ("WARPS", warps), ("CHUNK", p.chunk_tokens), ("STAGES", stages),
         ("SCALE_BITS", fused.scale_bits(head_dim ** -0.5))])


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim, q_dtype", [("bfloat16", 128, "bfloat16"), ("bfloat16", 128, "float32"),
                                                     ("float16", 64, "float16"), ("int8", 128, "bfloat16"),
                                                     ("int8", 64, "float16")])
@pytest.mark.parametrize("warps", [4, 8])
def test_warpgroup_kernel_fits_its_grids_share_of_an_sm(tmp_path, pool, head_dim, q_dtype, warps):
    # The level-0 grid (256 blocks of 4 warps, 128 of 8) puts about two
    # warpgroups on an SM: they fit, by registers and by shared memory (Q and
    # the double-buffered ring), without spills.
    assert_warpgroups_fit_an_sm(tmp_path, pool, head_dim, 2, q_dtype, warps)


def assert_warpgroups_fit_an_sm(tmp_path: Path, pool: str, head_dim: int, stages: int, q_dtype: str,
                                warps: int) -> None:
    """Two warpgroups' worth of blocks of ``warps`` (a level-0 grid's share of an SM) fit it by registers
    and by shared memory, without spills."""
    registers, spills = resources(compile_unit(warpgroup_unit(pool, head_dim, stages, q_dtype, warps), tmp_path,
                                               "sm_90a"))
    blocks = 8 // warps
    quant = INT8 if pool == "int8" else None
    assert spills == 0
    assert blocks * block_registers(registers, warpgroup_block_warps(warps, quant)) <= 65536
    assert blocks * cuda.KERNELS.platform.warpgroup_staging_bytes(head_dim, warps, stages, quant) <= 227 * 1024


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim", [("bfloat16", 128), ("int8", 128), ("int8", 64)])
@pytest.mark.parametrize("full", [True, False])
def test_each_formats_warpgroup_block_fits_an_sm(tmp_path, pool, head_dim, full):
    # The format's block as shipped (WARPGROUP_BLOCKS: int8 two warpgroups
    # and a ring of three), and its ring in a block of one warpgroup (a level
    # of 64 heads or fewer), fit a level-0 grid's share of an SM without spills.
    warpgroups, stages = fused.WARPGROUP_BLOCKS["int8" if pool == "int8" else None]
    assert_warpgroups_fit_an_sm(tmp_path, pool, head_dim, stages or cuda.KERNELS.platform.stages, "bfloat16",
                                4 * (warpgroups if full else 1))


def merged_unit(pool: str, head_dim: int, depths: int, member_is_row: bool) -> str:
    """The private level's unit that merges ``depths`` levels (q and the output bf16; quantized pages'
    products transposed, as the host launches them for 8 heads or fewer a block)."""
    p = cuda.KERNELS.platform
    quantized = pool in CODE_DTYPES
    element = CODE_DTYPES.get(pool, pool)
    names = (fused.QUANTIZED_PARTIAL_INPUTS if quantized else fused.PARTIAL_INPUTS) + fused.LEVEL_STATE_INPUTS
    dtypes = {"q": "bfloat16", "k_pool": element, "v_pool": element, "level_map": "int32", "indices": "int32",
              "last_page_len": "int32", "tiles": "int32", "members": "int32"}
    return translation_unit(
        "merged_partial", cuda.LIBRARY, cuda.MERGED_QUANTIZED_PARTIAL_CALL if quantized else cuda.MERGED_PARTIAL_CALL,
        [(n, dtypes.get(n, "float16" if n.endswith(("scales", "zeros")) else "float32")) for n in names],
        [("out", "bfloat16")],
        [("T", element), ("TQ", "bfloat16"), ("D", head_dim), ("BLOCK", 32), ("WM", 1), ("STACKED", False),
         ("HEADS_ON_N", quantized), ("WARPS", p.warps), ("CHUNK", p.chunk_tokens), ("STAGES", p.stages),
         ("SCALE_BITS", fused.scale_bits(head_dim ** -0.5)), ("DEPTHS", depths), ("MEMBER_IS_ROW", member_is_row),
         ("TO", "bfloat16")])


@needs_nvcc
@pytest.mark.parametrize("pool, head_dim, depths, member_is_row, blocks", [
    ("bfloat16", 128, 1, True, 3), ("float16", 64, fused.MAX_DEPTH, False, 3), ("int8", 128, 2, False, 2),
    ("int4", 128, 1, True, 2),
])
def test_the_merging_private_level_compiles(tmp_path, pool, head_dim, depths, member_is_row, blocks):
    # Its fold (the cascade merge's batches of 16 states) after the loop costs
    # registers: float pages keep three blocks an SM, quantized ones two (the
    # private level's 256 blocks are about two an SM).
    registers, spills = resources(compile_unit(merged_unit(pool, head_dim, depths, member_is_row), tmp_path))
    assert spills == 0 and blocks * block_registers(registers) <= 65536


@needs_nvcc
def test_the_library_compiles_for_devices_without_warpgroup_mma(tmp_path):
    # The library holds the wgmma wrappers as templates that only the
    # warpgroup kernel instantiates: the partial kernel builds for sm_80.
    registers, spills = resources(compile_unit(partial_unit("bfloat16", 128, 2, True), tmp_path, "sm_80"))
    assert registers > 0 and spills == 0


@pytest.mark.parametrize("per_block", [1, 2])
def test_stacked_levels_of_many_heads_take_the_warpgroup_kernel(monkeypatch, caplog, per_block):
    platform = replace(cuda.KERNELS.platform, warpgroup_device=lambda: True)
    kernels = fused.FusedKernels(platform)
    monkeypatch.delenv(fused.LEVEL0_KERNEL_ENV, raising=False)
    bf16 = AttentionShape(32, 8, 128, mx.bfloat16, mx.bfloat16, 32, 0.1)
    assert kernels.takes_warpgroup(bf16) and kernels.takes_warpgroup(replace(bf16, head_dim=64))
    assert not kernels.takes_warpgroup(replace(bf16, head_dim=96))
    assert kernels.takes_warpgroup(replace(bf16, pool_dtype=mx.int8))       # int8 pages, converted a chunk a block
    assert not kernels.takes_warpgroup(replace(bf16, pool_dtype=mx.uint8))  # int4 pages keep the partial kernel
    assert not fused.FusedKernels(replace(platform, warpgroup_quantized_partial_source="")).takes_warpgroup(
        replace(bf16, pool_dtype=mx.int8))                                  # a platform without the int8 variant
    assert not kernels.takes_warpgroup(bf16, level0_warps_m=2)            # a sweep of the partial kernel's layout
    assert not fused.FusedKernels(cuda.KERNELS.platform).takes_warpgroup(bf16) or cuda.hopper()
    monkeypatch.setenv(fused.LEVEL0_KERNEL_ENV, "mma")
    assert not kernels.takes_warpgroup(bf16)
    monkeypatch.setenv(fused.LEVEL0_KERNEL_ENV, "tensor")            # unknown: the default, warned once
    monkeypatch.setattr(fused, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="mlxcel.kernels.fused"):
        assert kernels.takes_warpgroup(bf16) and kernels.takes_warpgroup(bf16)
    assert [r.getMessage() for r in caplog.records] == [
        f"{fused.LEVEL0_KERNEL_ENV}='tensor': expected mma or warpgroup, using the default"]
    monkeypatch.delenv(fused.LEVEL0_KERNEL_ENV)
    # Rows of 4 heads a KV head behind one span: 256 stacked heads (64 rows)
    # are four warpgroups a tile, in blocks of up to the pages' format's
    # WARPGROUP_BLOCKS, 128 two, 64 one; a span of 8 members (32 heads)
    # keeps the partial kernel. The other format's blocks stay as set.
    private = PagedCsrView.from_host(host_csr([[1, 2]], [20], 16))
    span = PagedCsrView.from_host(host_csr([list(range(3, 19))], [256], 16))
    warps = 4 * per_block
    for quant, other in ((None, "int8"), (INT8, None)):
        monkeypatch.setitem(fused.WARPGROUP_BLOCKS, quant and quant.name, (per_block, None))
        monkeypatch.setitem(fused.WARPGROUP_BLOCKS, other, (3 - per_block, None))
        for members, blocks in ((64, (warps, warps, 4 // per_block)), (32, (warps, warps, 2 // per_block)),
                                (16, (4, 4, 1)), (8, None)):
            (layout, _), = kernels.cascade_levels(32, 8, private, [(span, np.arange(members)[None])],
                                                  quant=quant, warpgroup=True)[0]
            assert layout.warpgroup == (blocks is not None) and layout.heads == members * 4
            if blocks:
                assert (layout.warps, layout.warps_m, layout.groups) == blocks


@pytest.mark.parametrize("pool", [mx.bfloat16, mx.int8])
def test_each_formats_stacked_level_launches_its_warpgroup_block(monkeypatch, pool):
    # 32 members of 4 heads (128 stacked heads) behind one span: the level's
    # launch is the format's WARPGROUP_BLOCKS block (16-bit: two blocks of one
    # warpgroup a tile, a ring of the platform's chunks; int8: one of two, a
    # ring of three), its shared memory counted for that ring.
    made = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **spec: made.append(spec) or (lambda **_: []))
    monkeypatch.delenv(fused.LEVEL0_KERNEL_ENV, raising=False)
    platform = replace(cuda.KERNELS.platform, warpgroup_device=lambda: True)
    shape = AttentionShape(32, 8, 128, mx.bfloat16, pool, 16, 0.1)
    quant = shape.kv_quant
    private = PagedCsrView.from_host(host_csr([[19 + row] for row in range(32)], [1 + row % 16 for row in range(32)], 16))
    span = PagedCsrView.from_host(host_csr([list(range(3, 19))], [256], 16))
    step = fused.FusedKernels(platform).prepare_cascade(shape, 32, private, [(span, np.arange(32)[None])])
    warpgroups, stages = fused.WARPGROUP_BLOCKS[quant and quant.name]
    assert (warpgroups, stages) == ((2, 3) if quant else (1, None))
    options = step.levels[0].launch.options
    tiles = step.levels[0].geometry.size // 5
    assert options["threadgroup"][0] == 128 * warpgroups + (256 if quant else 0)   # int8: and the producers'
    assert options["grid"][0] == tiles * (2 // warpgroups) * options["threadgroup"][0]   # head groups a tile
    level = next(spec for spec in made if "warpgroup" in spec["name"])
    assert level["shared_memory"] == platform.warpgroup_staging_bytes(128, 4 * warpgroups, stages, quant)
    assert dict(options["template"])["STAGES"] == (stages or platform.stages)


@needs_nvcc
def test_four_head_splitting_warps_fit_two_blocks_per_sm(tmp_path):
    # Level 0 with four head-splitting warps (the sweeps' uncapped variant)
    # takes 176 registers: two of its blocks, about what its 256-block grid
    # puts on an SM, fit, without spills; a level-1 block beside them does
    # not (the shipped layout caps level 0 at two head-splitting warps).
    level0 = partial_registers(tmp_path, "bfloat16", 128, 4, stacked=True)
    assert 2 * block_registers(level0) <= 65536


@needs_nvcc
@pytest.mark.parametrize("dtype, head_dim", [("float32", 128), ("bfloat16", 128), ("float16", 64), ("float32", 96)])
def test_merge_kernel_compiles(tmp_path, dtype, head_dim):
    # Rows load as float4/float2/pairs/scalars by the lanes' width (D / 32).
    unit = translation_unit("merge", cuda.LIBRARY, cuda.MERGE_CALL,
                            [("v_in", dtype), ("lse_in", "float32"), ("indptr", "int32")],
                            [("out", "float32"), ("out_lse", "float32")],
                            [("TV", dtype), ("TL", "float32"), ("D", head_dim)])
    assert resources(compile_unit(unit, tmp_path))[1] == 0


def cascade_merge_unit(header: str, out: str, head_dim: int, group: int, depths: int, member_is_row: bool,
                       private_one: bool) -> str:
    inputs = [(name, "int32" if name in ("indptrp", "level_map") else "float32") for name in fused.CASCADE_MERGE_INPUTS]
    return translation_unit("cascade_merge", header, cuda.CASCADE_MERGE_CALL, inputs, [("out", out)],
                            [("TO", out), ("D", head_dim), ("G", group), ("DEPTHS", depths),
                             ("MEMBER_IS_ROW", member_is_row), ("PRIVATE_ONE", private_one)])


@needs_nvcc
@pytest.mark.parametrize("depths, member_is_row, private_one", [(1, True, True), (1, False, False), (3, False, True),
                                                                (fused.MAX_DEPTH, False, False)])
def test_cascade_merge_kernel_compiles(tmp_path, depths, member_is_row, private_one):
    unit = cascade_merge_unit(cuda.LIBRARY, "bfloat16", 128, 4, depths, member_is_row, private_one)
    assert resources(compile_unit(unit, tmp_path))[1] == 0


def test_cuda_launches_hand_mlx_an_include_and_a_call(monkeypatch):
    # MLX rebuilds and hashes a custom kernel's whole text on every launch:
    # the library goes to a file once, a launch carries a few hundred bytes.
    made = {}
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kwargs: made.update(kwargs))
    library = fused.compact_source(cuda.LIBRARY)
    cuda.make_kernel("k", fused.PARTIAL_INPUTS, fused.STATE_OUTPUTS, cuda.PARTIAL_CALL, library, 0)
    path = Path(re.fullmatch(r'#include "(.+)"\n', made["header"]).group(1))
    assert path.is_absolute() and path.read_text() == library
    assert len(made["header"]) + len(made["source"]) < 400 < len(library) // 20
    assert cuda.library_file(library) == path                                  # written once per text
    assert cuda.library_file(library + "\n") != path


def test_the_library_file_falls_back_to_the_temp_directory(monkeypatch, tmp_path):
    # A cache location that cannot hold a folder (here: a file) is skipped.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    path = cuda.library_file("// a library\n")
    assert path.parent.parent == tmp_path / "tmp" and path.read_text() == "// a library\n"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cuda.library_file("// a library\n").parent == tmp_path / "cache" / "mlxcel" / "kernels"


@needs_nvcc
def test_the_include_form_compiles(tmp_path):
    header = f'#include "{cuda.library_file(fused.compact_source(cuda.LIBRARY))}"\n'
    unit = cascade_merge_unit(header, "float16", 64, 8, 2, False, True)
    assert resources(compile_unit(unit, tmp_path))[1] == 0


def test_a_prepared_launch_passes_only_arrays(rng, monkeypatch):
    # A decode step that keeps its page layout passes only arrays: the tiles,
    # template constants and grids are built when the launch is prepared. The
    # kernels are stand-ins that record what each launch was given.
    launched = []

    def kernel(**_):
        def run(inputs, init_value, **options):
            launched.append(options)
            return [mx.zeros(shape, dtype) for shape, dtype in zip(options["output_shapes"], options["output_dtypes"])]
        return run
    monkeypatch.setattr(mx.fast, "cuda_kernel", kernel)
    kernels = fused.FusedKernels(cuda.KERNELS.platform)
    planned = []
    partial_launch = kernels.partial_launch
    monkeypatch.setattr(kernels, "partial_launch", lambda *args, **kw: planned.append(1) or partial_launch(*args, **kw))
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=mx.bfloat16, q_dtype=mx.bfloat16)
    plan = plan_cascade(case.csr, CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    assert plan.depth == 2                                  # two stacked levels, the private one merging
    layout = attention.cascade_layout(case.csr, plan)
    private = layout.private_view(case.csr)
    levels = layout.kernel_levels
    shape = AttentionShape.of(case.q, case.k_pool, 0.1)
    step = kernels.prepare_cascade(shape, case.csr.num_rows, private, levels)
    assert len(planned) == 3 and launched == []
    for _ in range(2):
        assert step(case.q, case.k_pool, case.v_pool, case.csr.last_page_len).shape == case.q.shape
    assert len(planned) == 3 and len(launched) == 6 and launched[3:] == launched[:3]   # nothing planned again
    assert launched[2]["output_shapes"] == [case.q.shape]  # the private level writes the step's output
    other = kernels.prepare_cascade(AttentionShape.of(case.q, case.k_pool, 0.2), case.csr.num_rows, private, levels)
    other(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    assert len(planned) == 6 and launched[6] != launched[0]                 # another scale: its own constants
    flat = kernels.prepare_partial(case.csr, shape)
    for _ in range(2):
        flat(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    assert len(planned) == 7


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_pools_launch_their_codes_scales_and_zeros(rng, monkeypatch, fmt):
    # A quantized pool's launches (flat and every cascade launch) hand the
    # partial kernel the codes as k_pool / v_pool and their scales and zeros
    # after them, in the kernel's input order; int8's zeros are one
    # placeholder. The kernel is made with those names and its own staging.
    # The launches of unstacked heads (4 a KV head here: flat, private level)
    # run the products transposed, the stacked levels' (64 heads) do not.
    made, launched = [], []

    def kernel(**spec):
        made.append(spec)

        def run(inputs, init_value, **options):
            launched.append((spec["input_names"], inputs, dict(options["template"])))
            return [mx.zeros(shape, dtype) for shape, dtype in zip(options["output_shapes"], options["output_dtypes"])]
        return run
    monkeypatch.setattr(mx.fast, "cuda_kernel", kernel)
    kernels = fused.FusedKernels(cuda.KERNELS.platform)
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=fmt, q_dtype=mx.bfloat16)
    assert isinstance(case.k_pool, QuantizedPages)
    shape = AttentionShape.of(case.q, case.k_pool, 0.1)
    plan = plan_cascade(case.csr, CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    layout = attention.cascade_layout(case.csr, plan)
    step = kernels.prepare_cascade(shape, case.csr.num_rows, layout.private_view(case.csr), layout.kernel_levels)
    step(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    kernels.prepare_partial(case.csr, shape)(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    partials = [(names, inputs) for names, inputs, _ in launched if names[0] == "q"]
    assert len(partials) == plan.depth + 2                 # the stacked levels, the private level, the flat launch
    templates = [template for names, _, template in launched if names[0] == "q"]
    assert [t["HEADS_ON_N"] for t in templates] == [not t["STACKED"] for t in templates]
    assert [t["STACKED"] for t in templates] == [True] * plan.depth + [False, False]
    quantized = len(fused.QUANTIZED_PARTIAL_INPUTS)
    # The private level (a tile a row here) merges: the levels' states after the pages' inputs.
    assert [names[quantized:] for names, _ in partials] == [[]] * plan.depth + [fused.LEVEL_STATE_INPUTS, []]
    for names, inputs in partials:
        assert names[:quantized] == fused.QUANTIZED_PARTIAL_INPUTS
        given = dict(zip(names, inputs))
        for side, pool in (("k", case.k_pool), ("v", case.v_pool)):
            assert given[f"{side}_pool"] is pool.codes and given[f"{side}_scales"] is pool.scales
            zeros = given[f"{side}_zeros"]
            assert zeros is pool.zeros if fmt == "int4" else (zeros.shape == (1,) and pool.zeros is None)
    quant = INT8 if fmt == "int8" else INT4
    partial_kernel = next(spec for spec in made if spec["input_names"][0] == "q")
    assert partial_kernel["shared_memory"] == cuda.KERNELS.platform.staging_bytes(128, 4, quant)


def test_a_cascade_of_the_same_levels_prepares_only_its_private_level(rng, monkeypatch):
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **_: (lambda inputs, init_value, **options: [
        mx.zeros(shape, dtype) for shape, dtype in zip(options["output_shapes"], options["output_dtypes"])]))
    kernels = fused.FusedKernels(cuda.KERNELS.platform)
    planned = []
    partial_launch = kernels.partial_launch
    monkeypatch.setattr(kernels, "partial_launch", lambda *args, **kw: planned.append(kw["stacked"]) or
                        partial_launch(*args, **kw))
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=mx.bfloat16, q_dtype=mx.bfloat16)
    plan = plan_cascade(case.csr, CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    layout = attention.cascade_layout(case.csr, plan)
    shape = AttentionShape.of(case.q, case.k_pool, 0.1)
    first = kernels.prepare_cascade(shape, case.csr.num_rows, layout.private_view(case.csr), layout.kernel_levels)
    again = kernels.prepare_cascade(shape, case.csr.num_rows, layout.private_view(case.csr), layout.kernel_levels,
                                    reuse=first)
    assert planned == [True, True, False, False]                 # the stacked levels once, the private one twice
    assert again.levels is first.levels and again.level_map is first.level_map


def test_a_cascade_rebound_to_a_grown_layout_launches_what_the_grown_one_does(rng, monkeypatch):
    # A decoder layer's trace (layer_halves) bakes in a cascade's launches and takes its arrays as inputs. A
    # row that grew a page must keep the signature and every array's shape (the private page ids padded),
    # so the trace replays; and the first cascade rebound to the grown layout's arrays must launch exactly
    # what the grown cascade does (the same options, the same arrays).
    launched, outputs = [], []

    def kernel(**_):
        def run(inputs, init_value, **options):
            launched.append((options, inputs))
            outputs.extend(mx.zeros(shape, dtype) for shape, dtype in zip(options["output_shapes"],
                                                                          options["output_dtypes"]))
            return outputs[-len(options["output_shapes"]):]
        return run
    monkeypatch.setattr(mx.fast, "cuda_kernel", kernel)
    bs, rows = 16, 4
    ids = iter(int(b) for b in rng.permutation(64))
    shared = [next(ids) for _ in range(5)]
    tables = [shared + [next(ids) for _ in range(2)] for _ in range(rows)]
    lengths = [6 * bs + int(rng.integers(1, bs + 1)) for _ in range(rows)]
    grown_tables = [tables[0] + [next(ids)], *tables[1:]]
    grown_lengths = [7 * bs + 1, *lengths[1:]]
    shape = AttentionShape(8, 2, 64, mx.bfloat16, mx.bfloat16, bs, 0.125)
    csr = kernels.PagedCsrView.from_host(kernels.host_csr(tables, lengths, bs))
    grown = kernels.PagedCsrView.from_host(kernels.host_csr(grown_tables, grown_lengths, bs))
    plan = plan_cascade(csr, CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    assert plan is not None and plan == plan_cascade(grown, CascadeConfig(enabled=True, min_shared_pages=2,
                                                                          min_members=2))
    fused_kernels = fused.FusedKernels(cuda.KERNELS.platform)
    layout = attention.cascade_layout(csr, plan)
    first = fused_kernels.prepare_cascade(shape, rows, layout.private_view(csr), layout.kernel_levels)
    grown_layout = attention.cascade_layout(grown, plan, layout)
    second = fused_kernels.prepare_cascade(shape, rows, grown_layout.private_view(grown), grown_layout.kernel_levels,
                                           reuse=first)
    assert second.signature == first.signature
    assert [a.shape for a in second.arrays()] == [a.shape for a in first.arrays()]
    assert np.array(second.private_indices).tolist() != np.array(first.private_indices).tolist()   # the new page
    assert first.rebind(first.arrays()).arrays() == first.arrays()
    q = mx.array(rng.standard_normal((rows, 8, 64)), dtype=mx.bfloat16)
    pool = mx.zeros((64, bs, 2, 64), mx.bfloat16)
    for step in (second, first.rebind(second.arrays())):
        step(q, pool, pool, grown.last_page_len)
    half = len(launched) // 2
    assert half == 2                                          # level 0, the private level merging
    made = {id(a): i % (len(outputs) // 2) for i, a in enumerate(outputs)}   # an output: its place in its run
    for (options, inputs), (rebound_options, rebound_inputs) in zip(launched[:half], launched[half:]):
        assert rebound_options == options and len(rebound_inputs) == len(inputs)
        for a, b in zip(inputs, rebound_inputs):
            assert a is b or made.get(id(a), -1) == made.get(id(b), -2)    # the same array, or the same state


def tile_states(q, k_pool, v_pool, view, geometry, members, kv_heads):
    """The partial kernel's output as its geometry and member table define it,
    in float64: [tiles, Hkv * heads, D] and [tiles, Hkv * heads], heads = M * G
    (stacked, member m's head kv * G + g at kv * (M * G) + m * G + g) or G."""
    q, k_pool, v_pool = as_float64(q), as_float64(k_pool), as_float64(v_pool)
    hq, block = q.shape[1], k_pool.shape[1]
    group = hq // kv_heads
    width = 1 if members is None else members.shape[1]
    os, lses = [], []
    for row, first, pages, first_slot, holds_last in np.array(geometry):
        ids = view.host.indices[first:first + pages]
        end = pages * block - (block - view.host.last_page_len[row] if holds_last else 0)
        k = k_pool[ids].reshape(-1, *k_pool.shape[2:])[first_slot:end]
        v = v_pool[ids].reshape(-1, *v_pool.shape[2:])[first_slot:end]
        rows = [row] if members is None else list(members[row])
        o = np.zeros((kv_heads, width, group, q.shape[2]))
        lse = np.zeros((kv_heads, width, group))
        for m, member in enumerate(rows):
            state_o, state_lse = softmax_state(q[member], k, v, 1 / np.sqrt(q.shape[2]))
            o[:, m] = state_o.reshape(kv_heads, group, -1)
            lse[:, m] = state_lse.reshape(kv_heads, group)
        os.append(o.reshape(kv_heads * width * group, -1))
        lses.append(lse.reshape(-1))
    return np.stack(os), np.stack(lses)


@pytest.mark.parametrize("forest, pages", [("two groups", mx.float32), ("three deep beside a group", mx.float32),
                                           ("three deep beside a group", "int4")])
def test_the_cascade_merge_map_folds_each_rows_span_tiles(rng, monkeypatch, forest, pages):
    # The fused cascade's host side (tile plans, member tables, level map) with
    # the kernels modelled in float64 from the arrays they are given: each
    # row's private tiles plus, at each depth, its span's tiles at the
    # member's stacked head must fold into the flat result.
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **_: (lambda inputs, init_value, **options: [
        mx.zeros(shape, dtype) for shape, dtype in zip(options["output_shapes"], options["output_dtypes"])]))
    # (int4 pages: level 0 at one head-splitting warp, so more head groups.)
    case, _ = forest_batch(rng, FORESTS[forest][0], block_size=16, kv_heads=2, group=4, head_dim=64, dtype=pages)
    plan = plan_cascade(case.csr, CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    layout = attention.cascade_layout(case.csr, plan)
    shape = AttentionShape.of(case.q, case.k_pool, 64 ** -0.5)
    private = layout.private_view(case.csr)
    # Two-page tiles for the stacked levels: spans cut into several tiles.
    step = fused.FusedKernels(cuda.KERNELS.platform).prepare_cascade(shape, case.csr.num_rows, private,
                                                                     layout.kernel_levels, level0_pages=2)
    levels = [tile_states(case.q, case.k_pool, case.v_pool, lv.view, lv.geometry, np.array(lv.members), 2)
              for lv in step.levels]
    assert any(len(np.array(lv.geometry)) > len(lv.view.host.indptr) - 1 for lv in step.levels)  # split spans
    op, lsep = tile_states(case.q, case.k_pool, case.v_pool, private, step.geometry_private, None, 2)
    level_map, indptr = np.array(step.level_map), np.array(step.indptr_private)
    hq, group = case.q.shape[1], 4
    out = np.zeros(case.q.shape)
    for row in range(case.csr.num_rows):
        for head in range(hq):
            states = [(op[t, head], lsep[t, head]) for t in range(indptr[row], indptr[row + 1])]
            for depth, (o, lse) in enumerate(levels):
                first, count, slot = level_map[row, depth]
                width = o.shape[1] // hq
                at = (head // group) * (width * group) + slot * group + head % group
                states += [(o[t, at], lse[t, at]) for t in range(first, first + count)]
            v, _ = reference_merge(np.stack([s[0] for s in states])[:, None], np.stack([s[1] for s in states])[:, None],
                                   [0, len(states)])
            out[row, head] = v[0, 0]
    np.testing.assert_allclose(out, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale),
                               atol=1e-9, rtol=0)


def sections(source: str) -> list[str]:
    """Section titles, without the platform's fragment-layout notes in parentheses."""
    return [title.split(" (")[0] for title in re.findall(r"// ---- (.+?) ----", source)]


def test_metal_twin_has_the_cuda_sections_in_order():
    assert sections(metal.PARTIAL_SOURCE) == sections(cuda.PARTIAL_SOURCE)
    assert len(sections(cuda.PARTIAL_SOURCE)) == 7
    # One body for every page format on both platforms: a float pool's Metal
    # kernel binds no scales, a quantized one binds every scale input.
    platform = metal.KERNELS.platform
    assert platform.partial_source.endswith(metal.PARTIAL_SOURCE)
    assert platform.quantized_partial_source.endswith(metal.PARTIAL_SOURCE)
    scale_inputs = [n for n in fused.QUANTIZED_PARTIAL_INPUTS if n not in fused.PARTIAL_INPUTS]
    assert scale_inputs == ["k_scales", "v_scales", "k_zeros", "v_zeros"]
    bound = platform.quantized_partial_source[:-len(metal.PARTIAL_SOURCE)]
    unbound = platform.partial_source[:-len(metal.PARTIAL_SOURCE)]
    assert all(f"{name}," in bound or f"{name}}}" in bound for name in scale_inputs)
    assert not any(name in unbound for name in scale_inputs)
    assert all(name in cuda.QUANTIZED_PARTIAL_CALL for name in scale_inputs)
    assert not any(name in cuda.PARTIAL_CALL for name in scale_inputs)
    for name in ("PARTIAL_SOURCE", "MERGE_SOURCE", "CASCADE_MERGE_SOURCE", "cascade_decode", "takes"):
        assert hasattr(metal, name) and hasattr(cuda, name)


def test_only_cuda_transposes_and_cuts_those_launches_by_waves():
    # CUDA runs quantized pages under at most 8 heads a block transposed, its
    # flat tiles cut by the waves of the kernel's resident blocks; Metal's
    # twin keeps the m16 layout and TARGET_BLOCKS' cut; float pages, stacked
    # levels and 16-head blocks stay on the m16 layout everywhere.
    few, many = tile_plan.head_layout(4, 4), tile_plan.head_layout(16, 4)
    assert cuda.KERNELS.transposed(few, INT8, False) and cuda.KERNELS.transposed(few, INT4, False)
    assert not cuda.KERNELS.transposed(few, INT8, True) and not cuda.KERNELS.transposed(many, INT8, False)
    assert not cuda.KERNELS.transposed(few, None, False) and not metal.KERNELS.transposed(few, INT8, False)
    assert cuda.KERNELS.flat_resident(few, INT8, 128) == 5 and cuda.KERNELS.flat_resident(few, INT4, 128) == 4
    assert cuda.KERNELS.flat_resident(few, INT8, 64) == 7 and cuda.KERNELS.flat_resident(few, INT4, 64) == 6
    assert cuda.KERNELS.flat_resident(few, None, 128) is None and metal.KERNELS.flat_resident(few, INT8, 128) is None


def test_metal_sizes_its_state_rows_as_the_host_does():
    # The Metal kernel declares its threadgroup array itself: its state rows
    # must hold what the CUDA kernel and the host's staging_bytes count.
    extra = re.search(r"STATE_WORDS = WARPS \* 16 \* \(D \+ (\d+)\)", metal.PARTIAL_SOURCE)
    assert extra and int(extra.group(1)) == fused.STATE_EXTRA_FLOATS


def test_staging_fits_each_platform():
    cuda_platform, metal_platform = cuda.KERNELS.platform, metal.KERNELS.platform
    assert cuda_platform.staging_bytes(128, cuda_platform.warps) <= 227 * 1024 // 3   # three blocks per H100/H200 SM
    assert metal_platform.staging_bytes(128, metal_platform.warps) <= 32 * 1024       # Apple's threadgroup memory


def test_quantized_staging_counts_codes_rows_and_scales():
    # The CUDA kernels' stage (CODE_STRIDE, ScaleRows) as the
    # host counts it, two stages of 64 tokens: int8 rows of D + 16 bytes and a
    # 4-byte scale word per token for K and V; int4 rows of D/2 + 16 and
    # D/32 scales and zeros; at most the float stage, never below the states.
    p = cuda.KERNELS.platform
    states = 4 * 16 * (128 + fused.STATE_EXTRA_FLOATS) * 4
    assert p.staging_bytes(128, 4, INT8) == 2 * 64 * (2 * 144 + 2 * 4) > states
    assert p.staging_bytes(64, 4, INT8) == 2 * 64 * (2 * 80 + 2 * 4)
    assert p.staging_bytes(128, 4, INT4) == states > 2 * 64 * (2 * 80 + 4 * 8)
    assert p.staging_bytes(128, 4, INT8) < p.staging_bytes(128, 4)
    # The warpgroup kernel's int8 ring holds the same stages beside Q and one chunk's converted K and V (blocks of
    # two warpgroups: two chunks').
    assert p.warpgroup_staging_bytes(128, 4, quant=INT8) == (64 + 2 * 64) * 128 * 2 + 2 * 64 * (2 * 144 + 2 * 4) + 1024
    assert p.warpgroup_staging_bytes(128, 8, quant=INT8) == (128 + 4 * 64) * 128 * 2 + 2 * 64 * (2 * 144 + 2 * 4) + 1024
    for name in ("BYTES = AFFINE ? D / 32 * 2 : 4", "ARRAYS = AFFINE ? 4 : 2"):
        assert name in cuda.LIBRARY                  # ScaleRows, the stage's scales both kernels copy and read
    assert "CODE_STRIDE = ROW_BYTES + 16" in cuda.PARTIAL_SOURCE
    assert "CODE_STRIDE = ROW_BYTES + 16" in cuda.WARPGROUP_PARTIAL_SOURCE
    assert fused.CODE_ROW_PAD == 16 and "STRIDE = Format::ROW_BYTES + 16" in metal.PARTIAL_SOURCE


def test_eight_warp_blocks_fit_their_states_in_the_staging_memory():
    # Level-0 sweeps launch 8-warp blocks: their states reuse the same memory.
    p = cuda.KERNELS.platform
    assert p.staging_bytes(128, 8) == p.staging_bytes(128, 4)


def test_cuda_is_dispatched_and_metal_only_on_request(monkeypatch, caplog):
    monkeypatch.delenv("MLXCEL_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "_gpu_platform", lambda: "cuda")
    assert kernels.backend() is cuda
    monkeypatch.setattr(kernels, "_gpu_platform", lambda: "metal")
    assert kernels.backend() is portable
    monkeypatch.setenv("MLXCEL_KERNELS", "fused")
    assert kernels.backend() is metal
    monkeypatch.setenv("MLXCEL_KERNELS", "portable")
    assert kernels.backend() is portable


@pytest.mark.parametrize("dtype", [mx.float32])
def test_pools_the_kernel_does_not_take_go_through_the_portable_kernels(rng, dtype):
    # float32 pools never reach the matrix-unit kernel: same result as portable, on any device.
    case = mixed_batch(rng, block_size=16, group=4, head_dim=64, dtype=dtype)
    assert fused.unsupported(AttentionShape.of(case.q, case.k_pool, case.scale)) is not None
    got = cuda.paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    want = portable.paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def shape(head_dim, pool_dtype, heads=8, kv_heads=2, block_size=16):
    return AttentionShape(heads, kv_heads, head_dim, mx.float32, pool_dtype, block_size, head_dim ** -0.5)


def test_unsupported_reasons():
    for d in (80, 256):
        assert f"head dim {d}" in fused.unsupported(shape(d, mx.bfloat16))
    assert "pool dtype" in fused.unsupported(shape(64, mx.float32))
    assert fused.unsupported(shape(128, mx.float16)) is None
    # Quantized pools (their codes' dtype): int8 and int4 at D 64 and 128, pages of an even size.
    for codes in (mx.int8, mx.uint8):
        for d in (64, 128):
            assert fused.unsupported(shape(d, codes)) is None
        for d in (32, 96):
            assert f"head dim {d}" in fused.unsupported(shape(d, codes))
        assert "block size 15" in fused.unsupported(shape(128, codes, block_size=15))
        assert cuda.takes(shape(128, codes))


def test_groups_of_one_merge_without_a_kernel(rng):
    v_in = mx.array(rng.standard_normal((3, 4, 64)).astype(np.float32))
    lse_in = mx.array(rng.standard_normal((3, 4)).astype(np.float32))
    v, lse = cuda.merge_states(v_in, lse_in, np.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(np.array(v), np.array(v_in))
    np.testing.assert_array_equal(np.array(lse), np.array(lse_in))


def test_compact_source_keeps_code_lines_and_drops_comments():
    text = "  // why\n  #pragma unroll\n\n  for (int i = 0; i < 4; ++i) x += i;   // sum\n"
    assert fused.compact_source(text) == "#pragma unroll\nfor (int i = 0; i < 4; ++i) x += i;\n"
    # MLX hashes a kernel's source on every launch: the shipped text is much shorter.
    assert len(fused.compact_source(cuda.PARTIAL_SOURCE)) < 0.8 * len(cuda.PARTIAL_SOURCE)


def test_scale_is_baked_in_log2_units():
    bits = fused.scale_bits(0.125)
    assert np.array([bits], np.int32).view(np.float32)[0] == np.float32(0.125 / np.log(2.0))


def test_poison_comes_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(fused.POISON_ENV, "nan")
    assert np.isnan(fused.poison_from_env())
    monkeypatch.delenv(fused.POISON_ENV)
    with caplog.at_level(logging.WARNING):
        assert fused.poison_from_env() is None


def test_the_fused_cascade_takes_up_to_max_depth_levels(monkeypatch):
    monkeypatch.setattr(kernels, "_gpu_platform", lambda: "cuda")
    serving = shape(128, mx.bfloat16, heads=32, kv_heads=8, block_size=32)
    assert kernels.cascade_max_depth(serving) == fused.MAX_DEPTH == len(
        [n for n in fused.CASCADE_MERGE_INPUTS if n.startswith("lse") and n[3:].isdigit()])
    # Shapes the fused kernels do not take compose the levels: any depth.
    assert kernels.cascade_max_depth(shape(128, mx.float32, heads=32, kv_heads=8, block_size=32)) is None
    monkeypatch.setattr(kernels, "_gpu_platform", lambda: None)
    assert kernels.cascade_max_depth(serving) is None
    with pytest.raises(ValueError, match="1 to 4 levels"):
        cuda.KERNELS.prepare_cascade(serving, 2, None, [None] * 5)


def byte_perm(x: np.ndarray, y: int, selector: int) -> np.ndarray:
    """CUDA's __byte_perm(x, y, s): result byte i is byte (s >> 4i) & 7 of the 8 bytes y:x."""
    pool = (np.uint64(y) << np.uint64(32)) | x.astype(np.uint64)
    out = np.zeros_like(x)
    for i in range(4):
        byte = (pool >> np.uint64(8 * ((selector >> (4 * i)) & 7))) & np.uint64(0xFF)
        out |= byte.astype(np.uint32) << np.uint32(8 * i)
    return out


def halves(words: np.ndarray) -> np.ndarray:
    """uint32 words as their two float16 halves (low first), in float64."""
    return words.astype("<u4").view("<f2").astype(np.float64).reshape(-1, 2)


def f16_fma(a, b, c) -> np.ndarray:
    """HFMA2 per half: a * b + c, one rounding to float16 (exact in float64 for these operands)."""
    return (a * b + c).astype(np.float16).astype(np.float64)


def test_int8_pairs_convert_every_code_exactly():
    # int8_pair: the codes' bytes with their sign bits flipped, bytes placed
    # under 0x64 by the selector, minus 0x6480 (1152): every code in every
    # byte of a word, by each selector the kernel uses, comes out exact.
    source = cuda.HEADER[cuda.HEADER.index("__half2 int8_pair"):]
    magic, bias = (int(x, 16) for x in re.search(r"0x(6464\w+)u, SELECTOR\)\), as_half2\(0x(\w+)u", source).groups())
    codes = np.arange(-128, 128)
    for selector, picked in ((0x4140, (0, 1)), (0x4342, (2, 3)), (0x4240, (0, 2)), (0x4341, (1, 3))):
        for shift in range(4):   # the code under test in byte `shift`, other bytes random-ish
            others = (0x5A3C_E17F ^ (0x01010101 * shift)) & ~np.uint32(0xFF << (8 * shift)) & 0xFFFFFFFF
            words = (np.uint32(others) | ((codes.astype(np.uint32) & 0xFF) << np.uint32(8 * shift))).astype(np.uint32)
            flipped = words ^ np.uint32(0x80808080)
            got = halves(byte_perm(flipped, magic, selector)) - halves(np.array([bias], np.uint32))[0]
            expect = np.stack([((words >> np.uint32(8 * b)) & 0xFF).astype(np.uint8).view(np.int8) for b in picked], 1)
            np.testing.assert_array_equal(got, expect.astype(np.float64))


def test_nibble_pairs_convert_every_code_exactly():
    # nibble_pairs (Marlin's conversion): masks under 0x64006400, pairs 1 and
    # 3 at bits 4..7 scaled by 1/16 - 64, pairs 2 and 3 from the word shifted
    # by 8. Every nibble value at every position of a word comes out exact.
    source = cuda.HEADER[cuda.HEADER.index("void nibble_pairs"):]
    source = source[:source.index("\n}\n")]
    assert "w >> 8" in source and source.count("0x64006400u") == 1
    constants = dict(re.findall(r"(\w+) = as_half2\(0x(\w+)u\)", source))
    bias, sixteenth, minus_64 = (halves(np.array([int(constants[n], 16)], np.uint32))[0]
                                 for n in ("bias", "sixteenth", "minus_64"))
    masks = [int(m, 16) for m in re.findall(r"masked_under_bias<0x(\w+)u>\((?:w|high)\)", source)]
    assert masks == [0x000F000F, 0x00F000F0, 0x000F000F, 0x00F000F0]
    lut = int(re.search(r'lop3\.b32 %0, %1, %2, %3, (0x\w+);', cuda.HEADER).group(1), 16)
    assert lut == (0xF0 & 0xCC) | 0xAA                  # (a & b) | c

    def masked(w, mask):
        return (w & np.uint32(mask)) | np.uint32(0x64006400)

    rng = np.random.default_rng(7)
    words = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    words[:16] = np.uint32(0x11111111) * np.arange(16, dtype=np.uint32)      # every nibble value everywhere
    high = words >> np.uint32(8)
    got = [halves(masked(words, masks[0])) - bias,
           f16_fma(halves(masked(words, masks[1])), sixteenth, minus_64),
           halves(masked(high, masks[2])) - bias,
           f16_fma(halves(masked(high, masks[3])), sixteenth, minus_64)]
    for j in range(4):   # pair j: the nibbles at bits 4j..4j+3 of each 16-bit half
        expect = np.stack([(words >> np.uint32(16 * h + 4 * j)) & np.uint32(0xF) for h in (0, 1)], 1)
        np.testing.assert_array_equal(got[j], expect.astype(np.float64))
