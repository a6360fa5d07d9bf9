"""Where the decode step's stalls come from, and whether per-step uploads written in place into buffers the
engine keeps take them away. One process, cascade, the arms in the order main, ring, advised, advised, ring,
main (gpu_step_profile's arm each; tokens checked against the first read's):
  main     the engine as it is: each step's uploads are fresh arrays (MLX's managed buffers), prefetched;
  ring     the runner's per-step upload and the CSR's last_page_len written in place into one of four buffers
           a call site keeps (made once, never returned to MLX's cache), then prefetched;
  advised  the ring's buffers advised to stay in host memory and mapped for the GPU (no migration, no prefetch).
Each read: the step's wall, GPU busy, the summed excess of kernel calls over 3x their name's median (the
stalls) per step, the CUDA runtime / driver memory calls per step, and the longest stalls with the memory calls
issued in the 400 us before them. python probe.py OUT"""
import argparse
import collections
import ctypes
import json
import statistics
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.engine import runner as runner_module
from mlxcel.kernels import csr as csr_module, managed

EVENTS: list[dict] = []
_complete = sp.complete_events


def capture(prof):
    events = _complete(prof)
    EVENTS[:] = events
    return events


sp.complete_events = capture
MEMORY_CALLS = ("Malloc", "Free", "Memcpy", "Prefetch", "Advise", "HostAlloc", "HostRegister", "Memset")


class Ring:
    """Per call site, DEPTH int32 buffers reused in turn (the engine reads step n's tokens before it builds
    step n + 2, so a buffer DEPTH >= 3 steps old is free)."""
    DEPTH = 4

    def __init__(self, advised: bool) -> None:
        self.advised, self.sites = advised, {}

    def write(self, site: str, parts: list[np.ndarray]) -> tuple[mx.array, ...]:
        parts = [np.asarray(a, np.int32).reshape(-1) for a in parts]
        words = sum(p.size for p in parts)
        buffers, turn = self.sites.setdefault(site, [[None] * self.DEPTH, 0])
        self.sites[site][1] = (turn + 1) % self.DEPTH
        buf = buffers[turn]
        if buf is None or buf.size < words:
            buf = mx.array(np.zeros(max(4096, 2 * words), np.int32))
            mx.eval(buf)
            buffers[turn] = buf
            if self.advised:
                advise(buf)
        host = np.asarray(buf)
        host[:words] = np.concatenate(parts) if parts else []
        if not self.advised:
            managed.to_device(buf)
        out, at = [], 0
        for p in parts:
            out.append(buf[at:at + p.size])
            at += p.size
        return tuple(out)


def advise(buf: mx.array) -> None:
    move = managed.prefetcher()
    drv = move.driver
    fn = drv.cuMemAdvise_v2
    fn.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, managed.MemLocation]
    address, size = np.asarray(buf).ctypes.data, buf.nbytes
    move._current()
    # CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3 (host: type 2), CU_MEM_ADVISE_SET_ACCESSED_BY = 5 (device 0)
    for advice, location in ((3, managed.MemLocation(2, 0)), (5, managed.MemLocation(1, 0))):
        result = fn(address, size, advice, location)
        if result:
            raise OSError(f"cuMemAdvise_v2({advice}) returned {result}")


_upload, _from_host = runner_module.upload, csr_module.PagedCsrView.from_host.__func__
STATE = {"ring": None}


def runner_upload(*arrays):
    ring = STATE["ring"]
    if ring is None:
        return _upload(*arrays)
    shapes = [np.shape(a) for a in arrays]
    views = ring.write("runner", list(arrays))
    return tuple(v.reshape(s) if len(s) != 1 else v for v, s in zip(views, shapes))


def from_host(cls, host, structure=None, device=None):
    ring = STATE["ring"]
    if ring is None or device is None:
        return _from_host(cls, host, structure, device)
    (indptr, indices, first), (last,) = device, ring.write("csr_last", [host.last_page_len])
    return cls(indptr, indices, last, first, host.block_size, structure or csr_module.PageStructure(), host)


runner_module.upload = runner_upload
csr_module.PagedCsrView.from_host = classmethod(from_host)


def stall_stats(steps: int) -> dict:
    kernels = [e for e in EVENTS if e.get("cat") == "kernel"]
    calls = [e for e in EVENTS if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and any(m in e["name"] for m in MEMORY_CALLS)]
    copies = [e for e in EVENTS if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    by_name = collections.defaultdict(list)
    for e in kernels:
        by_name[sp.short_name(e["name"])].append(e["dur"])
    median = {n: float(np.median(d)) for n, d in by_name.items()}
    stalls = [(e["dur"] - 3 * median[sp.short_name(e["name"])], e) for e in kernels]
    stalls = sorted([(x, e) for x, e in stalls if x > 20], key=lambda t: -t[0])
    near = []
    for x, e in stalls[:10]:
        before = [f"{c['name']}@{e['ts'] - c['ts']:.0f}us" for c in calls if 0 <= e["ts"] - c["ts"] <= 400]
        near.append({"kernel": sp.short_name(e["name"])[:48], "excess_us": round(x, 1), "memory_calls_before": before})
    return {"stall_us_per_step": sum(x for x, _ in stalls) / steps, "stalls_per_step": len(stalls) / steps,
            "memory_calls_per_step": {n: c / steps for n, c in
                                      collections.Counter(c["name"] for c in calls).most_common()},
            "memory_call_us_per_step": sum(c["dur"] for c in calls) / steps,
            "copies_per_step": {n: c / steps for n, c in collections.Counter(c["name"] for c in copies).most_common()},
            "longest_stalls": near,
            "categories": dict(collections.Counter(e.get("cat") for e in EVENTS))}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    e2e.warm_up(loaded, batch, args.block_size, args.shared)
    for state in ("main", "ring", "advised", "advised", "ring", "main"):
        STATE["ring"] = None if state == "main" else Ring(state == "advised")
        arm = sp.profile_arm(loaded, batch, args, True, None, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        reads.append({"state": state, "tok_s": arm["tokens_per_s"], "wall_ms": arm["wall_ms"],
                      "wall_mean_ms": statistics.mean(arm["wall_ms_each"]), "host_ms": arm["host_ms"],
                      "gpu_ms": arm["gpu_busy_ms_per_step"], **stall_stats(args.profile_steps),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | tok/s | step ms (median, mean) | host ms | GPU ms | stall us / step (count) | memory calls / step "
             "| rows agree |", "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        calls = ", ".join(f"{n} {c:g}" for n, c in r["memory_calls_per_step"].items())
        lines.append(f"| {r['state']} | {r['tok_s']:.0f} | {r['wall_ms']:.2f}, {r['wall_mean_ms']:.2f} | "
                     f"{r['host_ms']:.2f} | {r['gpu_ms']:.2f} | {r['stall_us_per_step']:.0f} "
                     f"({r['stalls_per_step']:.1f}) | {calls} | {r['tokens_agree']['identical_rows']}/"
                     f"{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
