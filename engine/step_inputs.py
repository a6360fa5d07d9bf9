"""What one forward pass is built from, on the host, and its wire form.

Rank 0 derives a StepInputs from the scheduled step; under tensor parallelism
it sends ``pack()``'s int32 words to the other ranks, which rebuild the same
StepInputs and so the same graph (same page tables, same positions, same
decode plan: the plan depends on the page tables and the settings only).
The decode rows' input tokens are not here: they may still be on the device
(the previous step's lazy output) and travel inside the step's graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import CascadeSettings
from .scheduler import ScheduledStep


@dataclass(frozen=True)
class StepInputs:
    decode_keys: tuple[tuple[int, int], ...]     # (sequence id, table version) per decode row: the CSR cache key
    decode_tables: tuple[tuple[int, ...], ...]   # each decode row's page table
    positions: tuple[int, ...]                   # each decode row's position (its new token's)
    prefill_table: tuple[int, ...] | None        # the prefilling sequence's page table, if one rides along
    prefill_start: int
    prefill_end: int
    prefill_tokens: tuple[int, ...]              # its prompt tokens [prefill_start, prefill_end)
    finishes_prefill: bool
    settings: CascadeSettings

    @classmethod
    def of(cls, batch: ScheduledStep, settings: CascadeSettings) -> "StepInputs":
        decode, seq = batch.decode, batch.prefill
        return cls(tuple((s.id, s.table_version) for s in decode), tuple(tuple(s.block_table) for s in decode),
                   tuple(s.num_cached_tokens for s in decode),
                   tuple(seq.block_table) if seq is not None else None, batch.prefill_start, batch.prefill_end,
                   tuple(seq.token_ids[batch.prefill_start:batch.prefill_end]) if seq is not None else (),
                   batch.finishes_prefill, settings)

    @property
    def decode_rows(self) -> int:
        return len(self.positions)

    @property
    def prefill_rows(self) -> int:
        return self.prefill_end - self.prefill_start

    def pack(self) -> np.ndarray:
        """int32 words: counts and settings first, then each variable-length part."""
        s, prefill = self.settings, self.prefill_table
        head = [self.decode_rows, -1 if prefill is None else len(prefill), self.prefill_start, self.prefill_end,
                int(self.finishes_prefill), int(s.enabled), s.min_shared_pages, s.min_members, s.version]
        parts = [head, [k for key in self.decode_keys for k in key], [len(t) for t in self.decode_tables],
                 [b for t in self.decode_tables for b in t], self.positions, prefill or (), self.prefill_tokens]
        return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])

    @classmethod
    def unpack(cls, words: np.ndarray) -> "StepInputs":
        words = [int(w) for w in words]
        rows, prefill_len, start, end, finishes, enabled, min_pages, min_members, version = words[:9]
        at = 9

        def take(n: int) -> list[int]:
            nonlocal at
            at += n
            return words[at - n:at]

        keys = take(2 * rows)
        lengths = take(rows)
        flat = take(sum(lengths))
        tables, offset = [], 0
        for n in lengths:
            tables.append(tuple(flat[offset:offset + n]))
            offset += n
        positions = take(rows)
        prefill = tuple(take(prefill_len)) if prefill_len >= 0 else None
        tokens = take(end - start) if prefill is not None else []
        if at != len(words):
            raise ValueError(f"a step message of {len(words)} words holds {at}: the ranks disagree on its form")
        return cls(tuple(zip(keys[::2], keys[1::2])), tuple(tables), tuple(positions), prefill, start, end,
                   tuple(tokens), bool(finishes),
                   CascadeSettings(bool(enabled), min_pages, min_members, version))
