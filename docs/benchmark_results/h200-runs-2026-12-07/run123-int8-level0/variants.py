"""Run 123's variants of int8's stacked level: each a list of edits to main's kernels/cuda_warpgroup.py (as of
9240ccb; every edit must match once). Names combine: "late_rows_pairs3" is pairs3's, rows' and late's edits.

- pairs3: three operand pairs (the producers convert up to two chunks ahead of the consumers, not one);
- rows: the conversion's threads mapped so that a phase of 8 stores one piece of 8 rows (8 distinct bank groups
  under the swizzle), not 4 pieces of two column blocks of one row (8192 bytes apart, the same banks);
- late: the producers issue a chunk's refill after its conversion's fence and hand-over;
- late1: late, and blocks of one warpgroup convert a chunk before its refill, without the fence after the copies
  land (their codes are read by the conversion, not the MMA).

    python variants.py NAME > kernels/cuda_warpgroup.py
"""

import sys
from pathlib import Path

PAIRS3 = [
    ("""  constexpr int PRODUCER_BARRIER = 1, CONSUMER_BARRIER = 2, FULL = 3, EMPTY = 5;
  constexpr int OPERAND_BYTES = QUANTIZED ? (PRODUCER ? 4 : 2) * KV_BYTES : 0;""",
     """  constexpr int PAIRS = PRODUCER ? 3 : 1;      // operand pairs: the producers run PAIRS - 1 chunks ahead
  constexpr int PRODUCER_BARRIER = 1, CONSUMER_BARRIER = 2, FULL = 3, EMPTY = FULL + PAIRS;
  constexpr int OPERAND_BYTES = QUANTIZED ? 2 * PAIRS * KV_BYTES : 0;"""),
    ("""      int buffer = 0;
      for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {""",
     """      int buffer = 0, pair = 0;
      for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {"""),
    ("""        if (n >= 2) mlxcel::barrier_sync(EMPTY + (n & 1), THREADS + PRODUCER_THREADS);
        convert(buffer, n & 1);
        mlxcel::barrier_arrive(FULL + (n & 1), THREADS + PRODUCER_THREADS);
        buffer = buffer + 1 == STAGES ? 0 : buffer + 1;""",
     """        if (n >= PAIRS) mlxcel::barrier_sync(EMPTY + pair, THREADS + PRODUCER_THREADS);
        convert(buffer, pair);
        mlxcel::barrier_arrive(FULL + pair, THREADS + PRODUCER_THREADS);
        buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
        pair = pair + 1 == PAIRS ? 0 : pair + 1;"""),
    ("""  int buffer = 0;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    // This chunk""",
     """  int buffer = 0, pair = 0;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    // This chunk"""),
    ("""    const int n = chunk - chunk_begin;
    const int pair = PRODUCER ? n & 1 : 0;
""", ""),
    ("""    if (PRODUCER && chunk + 2 < chunk_end) mlxcel::barrier_arrive(EMPTY + pair, THREADS + PRODUCER_THREADS);
    buffer = buffer + 1 == STAGES ? 0 : buffer + 1;""",
     """\
    if (PRODUCER && chunk + PAIRS < chunk_end) mlxcel::barrier_arrive(EMPTY + pair, THREADS + PRODUCER_THREADS);
    buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
    pair = pair + 1 == PAIRS ? 0 : pair + 1;"""),
]

ROWS = [
    ("""        const int item = i * COPY_THREADS + copy_thread;
        const int r = item / VECS, c = item % VECS;""",
     """        // A phase's 8 threads: one piece of 8 rows, so their float16 stores land on 8 distinct 16-byte bank
        // groups (the row's swizzle), as their code loads do (rows CODE_STRIDE apart).
        const int item = i * COPY_THREADS + copy_thread;
        const int r = item % 8 + 8 * (item / (8 * VECS)), c = item / 8 % VECS;"""),
]

# The producers' refill moved after the hand-over, before their buffer's update (main's loop or pairs3's).
REFILL = """        copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);
"""
LATE = [
    ("""        mlxcel::barrier_sync(PRODUCER_BARRIER, PRODUCER_THREADS);
""" + REFILL, """        mlxcel::barrier_sync(PRODUCER_BARRIER, PRODUCER_THREADS);
"""),
    ("""
        buffer = buffer + 1 == STAGES ? 0 : buffer + 1;""", """
        // After the conversion's fence (a MEMBAR, which might wait for this thread's copies in flight): the
        // copies it could wait for are then the next chunk's, which the next copy_wait waits for anyway.
""" + REFILL + """        buffer = buffer + 1 == STAGES ? 0 : buffer + 1;"""),
]

ONE_WARPGROUP = [
    ("""    mlxcel::copy_wait<STAGES - 2>();
    mlxcel::async_proxy_fence();
    __syncthreads();""",
     """    mlxcel::copy_wait<STAGES - 2>();
    if constexpr (!QUANTIZED) mlxcel::async_proxy_fence();     // int8 codes are read by the conversion
    __syncthreads();"""),
    ("""      landed();
      copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);
      if constexpr (QUANTIZED) {   // the last chunk's MMAs were waited for
        convert(buffer, pair);
        __syncthreads();
      }""",
     """      landed();
      if constexpr (QUANTIZED) {   // the last chunk's MMAs were waited for
        convert(buffer, pair);
        __syncthreads();
      }
      copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);   // int8: after the fence"""),
]

EDITS = {"pairs3": PAIRS3, "rows": ROWS, "late": LATE, "late1": LATE + ONE_WARPGROUP}   # applied in this order
MAIN = Path(__file__).resolve().parents[4] / "kernels" / "cuda_warpgroup.py"


def source(name: str, text: str | None = None) -> str:
    """Main's cuda_warpgroup.py (or ``text``) with the named variants' edits."""
    text = MAIN.read_text() if text is None else text
    for part in sorted(EDITS, key=list(EDITS).index):
        if part in name.split("_"):
            for old, new in EDITS[part]:
                if text.count(old) != 1:
                    raise SystemExit(f"{name}: an edit of {part} matches {text.count(old)} times")
                text = text.replace(old, new)
    return text


if __name__ == "__main__":
    sys.stdout.write(source(sys.argv[1]))
