"""Prefix cache: full blocks indexed by a chained hash of their tokens, and the
page-table operations that keep refcounts right (adopt, extend, fork, release).

A full block's key is hash(parent key, its tokens). A lookup walks a prompt's
blocks from the start and accepts block i only if its stored tokens equal the
prompt's and its stored parent is the entry accepted for block i-1, so a hash
collision can never hand out bytes computed for another prefix.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .pool import BlockPool
from .sequence import Sequence

ROOT_HASH = 0
ROOT_UID = 0


def block_hash(parent: int, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


@dataclass(frozen=True)
class CachedBlock:
    block: int
    key: int
    tokens: tuple[int, ...]
    parent_uid: int
    uid: int


@dataclass(frozen=True)
class PrefixCacheStats:
    queries: int
    hits: int
    prefix_tokens_reused: int
    evictions: int
    cached_blocks: int
    reusable_blocks: int

    @property
    def misses(self) -> int:
        return self.queries - self.hits


class PrefixCache:
    def __init__(self, pool: BlockPool, enabled: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enabled = enabled
        self._by_key: dict[int, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}
        self._uids = itertools.count(ROOT_UID + 1)
        self.queries = self.hits = self.prefix_tokens_reused = self.evictions = 0
        pool.keep_on_release = self._by_block.__contains__
        pool.on_reclaim = self._evict

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.queries, self.hits, self.prefix_tokens_reused,
                                self.evictions, len(self._by_block), len(self.pool.reusable))

    def _evict(self, block: int) -> None:
        entry = self._by_block.pop(block)
        del self._by_key[entry.key]
        self.evictions += 1

    def _lookup(self, tokens: list[int], max_blocks: int) -> list[CachedBlock]:
        bs, key, uid, found = self.block_size, ROOT_HASH, ROOT_UID, []
        for i in range(max_blocks):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            key = block_hash(key, chunk)
            entry = self._by_key.get(key)
            if entry is None or entry.tokens != chunk or entry.parent_uid != uid:
                break
            found.append(entry)
            uid = entry.uid
        return found

    # -- page-table operations ------------------------------------------

    def adopt(self, seq: Sequence) -> int:
        """Give a new sequence the longest cached prefix of its tokens; returns tokens reused.

        At least one token is left uncached so the step that computes it yields logits.
        """
        if seq.block_table:
            raise ValueError(f"sequence {seq.id} already holds pages")
        found = self._lookup(seq.token_ids, (len(seq) - 1) // self.block_size) if self.enabled else []
        self.pool.incref(e.block for e in found)
        seq.set_table([e.block for e in found])
        seq.block_chain = [(e.key, e.uid) for e in found]
        seq.num_cached_tokens = seq.num_reused_tokens = len(found) * self.block_size
        self.queries += 1
        if found:
            self.hits += 1
            self.prefix_tokens_reused += seq.num_cached_tokens
        return seq.num_cached_tokens

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def extend(self, seq: Sequence, num_tokens: int) -> None:
        """Make the page table cover num_tokens positions; PoolExhausted changes nothing."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed:
            seq.set_table(seq.block_table + self.pool.allocate(needed))

    def commit(self, seq: Sequence) -> None:
        """Index the sequence's blocks that became full since the last commit."""
        if not self.enabled:
            return
        bs = self.block_size
        full = seq.num_cached_tokens // bs
        while len(seq.block_chain) < full:
            i = len(seq.block_chain)
            key, uid = seq.block_chain[-1] if seq.block_chain else (ROOT_HASH, ROOT_UID)
            if uid is None:  # an ancestor could not be indexed: neither can this block
                seq.block_chain.append((key, None))
                continue
            chunk = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            key = block_hash(key, chunk)
            entry = self._by_key.get(key)
            if entry is None:
                entry = CachedBlock(seq.block_table[i], key, chunk, uid, next(self._uids))
                self._by_key[key] = entry
                self._by_block[entry.block] = entry
            elif entry.tokens != chunk or entry.parent_uid != uid:
                entry = None  # a collision: the key belongs to other bytes
            seq.block_chain.append((key, entry.uid if entry else None))

    def release(self, seq: Sequence) -> None:
        self.pool.decref(seq.block_table)
        seq.set_table([])
        seq.block_chain = []
        seq.num_cached_tokens = 0
