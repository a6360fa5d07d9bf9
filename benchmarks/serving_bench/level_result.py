"""Every arm's repeated runs of one concurrency level, reduced to medians."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .arm_run import ArmRun
from .stats import Summary, median_summary


def median_of(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return statistics.median(present) if present else math.nan


@dataclass(frozen=True)
class ArmFigures:
    """One arm at one level: medians over reps (peak memory: the largest)."""

    arm: str
    reps: int
    summary: Summary
    decode_throughput: float
    peak_memory_bytes: float
    kv_peak_bytes: float
    kv_dtype: str                 # the server's page format ("" unknown)
    cascade_share: float          # fraction of decode launches that cascaded; nan without metrics
    mean_cached_tokens: float     # usage.cached_tokens over clients 2..N

    @classmethod
    def of(cls, runs: list[ArmRun]) -> "ArmFigures":
        peaks = [r.peak_memory_bytes for r in runs if not math.isnan(r.peak_memory_bytes)]
        return cls(
            arm=runs[0].arm,
            reps=len(runs),
            summary=median_summary([r.summary for r in runs]),
            decode_throughput=median_of([r.decode_throughput for r in runs]),
            peak_memory_bytes=max(peaks) if peaks else math.nan,
            kv_peak_bytes=median_of([r.kv_peak_bytes for r in runs]),
            kv_dtype=runs[0].kv_dtype,
            cascade_share=median_of([r.launches.cascade_share if r.launches else math.nan for r in runs]),
            mean_cached_tokens=median_of([rest_cached_tokens(r) for r in runs]),
        )


def rest_cached_tokens(run: ArmRun) -> float:
    """Mean prompt tokens served from the prefix cache for all clients but the first served."""
    served = sorted((r for r in run.records if r.ok and r.cached_tokens is not None), key=lambda r: r.ttft)
    rest = [r.cached_tokens for r in served[1:]]
    return statistics.fmean(rest) if rest else math.nan


@dataclass
class LevelResult:
    concurrency: int
    runs: dict[str, list[ArmRun]] = field(default_factory=dict)  # arm -> its reps, in run order

    def add(self, run: ArmRun) -> None:
        self.runs.setdefault(run.arm, []).append(run)

    @property
    def arms(self) -> list[str]:
        return list(self.runs)

    def figures(self, arm: str) -> ArmFigures:
        return ArmFigures.of(self.runs[arm])
