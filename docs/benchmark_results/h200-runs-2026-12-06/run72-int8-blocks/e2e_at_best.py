"""The e2e bench (its arguments) with int8's stacked level on the block size that probe.py timed faster at
32768 x 32 (its report in the folder given first)."""
import json
import re
import runpy
import sys
from pathlib import Path

from mlxcel.kernels import fused

timed = json.loads((Path(sys.argv[1]) / "probe.json").read_text())["32768x32"]["timed"]
arms = {int(m.group(1)): t["s"] for name, t in timed.items()
        if (m := re.match(r"int8 cascade, (\d) warpgroups .*stages auto", name))}
fused.WARPGROUPS_PER_BLOCK["int8"] = min(arms, key=arms.get)
print(f"int8 level 0: {fused.WARPGROUPS_PER_BLOCK['int8']} warpgroups a block (probe, ms: {arms})", flush=True)
sys.argv = ["gpu_e2e_bench.py", *sys.argv[2:]]
runpy.run_path("benchmarks/gpu_e2e_bench.py", run_name="__main__")
