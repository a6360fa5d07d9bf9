import math
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mlxcel.engine import prefix_cache as prefix_cache_module
from mlxcel.engine.pool import BlockPool, PoolExhausted, PoolGeometry
from mlxcel.engine.prefix_cache import PrefixCache
from mlxcel.engine.sequence import Sequence

BS = 4


def make_cache(num_blocks=64, block_size=BS):
    geo = PoolGeometry(num_layers=1, num_kv_heads=1, head_dim=4, block_size=block_size)
    return PrefixCache(BlockPool(geo, num_blocks))


def fill(cache, seq, upto=None):
    """Pretend the model computed K/V for the sequence's tokens (up to `upto`)."""
    n = len(seq) if upto is None else upto
    cache.extend(seq, n)
    seq.num_cached_tokens = n
    cache.commit(seq)


def test_second_sequence_adopts_the_shared_prompt():
    cache = make_cache()
    prompt = list(range(100, 100 + 4 * BS + 2))
    a = Sequence(prompt + [1, 2])
    cache.adopt(a)
    fill(cache, a)
    b = Sequence(prompt + [7, 8, 9])
    reused = cache.adopt(b)
    assert reused == 4 * BS
    assert b.block_table == a.block_table[:4]
    assert all(cache.pool.refcount[x] == 2 for x in a.block_table[:4])
    s = cache.stats()
    assert (s.queries, s.hits, s.misses, s.prefix_tokens_reused) == (2, 1, 1, 4 * BS)


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    cache = make_cache()
    a = Sequence(list(range(3 * BS)))
    cache.adopt(a)
    fill(cache, a)
    b = Sequence(list(range(3 * BS)))
    assert cache.adopt(b) == 2 * BS


def test_adopted_prefix_returns_the_bytes_that_were_written():
    geo = PoolGeometry(num_layers=2, num_kv_heads=2, head_dim=8, block_size=BS)
    cache = PrefixCache(BlockPool(geo, 16))
    pool = cache.pool
    a = Sequence(list(range(50, 50 + 3 * BS)))
    cache.adopt(a)
    cache.extend(a, len(a))
    rng = np.random.default_rng()
    written = rng.standard_normal((2, len(a), 2, 8)).astype(np.float32)
    blocks, offsets = pool.slots(a.block_table, 0, len(a))
    for layer in range(2):
        pool.write(layer, mx.array(blocks), mx.array(offsets), mx.array(written[layer]), mx.array(-written[layer]))
    a.num_cached_tokens = len(a)
    cache.commit(a)
    b = Sequence(a.token_ids[: 2 * BS] + [1, 2, 3])
    assert cache.adopt(b) == 2 * BS
    for layer in range(2):
        got = np.array(pool.keys[layer])[b.block_table].reshape(2 * BS, 2, 8)
        np.testing.assert_array_equal(got, written[layer, : 2 * BS])
        got_v = np.array(pool.values[layer])[b.block_table].reshape(2 * BS, 2, 8)
        np.testing.assert_array_equal(got_v, -written[layer, : 2 * BS])


def test_forced_hash_collision_does_not_share(monkeypatch):
    monkeypatch.setattr(prefix_cache_module, "block_hash", lambda parent, tokens: 42)
    cache = make_cache()
    a = Sequence(list(range(2 * BS + 1)))
    cache.adopt(a)
    fill(cache, a)
    b = Sequence([t + 1000 for t in range(2 * BS + 1)])
    assert cache.adopt(b) == 0
    assert not set(a.block_table) & set(b.block_table)
    # The same tokens under a colliding parent chain don't share past the first block either.
    c = Sequence(a.token_ids[:BS] + [999] * BS + [1])
    assert cache.adopt(c) == BS


def test_lru_keeps_a_returning_prompt_until_the_pool_needs_it():
    cache = make_cache(num_blocks=6)
    prompt = list(range(4 * BS))
    a = Sequence(prompt + [1])
    cache.adopt(a)
    fill(cache, a)
    cache.release(a)
    assert cache.pool.num_available == 6 and len(cache.pool.reusable) == 4
    b = Sequence(prompt + [2])
    assert cache.adopt(b) == 4 * BS  # a returning prompt hits again
    cache.release(b)
    big = Sequence(list(range(500, 500 + 5 * BS)))
    cache.adopt(big)
    cache.extend(big, len(big))  # needs 5 blocks: 2 free + 3 evicted, oldest first
    assert cache.stats().evictions == 3
    c = Sequence(prompt + [3])
    assert cache.adopt(c) == 0


def test_exhausted_extend_leaves_pool_and_tables_unchanged():
    cache = make_cache(num_blocks=4)
    a = Sequence(list(range(3 * BS)))
    cache.adopt(a)
    fill(cache, a)
    b = Sequence(list(range(900, 900 + 3 * BS)))
    cache.adopt(b)
    before = (list(cache.pool.refcount), list(cache.pool.free), list(a.block_table), list(b.block_table))
    with pytest.raises(PoolExhausted):
        cache.extend(b, len(b))
    assert (list(cache.pool.refcount), list(cache.pool.free), list(a.block_table), list(b.block_table)) == before


@pytest.mark.parametrize("prompt_tokens,private_tokens", [(8192, 40), (1000, 100), (64, 1)])
def test_storage_figure_one_copy_of_the_shared_prompt(prompt_tokens, private_tokens):
    """N sequences behind one S-token prompt with T private tokens each use
    floor(S/32) shared blocks plus, per sequence, the pages of its own tail
    (which starts in the prompt's partial last page when S isn't page-aligned)."""
    bs, n = 32, 4
    geo = PoolGeometry(num_layers=1, num_kv_heads=1, head_dim=4, block_size=bs)
    cache = PrefixCache(BlockPool(geo, 2048))
    prompt = list(np.random.default_rng().integers(0, 50_000, prompt_tokens))
    seqs = []
    for i in range(n):
        s = Sequence(prompt + [70_000 + i] * private_tokens)
        cache.adopt(s)
        fill(cache, s)
        seqs.append(s)
    shared_full = prompt_tokens // bs
    expected = shared_full + n * math.ceil((prompt_tokens % bs + private_tokens) / bs)
    assert cache.pool.num_live == expected
    assert expected <= math.ceil(prompt_tokens / bs) + n * (math.ceil(private_tokens / bs) + 1)
    assert cache.pool.num_live < n * math.ceil(prompt_tokens / bs)


class PoolMachine(RuleBasedStateMachine):
    """Random add/extend/fork/adopt/free/evict never leak or double-free a block,
    and every live block's count equals the number of page tables holding it."""

    def __init__(self):
        super().__init__()
        self.cache = make_cache(num_blocks=24)
        self.seqs: list[Sequence] = []

    tokens = st.lists(st.integers(0, 3), min_size=1, max_size=6 * BS)

    @rule(tokens=tokens)
    def add(self, tokens):
        seq = Sequence(tokens)
        self.cache.adopt(seq)
        try:
            fill(self.cache, seq)
        except PoolExhausted:
            self.cache.release(seq)
            return
        self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), more=st.lists(st.integers(0, 3), min_size=1, max_size=2 * BS))
    def extend(self, data, more):
        seq = data.draw(st.sampled_from(self.seqs))
        before = list(seq.block_table)
        seq.token_ids.extend(more)
        try:
            fill(self.cache, seq)
        except PoolExhausted:
            del seq.token_ids[-len(more):]
            assert seq.block_table == before

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.cache.release(seq)
        self.seqs.remove(seq)

    @invariant()
    def counts_match_tables(self):
        pool = self.cache.pool
        held = Counter(b for s in self.seqs for b in s.block_table)
        for block in range(pool.num_blocks):
            assert pool.refcount[block] == held.get(block, 0)
        free, kept = list(pool.free), list(pool.reusable)
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert not set(free) & set(kept)
        assert not (set(free) | set(kept)) & set(held)
        assert len(free) + len(kept) + len(held) == pool.num_blocks, "a block leaked"

    @invariant()
    def private_partial_pages(self):
        # Only full pages may be shared: a partial last page belongs to one sequence.
        for s in self.seqs:
            if s.num_cached_tokens % BS:
                assert self.cache.pool.refcount[s.block_table[-1]] == 1


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
