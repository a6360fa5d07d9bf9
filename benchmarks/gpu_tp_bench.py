"""Tensor-parallel serving measured (issue 25): N GPUs against one, cascade on and off.

    python benchmarks/gpu_tp_bench.py --out OUTDIR [--ranks 2]

A random-weight Qwen3-32B-shaped model (64 layers, hidden 5120, 64 query / 8
KV heads of 128, MLP 25600, bf16, the embedded 1024-token vocabulary) is
mlx-lm's own Qwen3 class with its random initialization, built in memory on
every rank from one seed (so every rank holds the same weights before
``shard()``); 32 sessions behind an 8K shared prefix, 96 greedy tokens each.

Arms: the engine on ``--ranks`` GPUs tensor-parallel (this script again under
``mlx.launch --backend nccl -n RANKS``, NCCL_NVLS_ENABLE=0) with cascade on and
off, then on one GPU in this process with cascade on and off. Every arm's
tokens are scored teacher-forced by mlx-lm's stock model (as in
gpu_e2e_bench.py). Reported per arm: decode tok/s, median step wall, peak
memory per rank; for the tensor-parallel arms the collectives of one decode
step timed alone and GPU busy per GPU (nvidia-smi sampled while they run);
the byte floor of a step per GPU (its weights and the KV a flat or cascade
step reads, once) at the copy bandwidth measured in the same run.

``--ranks 1`` runs the NCCL set-up with one rank (the smoke test on one GPU).
``--backend ring`` and the shape options run the same path on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
from mlx_lm.utils import _get_classes, load_config, load_tokenizer  # noqa: E402

from gpu_e2e_bench import prompts, release, run_engine, teacher_forced  # noqa: E402
from mlxcel.engine.config import CascadeConfig, EngineConfig  # noqa: E402
from mlxcel.engine.engine import Engine  # noqa: E402
from mlxcel.engine.model import on_pool  # noqa: E402
from mlxcel.engine.random_model import generate_random_model  # noqa: E402

QWEN3_32B = dict(num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8, head_dim=128,
                 intermediate_size=25600)
SEED = 0
BLOCK_SIZE = 32


def build(model_dir: Path, shape: dict, group=None):
    """(stock mlx-lm model, the engine's LoadedModel); with a group, the LoadedModel is this rank's shard."""
    generate_random_model(model_dir, model_type="qwen3", **{**shape, "num_layers": 1}, seed=SEED,
                          dtype="bfloat16")   # only the config and tokenizer files: the weights are built here
    config = load_config(model_dir)
    config["num_hidden_layers"] = shape["num_layers"]
    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)   # every rank draws the same weights
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16)
    if group is not None:
        model.shard(group)
    loaded = on_pool(model, load_tokenizer(model_dir), "qwen3-32b-random", model_dir, "qwen3")
    mx.eval(model.parameters())
    return loaded


def pool_pages(batch, shared: int, new_tokens: int) -> int:
    own = max(len(p) - shared for p in batch) + new_tokens
    return shared // BLOCK_SIZE + len(batch) * (-(-own // BLOCK_SIZE) + 1) + 64


def engine_config(pages: int, batch) -> EngineConfig:
    return EngineConfig(block_size=BLOCK_SIZE, num_blocks=pages, max_running=len(batch), max_batched_tokens=2048)


def collectives_per_step(group, batch: int, shape: dict, repeats: int = 50) -> float:
    """Seconds of one decode step's collectives timed alone: two [batch, hidden] bf16 all_sums a layer, the
    step message and the tokens."""
    from mlxcel.engine.tensor_parallel import FIRST_WORDS

    hidden = mx.random.normal((batch, 1, shape["hidden_size"])).astype(mx.bfloat16)
    small = [mx.zeros((FIRST_WORDS,), mx.int32), mx.zeros((batch,), mx.int32)]

    def step():
        for _ in range(2 * shape["num_layers"]):
            mx.eval(mx.distributed.all_sum(hidden, group=group))
        for x in small:
            mx.eval(mx.distributed.all_sum(x, group=group))

    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child(args, shape: dict) -> None:
    """One rank of the tensor-parallel arms (under mlx.launch)."""
    from mlxcel.engine.pool import BlockPool, PoolGeometry
    from mlxcel.engine.runner import ModelRunner
    from mlxcel.engine.tensor_parallel import Ranks, follow, model_facts

    ranks = Ranks.join()
    loaded = build(Path(args.out) / "model", shape, ranks.group)
    batch = prompts(args.sessions, args.shared, args.suffix)
    collective_s = collectives_per_step(ranks.group, args.sessions, shape)
    report = {"ranks": ranks.size, "backend": ranks.backend, "collectives_per_step_ms": 1e3 * collective_s}
    for cascade in (True, False):
        name = f"tp{ranks.size}_cascade_{'on' if cascade else 'off'}"
        if not ranks.is_leader:
            facts = ranks.share_pool(model_facts(loaded), None)
            geometry = PoolGeometry(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, facts.block_size,
                                    getattr(mx, facts.dtype))
            follow(ModelRunner(loaded, BlockPool(geometry, facts.num_blocks), ranks), ranks)
            continue
        engine = Engine(loaded, engine_config(pool_pages(batch, args.shared, args.new_tokens), batch),
                        cascade=CascadeConfig(enabled=cascade, min_shared_pages=16, min_members=2), ranks=ranks)
        result = run_engine(engine, batch, args.new_tokens)
        result["peak_memory_per_rank_gb"] = [peak / 1e9 for _, peak in ranks.memory()]
        engine.shutdown()
        release(engine)
        report[name] = result
        print(name, json.dumps({k: v for k, v in result.items() if k != "tokens"}), flush=True)
    if ranks.is_leader:
        (Path(args.out) / "tp.json").write_text(json.dumps(report))


def copy_bandwidth(gib: float) -> float:
    """Bytes/s of reading and writing a ``gib`` GiB bf16 array once (the byte floor's bandwidth)."""
    rows = int(gib * (1 << 30)) // 2 // 4096      # 2-D: a 4 GiB array has more elements than an int32 dimension
    x = mx.random.normal((rows, 4096)).astype(mx.bfloat16)
    mx.eval(x)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mx.eval(x + 1)
        times.append(time.perf_counter() - start)
    del x
    return 2 * rows * 4096 * 2 / min(times)


def byte_floor_ms(shape: dict, ranks: int, sessions: int, shared: int, private: int, cascade: bool,
                  bandwidth: float) -> float:
    """One decode step's bytes per GPU read once (weights and KV) at ``bandwidth``."""
    h, mlp, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_heads"] * d, shape["num_kv_heads"] * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * mlp
    weights = 2 * (shape["num_layers"] * per_layer / ranks + 1024 * h)
    kv_token = 2 * shape["num_layers"] * 2 * kv / ranks
    tokens = shared + sessions * private if cascade else sessions * (shared + private)
    return 1e3 * (weights + tokens * kv_token) / bandwidth


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--shared", type=int, default=8192)
    parser.add_argument("--suffix", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--bandwidth-gib", type=float, default=4.0)
    for key, value in QWEN3_32B.items():
        parser.add_argument("--" + key.replace("_", "-"), type=int, default=value)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = {key: getattr(args, key) for key in QWEN3_32B}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args, shape)

    from mlxcel_tui.launch import free_ports

    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    ports = ["--nccl-port", str(free_ports(1))] if args.backend == "nccl" else ["-p", str(free_ports(args.ranks))]
    launcher = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()",
                "--backend", args.backend, "-n", str(args.ranks), *ports, "--",
                sys.executable, __file__, "--child", *sys.argv[1:]]
    smi = None
    if args.backend == "nccl":
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                "--format=csv,noheader,nounits", "-lms", "200"],
                               stdout=open(out / "nvidia-smi.csv", "w"))
    started = time.time()
    done = subprocess.run(launcher, env=env, stdin=subprocess.PIPE, capture_output=True, text=True)
    if smi is not None:
        smi.terminate()
    (out / "tp.log").write_text(done.stdout + done.stderr)
    if not (out / "tp.json").exists():
        sys.exit(f"the tensor-parallel arms failed (see {out / 'tp.log'})")
    report = {"tensor_parallel": json.loads((out / "tp.json").read_text()), "tp_seconds": time.time() - started}
    if smi is not None:
        rows = [line.split(", ") for line in (out / "nvidia-smi.csv").read_text().splitlines() if line.strip()]
        report["gpu_busy_percent"] = {gpu: statistics.mean(float(r[1]) for r in rows if r[0] == gpu)
                                      for gpu in sorted({r[0] for r in rows})}

    batch = prompts(args.sessions, args.shared, args.suffix)
    loaded = build(out / "model", shape)
    stock = loaded.model   # scored below through a stock copy: on_pool replaced this one's layers
    for cascade in (True, False):
        engine = Engine(loaded, engine_config(pool_pages(batch, args.shared, args.new_tokens), batch),
                        cascade=CascadeConfig(enabled=cascade, min_shared_pages=16, min_members=2))
        report[f"one_gpu_cascade_{'on' if cascade else 'off'}"] = run_engine(engine, batch, args.new_tokens)
        release(engine)
    del loaded, stock
    mx.clear_cache()
    bandwidth = copy_bandwidth(args.bandwidth_gib)
    report["copy_bandwidth_gb_s"] = bandwidth / 1e9
    for ranks, cascade in ((args.ranks, True), (args.ranks, False), (1, True), (1, False)):
        report[f"byte_floor_ms_ranks{ranks}_cascade_{'on' if cascade else 'off'}"] = byte_floor_ms(
            shape, ranks, args.sessions, args.shared, args.suffix + args.new_tokens, cascade, bandwidth)

    scorer = stock_model(out / "model", shape)
    arms = {**{k: v for k, v in report["tensor_parallel"].items() if k.startswith("tp")},
            **{k: report[k] for k in report if k.startswith("one_gpu")}}
    report["teacher_forced"] = {name: {row: teacher_forced(scorer, batch[row], arm["tokens"][row])
                                       for row in (0, len(batch) - 1)} for name, arm in arms.items()}
    tp = report["tensor_parallel"]
    on, off = f"tp{args.ranks}_cascade_on", f"tp{args.ranks}_cascade_off"
    report["targets"] = {
        "tp_vs_one_gpu_cascade_on": (tp[on]["decode_tokens_per_s"]
                                     / report["one_gpu_cascade_on"]["decode_tokens_per_s"]),
        "tp_cascade_on_vs_off": tp[on]["decode_tokens_per_s"] / tp[off]["decode_tokens_per_s"],
        "tokens_pass": all(score["max_rank"] <= 1 for arm in report["teacher_forced"].values()
                           for score in arm.values()),
    }
    for arm in arms.values():
        arm.pop("tokens", None)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report["targets"]), flush=True)


def stock_model(model_dir: Path, shape: dict):
    """mlx-lm's own model with the same seed's weights (the teacher-forced scorer)."""
    config = load_config(model_dir)
    config["num_hidden_layers"] = shape["num_layers"]
    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


if __name__ == "__main__":
    main()
