"""Which host activity the decode step's kernel stalls (calls 100-300 us over their median) follow. One process,
cascade, the arms in the order main, sync, noprefetch, noprefetch, sync, main (gpu_step_profile's arm each;
tokens checked against the first read's; run 105's probe measures the stalls):
  main        the engine as it is: the host builds step n + 1 while step n runs;
  sync        each step waited for before the next is built: nothing the host does overlaps a kernel;
  noprefetch  as main, host-written arrays not prefetched (the GPU's first read faults them over).
python probe.py OUT"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "run105-uploads"))
import probe as p105  # noqa: E402  (its stall counter; its upload hooks pass through with no ring)
import gpu_e2e_bench as e2e  # noqa: E402
import gpu_step_profile as sp  # noqa: E402
from mlxcel.kernels import managed  # noqa: E402

STATE = {"sync": False}


class SyncWindow(sp.Window):
    def __call__(self, engine, index):
        if STATE["sync"] and engine._inflight is not None:
            mx.eval(engine._inflight.launched.tokens)
        super().__call__(engine, index)


sp.Window = SyncWindow


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    e2e.warm_up(loaded, batch, args.block_size, args.shared)
    move = managed.prefetcher()
    for state in ("main", "sync", "noprefetch", "noprefetch", "sync", "main"):
        STATE["sync"] = state == "sync"
        if move is not None:
            move.enabled = state != "noprefetch"
        arm = sp.profile_arm(loaded, batch, args, True, None, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        reads.append({"state": state, "tok_s": arm["tokens_per_s"], "wall_ms": arm["wall_ms"],
                      "wall_mean_ms": statistics.mean(arm["wall_ms_each"]), "host_ms": arm["host_ms"],
                      "gpu_ms": arm["gpu_busy_ms_per_step"], **p105.stall_stats(args.profile_steps),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | tok/s | step ms (median, mean) | host ms | GPU ms | stall us / step (count) | stalled kernels "
             "| rows agree |", "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        stalled = ", ".join(sorted({s["kernel"][:24] for s in r["longest_stalls"]}))
        lines.append(f"| {r['state']} | {r['tok_s']:.0f} | {r['wall_ms']:.2f}, {r['wall_mean_ms']:.2f} | "
                     f"{r['host_ms']:.2f} | {r['gpu_ms']:.2f} | {r['stall_us_per_step']:.0f} "
                     f"({r['stalls_per_step']:.1f}) | {stalled} | {r['tokens_agree']['identical_rows']}/"
                     f"{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
