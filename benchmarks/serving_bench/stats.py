"""Per-request measurements and the `vllm bench serve` summary of a run.

Definitions follow vLLM's benchmark: TTFT is request start to first streamed
token; TPOT is (latency - TTFT) / (output tokens - 1) per request; ITL is the
gap between consecutive streamed chunks (one per token where the server
streams token ids); percentiles interpolate linearly
(numpy's default). Output token throughput is total output tokens over the
run's wall time. ``ttft_rest_mean`` leaves out the client served first (the
smallest TTFT): on a prefix-caching engine that one pays the shared prefill,
the 2nd..Nth should not.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields


@dataclass
class RequestRecord:
    index: int
    ttft: float = 0.0                              # seconds
    latency: float = 0.0                           # seconds, start to last token
    itl: list[float] = field(default_factory=list)  # seconds between streamed chunks
    output_tokens: int = 0                         # as the server's usage reports them
    prompt_tokens: int = 0
    cached_tokens: int | None = None               # usage.prompt_tokens_details.cached_tokens
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # generated ids, where the arm reports them
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks, like numpy."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


@dataclass(frozen=True)
class Summary:
    """One run's figures; times in milliseconds, throughputs per second."""

    requests: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_mean_ms: float
    ttft_median_ms: float
    ttft_p99_ms: float
    ttft_first_ms: float   # the client served first
    ttft_rest_mean_ms: float  # clients 2..N
    tpot_mean_ms: float
    tpot_median_ms: float
    tpot_p99_ms: float
    itl_mean_ms: float
    itl_median_ms: float
    itl_p99_ms: float


def summarize(records: list[RequestRecord], duration: float) -> Summary:
    done = [r for r in records if r.ok]
    ttfts = sorted(r.ttft * 1e3 for r in done)
    tpots = [r.tpot * 1e3 for r in done if r.tpot is not None]
    itls = [gap * 1e3 for r in done for gap in r.itl]
    output = sum(r.output_tokens for r in done)
    total = output + sum(r.prompt_tokens for r in done)
    return Summary(
        requests=len(done),
        failed=len(records) - len(done),
        duration_s=duration,
        input_tokens=sum(r.prompt_tokens for r in done),
        output_tokens=output,
        request_throughput=len(done) / duration if duration else math.nan,
        output_throughput=output / duration if duration else math.nan,
        total_token_throughput=total / duration if duration else math.nan,
        ttft_mean_ms=mean(ttfts),
        ttft_median_ms=percentile(ttfts, 50),
        ttft_p99_ms=percentile(ttfts, 99),
        ttft_first_ms=ttfts[0] if ttfts else math.nan,
        ttft_rest_mean_ms=mean(ttfts[1:]),
        tpot_mean_ms=mean(tpots),
        tpot_median_ms=percentile(tpots, 50),
        tpot_p99_ms=percentile(tpots, 99),
        itl_mean_ms=mean(itls),
        itl_median_ms=percentile(itls, 50),
        itl_p99_ms=percentile(itls, 99),
    )


def median_summary(summaries: list[Summary]) -> Summary:
    """Field-wise median over repeated runs of one level."""
    values = {}
    for f in fields(Summary):
        column = [getattr(s, f.name) for s in summaries]
        middle = statistics.median(column)
        values[f.name] = round(middle) if isinstance(column[0], int) else middle
    return Summary(**values)
