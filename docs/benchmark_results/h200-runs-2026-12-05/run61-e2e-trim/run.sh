# Run 61: the 32 x 32K cell (bf16 vs int8 pages, cascade and flat, ABBA) with the engine trimming MLX's buffer cache
# (commit cfc4bec), on run 60's warm machine: run 59's script, e2e mode.
bash docs/benchmark_results/h200-runs-2026-12-05/run59-current/run.sh e2e
