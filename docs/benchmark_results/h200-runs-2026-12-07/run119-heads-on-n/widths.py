"""Run 115's widths.py on this branch (quantized pages transposed under at most 8 heads a block: int8 96 registers,
five blocks an SM; int4 127, four), at the heuristic's width and at the widths that cut the longest row into
1, 2, 4, 5 and 6 even tiles: how the launch's waves (768 blocks at 8192 x 32 on 660 or 528 block slots) set its
time. INT8_BLOCKS=4 in the environment: int8's blocks ask for 50 KB of shared memory, so four fit an SM, not five.

    python widths.py OUTDIR [SHAREDxBATCH ...]
"""

import os
import sys
from pathlib import Path

from mlxcel.kernels import fused

sys.path.insert(0, str(Path(__file__).parents[1] / "run115-flat-stages"))
import widths  # noqa: E402  (run 115's probe)

widths.EVEN_TILES = (1, 2, 4, 5, 6)

if os.environ.get("INT8_BLOCKS") == "4":
    staging_bytes = fused.Platform.staging_bytes

    def four_blocks(self, head_dim, warps, quant=None, stages=None):
        staged = staging_bytes(self, head_dim, warps, quant, stages)
        return max(staged, 50 * 1024) if quant is not None and not quant.affine else staged
    fused.Platform.staging_bytes = four_blocks

if __name__ == "__main__":
    widths.main()
