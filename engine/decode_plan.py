"""One decode step's attention, decided once before its first layer.

The runner builds a DecodePlan from the step's page-table view and the cascade
settings as they were at the step's start (a live toggle never splits a step):
the planner's decision, the kernels' decline and the prepared launch (tiles,
launch constants, grids, device arrays of the layout). Every layer only calls
``attend``. A plan depends on the page layout, not on the tokens, so
DecodePlanner keeps it for as long as the layout and the settings stay the
same; what moves every step (each row's last-page fill) is passed to each call.

The step's outcome (path, plan, tokens and bytes read once, reason) is a
value the runner hands back to the engine, which records metrics once per
step: nothing here imports the metrics or the engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Protocol

import mlx.core as mx

from mlxcel import kernels
from mlxcel.kernels import AttentionShape, PagedCsrView
from mlxcel.kernels.shape import check_inputs

from . import cost_model
from .attention import (CascadeLaunch, FlatLaunch, TraceableAttention, paged_prefill_attention,
                        prepare_cascade_launch, prepare_flat_launch)
from .cascade import CascadePlan, explain_cascade
from .config import CascadeConfig, CascadeSettings

log = logging.getLogger(__name__)

# What a launch did; the first three count as fused_v2 launches.
FLAT = "flat"
CASCADE = "cascade"
CASCADE_FALLBACK = "cascade_fallback"
GATHER = "gather"

Launch = Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class DecodeOutcome:
    """What one step's attention launches did, the same in every layer."""

    kind: str                   # FLAT, CASCADE, CASCADE_FALLBACK or GATHER
    batch: int                  # rows in the launch
    plan: CascadePlan | None    # the plan that ran (CASCADE) or failed (CASCADE_FALLBACK)
    shared_tokens: int          # KV tokens of every span (each read once), 0 without a plan
    reason: str                 # "cascade off", the planner's reason, or the failure
    kv_bytes_saved: int = 0     # per layer: KV bytes the flat launch reads and this one did not
    predicted_saving_s: float | None = None  # per layer, by the device's cost model (None: not calibrated)
    span_savings_s: tuple[float, ...] | None = None  # each span's, launches aside, in plan.spans order

    @property
    def path(self) -> str:
        return "gather" if self.kind == GATHER else "cascade" if self.kind == CASCADE else "fused_v2"

    @property
    def spans(self) -> int:
        return len(self.plan.spans) if self.kind == CASCADE else 0

    @property
    def member_rows(self) -> int:
        """Rows in at least one span."""
        return len({m for s in self.plan.spans for m in s.members}) if self.plan else 0


class OutcomeRecorder(Protocol):
    """Where a standalone call reports its launch (the engine's metrics)."""

    def record_decode(self, outcome: DecodeOutcome, launches: int = 1) -> None: ...


def kv_bytes_saved(plan: CascadePlan, shape: AttentionShape) -> int:
    """Per layer: each span's pages are read once instead of once per member."""
    return sum(span.saved_reads for span in plan.spans) * shape.page_bytes


# MLXCEL_CASCADE_SPANS=one plans the seed's one subgroup and one level
# (benchmarks' one-level arm); anything else, unset included, the whole forest.
SPANS_ENV = "MLXCEL_CASCADE_SPANS"


def nested_from_env() -> bool:
    return os.environ.get(SPANS_ENV, "").strip().lower() != "one"


@dataclass(frozen=True)
class StepDecision:
    plan: CascadePlan | None
    reason: str
    predicted_saving_s: float | None
    span_savings_s: tuple[float, ...] | None = None  # each span's by the cost model, in plan.spans order


def decide_step(csr: PagedCsrView, settings: CascadeSettings, shape: AttentionShape, nested: bool) -> StepDecision:
    """The planner's spans and, where a fused backend runs the cascade, its
    cost model's verdict: a span is kept when it saves time by itself, the
    plan when its spans pay for its extra launches (else the one-level plan,
    if that pays). The portable kernels take every span; their model, when
    calibrated, only predicts."""
    max_depth = kernels.cascade_max_depth(shape)
    fused = max_depth is not None
    model = cost_model.current(measure=fused)
    judged = fused and model is not None
    pays = (lambda pages, members: model.span_saving(shape, pages, members) > 0) if judged else None
    decision = explain_cascade(csr, settings, pays, max_depth, nested)
    plan, reason = decision.plan, decision.reason
    if plan is None or model is None:
        return StepDecision(plan, reason, None)

    def judged_by_model(plan: CascadePlan | None, reason: str, saving: float) -> StepDecision:
        spans = None if plan is None else tuple(model.span_saving(shape, s.pages, len(s.members))
                                                for s in plan.spans)
        return StepDecision(plan, reason, saving, spans)

    saving = model.plan_saving(shape, plan)
    if judged and saving <= 0 and plan.depth > 1:
        one = explain_cascade(csr, settings, pays, max_depth, nested=False).plan
        one_saving = model.plan_saving(shape, one)
        if one_saving > 0:
            return judged_by_model(one, f"{reason}; nested spans do not pay their launches, one level does "
                                        f"(predicted {one_saving * 1e6:.1f} us per layer)", one_saving)
    if judged and saving <= 0:
        return judged_by_model(None, f"predicted saving {saving * 1e6:.1f} us per layer <= 0 ({reason}; "
                                     f"{model.describe()})", saving)
    return judged_by_model(plan, f"{reason}; predicted saving {saving * 1e6:.1f} us per layer", saving)


class DecodePlan:
    """A decode step's attention for one page layout and one reading of the settings."""

    def __init__(self, csr: PagedCsrView, settings: CascadeSettings, shape: AttentionShape,
                 nested: bool = True, previous: CascadeLaunch | None = None,
                 decision: StepDecision | None = None) -> None:
        self.structure = csr.structure
        self.settings = settings
        self.shape = shape
        self._csr = csr
        self._flat: FlatLaunch | None = None
        self._cascade: CascadeLaunch | None = None
        self._failure: str | None = None
        if decision is None:
            decision = (decide_step(csr, settings, shape, nested) if settings.enabled
                        else StepDecision(None, "cascade off", None))
        self.decision = decision
        if self.plan is None:
            self._flat = prepare_flat_launch(csr, shape)
            return
        try:
            self._cascade = prepare_cascade_launch(csr, self.plan, shape, previous)
        except Exception as error:  # a layout the cascade cannot launch: flat serves the step
            self.fail(error)

    @property
    def plan(self) -> CascadePlan | None:
        return self.decision.plan

    @property
    def predicted_saving_s(self) -> float | None:
        return self.decision.predicted_saving_s

    @property
    def cascade_launch(self) -> CascadeLaunch | None:
        return self._cascade

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def traceable(self) -> TraceableAttention | None:
        """The step's launches, where a layer's trace can take them (the fused cascade's, the portable flat
        launch's), else None."""
        if self._failure is not None:
            return None
        run = self._cascade.run if self._cascade is not None else self._flat
        return run if isinstance(run, TraceableAttention) and run.signature is not None else None

    def fail(self, error: Exception) -> None:
        """The planned launch failed: flat serves the rest of the step."""
        self._failure = f"cascade launch failed ({type(error).__name__}: {error})"

    def attend(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, last_page_len: mx.array) -> mx.array:
        """One layer: q [R, Hq, D] -> o [R, Hq, D] in q's dtype."""
        if self._cascade is not None and self._failure is None:
            try:
                return self._cascade(q, k_pool, v_pool, last_page_len)
            except Exception as error:  # any failure of the planned launch: flat serves the rest of the step
                self.fail(error)
        if self._flat is None:
            self._flat = prepare_flat_launch(self._csr, self.shape)
        return self._flat(q, k_pool, v_pool, last_page_len)

    @property
    def outcome(self) -> DecodeOutcome:
        batch = self._csr.num_rows
        if self.plan is None:
            return DecodeOutcome(FLAT, batch, None, 0, self.decision.reason, predicted_saving_s=self.predicted_saving_s)
        shared_tokens = sum(s.pages for s in self.plan.spans) * self.shape.block_size
        if self._failure is not None:
            return DecodeOutcome(CASCADE_FALLBACK, batch, self.plan, shared_tokens, self._failure)
        return DecodeOutcome(CASCADE, batch, self.plan, shared_tokens, self.decision.reason,
                             kv_bytes_saved(self.plan, self.shape), self.predicted_saving_s,
                             self.decision.span_savings_s)


class DecodePlanner:
    """Plans each decode step, keeping the last plan while its page layout,
    the settings and the shape are unchanged (a failed plan is made anew).
    A layout that only grew from the last one (staggered rows crossing page
    boundaries on different steps) keeps the last decision: its spans' pages
    are unchanged, so only the launches over the rows' own pages are prepared."""

    def __init__(self, nested: bool | None = None) -> None:
        self._last: DecodePlan | None = None
        self.nested = nested_from_env() if nested is None else nested

    def plan(self, csr: PagedCsrView, settings: CascadeSettings, shape: AttentionShape) -> DecodePlan:
        last = self._last
        if last is None or last.failed or last.shape != shape:
            self._last = DecodePlan(csr, settings, shape, self.nested)
        elif last.structure is not csr.structure or last.settings != settings:
            # A new layout keeps the last one's level launches where its spans are the same.
            grown = last.settings == settings and last.structure.lineage is csr.structure.lineage
            self._last = DecodePlan(csr, settings, shape, self.nested, last.cascade_launch,
                                    last.decision if grown else None)
        return self._last


_logged_outcomes: set[str] = set()


def log_first_launch(outcome: DecodeOutcome) -> None:
    """Log the first launch of each distinct outcome once per process."""
    if outcome.kind in _logged_outcomes:
        return
    _logged_outcomes.add(outcome.kind)
    backend = kernels.backend_name()
    if outcome.kind == CASCADE:
        plan = outcome.plan
        spans = ", ".join(f"rows {list(s.members)} pages {s.start}-{s.end}" for s in plan.spans)
        log.info("paged decode v2: fused v2 cascade launch (batch %d, %d of them sharing %d pages / %d KV tokens "
                 "read once; spans: %s; %s kernels)", outcome.batch, outcome.member_rows,
                 sum(s.pages for s in plan.spans), outcome.shared_tokens, spans, backend)
    elif outcome.kind == CASCADE_FALLBACK:
        log.warning("paged decode v2: %s; ran the flat fused v2 launch instead (batch %d, %s kernels)",
                    outcome.reason, outcome.batch, backend)
    elif outcome.kind == FLAT:
        log.info("paged decode v2: fused v2 flat launch (batch %d; %s; %s kernels)",
                 outcome.batch, outcome.reason, backend)
    else:
        log.info("paged decode v2: gather launch (batch %d, %s; contiguous K/V + "
                 "mx.fast.scaled_dot_product_attention)", outcome.batch, outcome.reason)


def gather_outcome(rows: int, query_tokens: int) -> DecodeOutcome:
    return DecodeOutcome(GATHER, rows, None, 0, f"{query_tokens} query tokens per row")


def paged_decode_attention(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *,
                           scale: float, config: CascadeConfig | CascadeSettings,
                           metrics: OutcomeRecorder | None = None) -> mx.array:
    """One layer's attention, standalone: q [R, Hq, D] (or mlx-lm's [R, Hq, L, D])
    -> o of the same shape and dtype, planned as a step plans and launched.
    L > 1 takes the gather path without consulting cascade; with cascade off
    the page table is not scanned. The engine plans once per step instead."""
    if q.ndim == 4 and q.shape[2] != 1:
        o = paged_prefill_attention(q, k_pool, v_pool, csr, scale=scale)
        outcome = gather_outcome(q.shape[0], q.shape[2])
    else:
        rows = q.reshape(q.shape[0], q.shape[1], q.shape[-1])
        check_inputs(rows, k_pool, csr)
        settings = config.snapshot() if isinstance(config, CascadeConfig) else config
        plan = DecodePlan(csr, settings, AttentionShape.of(rows, k_pool, scale), nested_from_env())
        o = plan.attend(rows, k_pool, v_pool, csr.last_page_len).reshape(q.shape)
        outcome = plan.outcome
    log_first_launch(outcome)
    if metrics is not None:
        metrics.record_decode(outcome)
    return o
