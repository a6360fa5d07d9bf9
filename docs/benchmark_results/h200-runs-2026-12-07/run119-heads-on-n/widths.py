"""Run 115's widths.py on this branch (quantized pages transposed under at most 8 heads a block: int8 96 registers,
five blocks an SM; int4 127, four), at the heuristic's width and at the widths that cut the longest row into
1, 2, 4, 5 and 6 even tiles: how the launch's waves (768 blocks at 8192 x 32 on 660 or 528 block slots) set its
time.

    python widths.py OUTDIR [SHAREDxBATCH ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "run115-flat-stages"))
import widths  # noqa: E402  (run 115's probe)

widths.EVEN_TILES = (1, 2, 4, 5, 6)

if __name__ == "__main__":
    widths.main()
