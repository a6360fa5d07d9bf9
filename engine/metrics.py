"""Per-engine Prometheus metrics and the latest decode outcome.

One CollectorRegistry per engine, so two engines in a process (tests, say)
never share counters. The decode path records every launch itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from .cascade import CascadePlan

LAUNCH_PATHS = ("fused_v2", "gather", "cascade")

# What a decode launch did; the first three count as fused_v2 launches.
FLAT = "flat"
CASCADE = "cascade"
CASCADE_FALLBACK = "cascade_fallback"
GATHER = "gather"


@dataclass(frozen=True)
class DecodeOutcome:
    """The latest paged attention launch, for engine snapshots."""

    kind: str                   # FLAT, CASCADE, CASCADE_FALLBACK or GATHER
    batch: int                  # rows in the launch
    plan: CascadePlan | None    # the plan that ran (CASCADE) or failed (CASCADE_FALLBACK)
    shared_tokens: int          # KV tokens of the shared span, 0 without a plan
    reason: str                 # "cascade off", the planner's reason, or the failure

    @property
    def path(self) -> str:
        return "gather" if self.kind == GATHER else "cascade" if self.kind == CASCADE else "fused_v2"


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.paged_decode_launches = Counter(
            "mlxcel_paged_decode_launches_total",
            "Paged attention launches by path (cascade is the subset of fused_v2 that ran two levels)",
            ["path"], registry=self.registry)
        for path in LAUNCH_PATHS:
            self.paged_decode_launches.labels(path=path)
        self.cascade_shared_tokens = Counter(
            "mlxcel_cascade_shared_tokens_total",
            "KV tokens of shared spans attended once by cascade launches", registry=self.registry)
        self.cascade_member_sequences = Counter(
            "mlxcel_cascade_member_sequences_total",
            "Sequences in the cascade subgroup, summed over cascade launches", registry=self.registry)
        self.cascade_failures = Counter(
            "mlxcel_cascade_failures_total",
            "Planned cascade launches that failed and fell back to the flat launch", registry=self.registry)
        self.last_decode: DecodeOutcome | None = None

    def record_decode(self, outcome: DecodeOutcome) -> None:
        """Count one launch and remember it as the latest outcome."""
        if outcome.kind == GATHER:
            self.paged_decode_launches.labels(path="gather").inc()
        else:
            self.paged_decode_launches.labels(path="fused_v2").inc()
        if outcome.kind == CASCADE:
            self.paged_decode_launches.labels(path="cascade").inc()
            self.cascade_shared_tokens.inc(outcome.shared_tokens)
            self.cascade_member_sequences.inc(len(outcome.plan.members))
        elif outcome.kind == CASCADE_FALLBACK:
            self.cascade_failures.inc()
        self.last_decode = outcome
