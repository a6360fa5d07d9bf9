"""A/B: the cascade step in one launch vs three, order alternated (ABBA), after a throwaway warm-up arm."""
import json, statistics, sys
import mlx.core as mx
import gpu_attention_bench as b

res = {}
for shared, batch in [(8192, 4), (2048, 32), (8192, 32), (32768, 4), (2048, 64)]:
    cell = b.Cell(shared, 256, batch)
    arms = {"one": cell.fused_cascade(None, launches=1), "three": cell.fused_cascade(None, launches=3)}
    err = b.relative_error(arms["one"](0), arms["three"](0))
    b.measure(cell.flat, 5)                      # throwaway: whatever runs first after a new cell pays for it
    times = {k: [] for k in arms}
    for r in range(6):
        order = ["one", "three"] if r % 2 == 0 else ["three", "one"]
        for k in order:
            times[k].append(b.measure(arms[k], 7)["s"] * 1e6)
    row = {"cell": f"{shared}x{batch}", "one_vs_three_error": err,
           **{k: [round(x, 1) for x in v] for k, v in times.items()},
           **{f"{k}_median": round(statistics.median(v), 1) for k, v in times.items()}}
    print(json.dumps(row), flush=True)
