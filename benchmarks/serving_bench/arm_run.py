"""What one arm measured for one (level, rep): the requests, the summary and
the arm-side figures a client cannot see (launch split, memory, decode rate)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .server_metrics import LaunchSplit
from .stats import RequestRecord, Summary, summarize


@dataclass
class ArmRun:
    arm: str
    concurrency: int
    rep: int
    variant: int
    shared_tokens: int               # common prefix of the level's prompts, in tokens
    records: list[RequestRecord]
    duration: float                  # seconds, first request sent to last token
    decode_seconds: float = math.nan  # time spent in decode steps (engine- or generator-side)
    decode_tokens: int = 0           # tokens those decode steps produced
    peak_memory_bytes: float = math.nan  # mx.get_peak_memory of the arm's process
    kv_peak_bytes: float = math.nan      # KV cache bytes in use at the peak
    kv_dtype: str = ""                   # the pool's page format as the server reports it ("" unknown)
    launches: LaunchSplit | None = None

    @property
    def summary(self) -> Summary:
        return summarize(self.records, self.duration)

    @property
    def decode_throughput(self) -> float:
        """Decode tokens per second of decode-step time."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else math.nan

    @property
    def has_token_ids(self) -> bool:
        return all(r.token_ids for r in self.records)

    def outputs(self, token_ids: bool) -> list:
        """Each client's output in client order: its token ids, or its text."""
        ordered = sorted(self.records, key=lambda r: r.index)
        return [tuple(r.token_ids) if token_ids else r.text for r in ordered]
