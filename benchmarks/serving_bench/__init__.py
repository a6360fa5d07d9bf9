"""The pieces of benchmarks/bench_serving_concurrency.py."""
