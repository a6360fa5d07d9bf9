"""Text output: the `vllm bench serve` result block per arm and level, one
side-by-side table of every level and arm, and the ratios the targets name."""

from __future__ import annotations

import math

from .level_result import ArmFigures, LevelResult

MIB = 2**20
CASCADE_ON, CASCADE_OFF, MLX_LM, SERVER = "cascade-on", "cascade-off", "mlx-lm", "server"
CASCADE_ONE = "cascade-one-level"   # cascade on, the seed's one subgroup and one level

# The targets, as ratios in favour of this engine.
DECODE_TARGET = 1.5
TTFT_TARGET = 4.0
KV_TARGET = 4.0
# Quantized pages on the CPU (issue 26): (reference format, quantized format) -> (KV memory, decode tok/s).
KV_DTYPE_TARGETS = {("float32", "int8"): (3.5, 1.0)}
KV_SEPARATOR = "+"   # an arm on a --kv-dtype of its own: "cascade-off+int8"


def arm_name(cascade: str, kv_dtype: str | None) -> str:
    return cascade if kv_dtype is None else f"{cascade}{KV_SEPARATOR}{kv_dtype}"


def split_arm(name: str) -> tuple[str, str | None]:
    """(cascade arm, --kv-dtype or None) of an arm's name."""
    cascade, _, kv_dtype = name.partition(KV_SEPARATOR)
    return cascade, kv_dtype or None


def rule(title: str, fill: str) -> str:
    return f"{title:{fill}^50}"


def line(label: str, value, digits: int = 2) -> str:
    if isinstance(value, float):
        shown = "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    else:
        shown = str(value)
    return f"{label:<40} {shown:<10}"


def mib(value: float) -> float:
    return value / MIB


def result_block(title: str, figures: ArmFigures) -> str:
    """vLLM's serving result layout, then what only this benchmark measures."""
    s = figures.summary
    rows = [
        rule(f" {title} ", "="),
        line("Successful requests:", s.requests),
        line("Failed requests:", s.failed),
        line("Benchmark duration (s):", s.duration_s),
        line("Total input tokens:", s.input_tokens),
        line("Total generated tokens:", s.output_tokens),
        line("Request throughput (req/s):", s.request_throughput),
        line("Output token throughput (tok/s):", s.output_throughput),
        line("Total Token throughput (tok/s):", s.total_token_throughput),
        rule("Time to First Token", "-"),
        line("Mean TTFT (ms):", s.ttft_mean_ms),
        line("Median TTFT (ms):", s.ttft_median_ms),
        line("P99 TTFT (ms):", s.ttft_p99_ms),
        line("TTFT of the client served first (ms):", s.ttft_first_ms),
        line("Mean TTFT of clients 2..N (ms):", s.ttft_rest_mean_ms),
        rule("Time per Output Token (excl. 1st token)", "-"),
        line("Mean TPOT (ms):", s.tpot_mean_ms),
        line("Median TPOT (ms):", s.tpot_median_ms),
        line("P99 TPOT (ms):", s.tpot_p99_ms),
        rule("Inter-token Latency", "-"),
        line("Mean ITL (ms):", s.itl_mean_ms),
        line("Median ITL (ms):", s.itl_median_ms),
        line("P99 ITL (ms):", s.itl_p99_ms),
        rule("Engine", "-"),
        line("Decode throughput (tok/s):", figures.decode_throughput),
        line("Cached prompt tokens, clients 2..N:", figures.mean_cached_tokens, 0),
        line("Decode launches that cascaded:", figures.cascade_share),
        line("Peak memory (MiB):", mib(figures.peak_memory_bytes), 1),
        line("KV pages (the server's):", figures.kv_dtype or "n/a"),
        line("KV memory at peak (MiB):", mib(figures.kv_peak_bytes), 1),
        "=" * 50,
    ]
    return "\n".join(rows)


def triple(a: float, b: float, c: float) -> str:
    return " / ".join("n/a" if math.isnan(v) else f"{v:.1f}" for v in (a, b, c))


def number(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


TABLE_HEADER = ("| conc | arm | reqs | duration s | out tok/s | decode tok/s | TTFT mean / median / p99 ms "
                "| TTFT 1st ms | TTFT 2..N ms | TPOT mean / median / p99 ms | ITL mean / median / p99 ms "
                "| cascaded | peak MiB | KV MiB |")


def summary_table(levels: list[LevelResult]) -> str:
    rows = [TABLE_HEADER, "|" + "---|" * (TABLE_HEADER.count("|") - 1)]
    for level in levels:
        for arm in level.arms:
            f = level.figures(arm)
            s = f.summary
            rows.append(
                f"| {level.concurrency} | {arm} | {s.requests} | {s.duration_s:.2f} | {s.output_throughput:.1f} "
                f"| {number(f.decode_throughput)} | {triple(s.ttft_mean_ms, s.ttft_median_ms, s.ttft_p99_ms)} "
                f"| {number(s.ttft_first_ms)} | {number(s.ttft_rest_mean_ms)} "
                f"| {triple(s.tpot_mean_ms, s.tpot_median_ms, s.tpot_p99_ms)} "
                f"| {triple(s.itl_mean_ms, s.itl_median_ms, s.itl_p99_ms)} "
                f"| {'n/a' if math.isnan(f.cascade_share) else f'{f.cascade_share:.0%}'} "
                f"| {number(mib(f.peak_memory_bytes))} | {number(mib(f.kv_peak_bytes))} |")
    return "\n".join(rows)


def ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def our_arm(level: LevelResult) -> str | None:
    """The arm the mlx-lm baseline is compared with: cascade on, else the one server (the first KV format)."""
    return next((a for cascade in (CASCADE_ON, SERVER, CASCADE_OFF) for a in level.arms
                 if split_arm(a)[0] == cascade), None)


def kv_dtypes(level: LevelResult) -> list[str | None]:
    """The --kv-dtype values of the level's arms, in run order."""
    return list(dict.fromkeys(split_arm(a)[1] for a in level.arms if a != MLX_LM))


def kv_dtype_ratios(level: LevelResult) -> list[tuple[str, float, float | None]]:
    """Each cascade arm on another KV format against it on the first: KV memory, decode and output tok/s."""
    out = []
    formats = kv_dtypes(level)
    for cascade in dict.fromkeys(split_arm(a)[0] for a in level.arms if a != MLX_LM):
        reference = arm_name(cascade, formats[0])
        for kv_dtype in formats[1:]:
            other = arm_name(cascade, kv_dtype)
            if reference not in level.runs or other not in level.runs:
                continue
            ref, quant = level.figures(reference), level.figures(other)
            memory, decode = KV_DTYPE_TARGETS.get((ref.kv_dtype, quant.kv_dtype), (None, None))
            out.append((f"KV memory {reference} / {other}", ratio(ref.kv_peak_bytes, quant.kv_peak_bytes), memory))
            out.append((f"decode tok/s {other} / {reference}",
                        ratio(quant.decode_throughput, ref.decode_throughput), decode))
            out.append((f"output tok/s {other} / {reference}",
                        ratio(quant.summary.output_throughput, ref.summary.output_throughput), None))
    return out


def level_ratios(level: LevelResult) -> list[tuple[str, float, float | None]]:
    """(what, ratio, target or None) for the pairs this level has."""
    out = []
    for kv_dtype in kv_dtypes(level):
        on_name, off_name, one_name = (arm_name(a, kv_dtype) for a in (CASCADE_ON, CASCADE_OFF, CASCADE_ONE))
        if on_name in level.runs and off_name in level.runs:
            on, off = level.figures(on_name), level.figures(off_name)
            out.append((f"decode tok/s {on_name} / {off_name}",
                        ratio(on.decode_throughput, off.decode_throughput), DECODE_TARGET))
            out.append((f"output tok/s {on_name} / {off_name}",
                        ratio(on.summary.output_throughput, off.summary.output_throughput), None))
            out.append((f"mean TPOT {off_name} / {on_name}",
                        ratio(off.summary.tpot_mean_ms, on.summary.tpot_mean_ms), None))
        if on_name in level.runs and one_name in level.runs:
            on, one = level.figures(on_name), level.figures(one_name)
            out.append((f"decode tok/s {on_name} (nested) / {one_name}",
                        ratio(on.decode_throughput, one.decode_throughput), None))
    out += kv_dtype_ratios(level)
    ours = our_arm(level)
    if MLX_LM in level.runs and ours is not None:
        base, us = level.figures(MLX_LM), level.figures(ours)
        out.append((f"TTFT clients 2..N mlx-lm / {ours}",
                    ratio(base.summary.ttft_rest_mean_ms, us.summary.ttft_rest_mean_ms), TTFT_TARGET))
        out.append((f"KV memory mlx-lm / {ours}", ratio(base.kv_peak_bytes, us.kv_peak_bytes), KV_TARGET))
        out.append((f"peak memory mlx-lm / {ours}", ratio(base.peak_memory_bytes, us.peak_memory_bytes), None))
        out.append((f"output tok/s {ours} / mlx-lm",
                    ratio(us.summary.output_throughput, base.summary.output_throughput), None))
        out.append((f"decode tok/s {ours} / mlx-lm", ratio(us.decode_throughput, base.decode_throughput), None))
    return out


def ratio_lines(levels: list[LevelResult]) -> list[str]:
    lines = []
    for level in levels:
        for what, value, target in level_ratios(level):
            verdict = "" if target is None or math.isnan(value) else (
                f"  (target >= {target:g}x: {'met' if value >= target else 'missed'})")
            lines.append(f"concurrency {level.concurrency}: {what} = {number(value, 2)}x{verdict}")
    return lines
