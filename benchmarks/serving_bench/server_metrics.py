"""What a level did inside the server, from two /metrics scrapes.

The counters are per attention launch, i.e. per layer per step: a decode step
of an 8-layer model adds 8 to ``fused_v2``. ``cascade`` is the subset of
``fused_v2`` that ran two levels; a level whose cascade delta is 0 did not
cascade, whatever the config says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from mlxcel_tui.source import samples_dict

LAUNCHES = 'mlxcel_paged_decode_launches_total{path="%s"}'
SHARED_TOKENS = "mlxcel_cascade_shared_tokens_total"
MEMBERS = "mlxcel_cascade_member_sequences_total"
FAILURES = "mlxcel_cascade_failures_total"
DECODE_SECONDS = "mlxcel_decode_step_seconds_sum"
DECODE_STEPS = "mlxcel_decode_step_seconds_count"
PREFIX_REUSED = "mlxcel_prompt_cache_prefix_tokens_reused_total"
PREEMPTIONS = "mlxcel_preemptions_total"
LIVE_BLOCKS = "mlxcel_cache_pool_paged_blocks_live"
PEAK_MEMORY = "mlxcel_mlx_peak_memory_bytes"


def parse_metrics(text: str) -> dict[str, float]:
    return samples_dict(text_string_to_metric_families(text))


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


@dataclass(frozen=True)
class LaunchSplit:
    fused_v2: int
    gather: int
    cascade: int
    failures: int
    shared_tokens: int      # summed over cascade launches
    member_sequences: int   # summed over cascade launches
    decode_steps: int
    decode_seconds: float
    prefix_tokens_reused: int
    preemptions: int

    @property
    def mean_shared_tokens(self) -> float:
        return self.shared_tokens / self.cascade if self.cascade else math.nan

    @property
    def mean_members(self) -> float:
        return self.member_sequences / self.cascade if self.cascade else math.nan

    @property
    def cascade_share(self) -> float:
        """Fraction of fused_v2 launches that cascaded."""
        return self.cascade / self.fused_v2 if self.fused_v2 else 0.0

    @property
    def mean_decode_step_ms(self) -> float:
        return self.decode_seconds / self.decode_steps * 1e3 if self.decode_steps else math.nan

    def describe(self) -> str:
        head = (f"launches: fused_v2 {self.fused_v2} (cascade {self.cascade}, {self.cascade_share:.0%}), "
                f"gather {self.gather}, cascade failures {self.failures}")
        if self.cascade:
            body = (f"cascade: mean shared {self.mean_shared_tokens:.0f} tokens, "
                    f"mean members {self.mean_members:.1f} per launch")
        else:
            body = "cascade: did not run at this level"
        steps = (f"decode steps {self.decode_steps}, mean {self.mean_decode_step_ms:.1f} ms; "
                 f"prefix tokens reused {self.prefix_tokens_reused}; preemptions {self.preemptions}")
        return f"{head}\n{body}\n{steps}"


def launch_split(before: dict[str, float], after: dict[str, float]) -> LaunchSplit:
    def count(key: str) -> int:
        return round(delta(before, after, key))

    return LaunchSplit(
        fused_v2=count(LAUNCHES % "fused_v2"),
        gather=count(LAUNCHES % "gather"),
        cascade=count(LAUNCHES % "cascade"),
        failures=count(FAILURES),
        shared_tokens=count(SHARED_TOKENS),
        member_sequences=count(MEMBERS),
        decode_steps=count(DECODE_STEPS),
        decode_seconds=delta(before, after, DECODE_SECONDS),
        prefix_tokens_reused=count(PREFIX_REUSED),
        preemptions=count(PREEMPTIONS),
    )
