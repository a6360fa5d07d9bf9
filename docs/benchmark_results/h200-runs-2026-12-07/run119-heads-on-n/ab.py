"""Main's flat partial kernels against this branch's (quantized pages under at most 8 heads a block: the
products transposed, HEADS_ON_N), in one process: run 118's ab.py, int4's states too checked within float16
rounding of main's (the products' sums run in another order), bf16's bit for bit (its source unchanged).

    python ab.py OUTDIR [SHAREDxBATCH ...]
"""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("run118_ab", Path(__file__).parents[1] / "run118-conversions/ab.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)
ab.ROUNDED = ("int8", "int4")

if __name__ == "__main__":
    ab.main()
