"""mlxcel.engine: the paged-KV inference engine. The decode-attention API of
DESIGN.md is importable from here."""

from .attention import paged_decode_attention, paged_prefill_attention
from .cascade import CascadeDecision, CascadePlan, explain_cascade, plan_cascade
from .config import CascadeConfig, ConfigError
from .metrics import EngineMetrics

__all__ = [
    "CascadeConfig", "CascadeDecision", "CascadePlan", "ConfigError", "EngineMetrics",
    "explain_cascade", "paged_decode_attention", "paged_prefill_attention", "plan_cascade",
]
