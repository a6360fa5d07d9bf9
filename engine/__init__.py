"""mlxcel.engine: the paged-KV inference engine. The decode-attention API of
DESIGN.md is importable from here."""

from .attention import paged_prefill_attention
from .cascade import CascadeDecision, CascadePlan, SharedSpan, explain_cascade, plan_cascade
from .config import CascadeConfig, ConfigError
from .decode_plan import DecodeOutcome, DecodePlan, DecodePlanner, paged_decode_attention
from .metrics import EngineMetrics

__all__ = [
    "CascadeConfig", "CascadeDecision", "CascadePlan", "ConfigError", "DecodeOutcome", "DecodePlan",
    "DecodePlanner", "EngineMetrics", "SharedSpan", "explain_cascade", "paged_decode_attention",
    "paged_prefill_attention", "plan_cascade",
]
