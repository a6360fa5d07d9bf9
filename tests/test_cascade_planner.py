"""Cascade planner: one test per decline rule, subgroup search,
and a brute-force check over random page tables."""

from __future__ import annotations

from itertools import combinations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel.engine.cascade import CascadePlan, explain_cascade, plan_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.kernels import PagedCsrView
from mlxcel.kernels.csr import host_csr

BS = 16


def view(tables, last_fill=None, offsets=None):
    """Rows whose last page holds ``last_fill`` tokens (default: half full)."""
    fill = last_fill or [BS // 2] * len(tables)
    tokens = [(len(t) - 1) * BS + f for t, f in zip(tables, fill)]
    return PagedCsrView.from_host(host_csr(tables, tokens, BS, offsets))


def settings_(min_shared_pages=2, min_members=2):
    return CascadeConfig(enabled=True, min_shared_pages=min_shared_pages, min_members=min_members)


SHARED = list(range(100, 108))   # 8 shared block ids


def private(row, n):
    return [1000 + 10 * row + i for i in range(n)]


def test_rows_sharing_a_prefix_cascade():
    csr = view([SHARED + private(0, 2), SHARED + private(1, 1), SHARED + private(2, 3)])
    decision = explain_cascade(csr, settings_())
    assert decision.plan == CascadePlan([0, 1, 2], 8)
    assert decision.reason == "3 rows share 8 pages (128 tokens)"


def test_no_two_rows_share_a_first_page():
    csr = view([private(0, 4), private(1, 4)])
    decision = explain_cascade(csr, settings_())
    assert decision.plan is None and decision.reason == "no two rows share a first page"


def test_mid_page_row_is_dropped_and_the_rest_cascades():
    tables = [SHARED + private(0, 1), SHARED + private(1, 1), SHARED + private(2, 1)]
    decision = explain_cascade(view(tables, offsets=[0, 5, 0]), settings_())
    assert decision.plan == CascadePlan([0, 2], 8)
    assert decision.dropped == (1,)
    assert "rows entering mid-page dropped: 1" in decision.reason


def test_only_mid_page_rows_left_declines():
    decision = explain_cascade(view([SHARED + private(0, 1), SHARED + private(1, 1)], offsets=[3, 0]), settings_())
    assert decision.plan is None
    assert decision.reason == "no two rows share a first page; rows entering mid-page dropped: 0"


def test_span_is_capped_below_every_members_last_page():
    # Identical tables: sharing every page, but the last page stays private.
    decision = explain_cascade(view([SHARED, SHARED, SHARED]), settings_())
    assert decision.plan == CascadePlan([0, 1, 2], len(SHARED) - 1)
    # A member whose table ends inside the shared run caps the span at its pages - 1.
    short = SHARED[:5]
    decision = explain_cascade(view([short, SHARED + private(1, 1), SHARED + private(2, 1)]), settings_())
    # {0, 1, 2} x 4 pages and {1, 2} x 8 pages both save 8 reads: the longer span wins the tie.
    assert decision.plan == CascadePlan([1, 2], 8)
    decision = explain_cascade(view([short, SHARED + private(1, 1)]), settings_())
    assert decision.plan == CascadePlan([0, 1], 4)


def test_too_few_shared_pages_declines():
    csr = view([SHARED[:3] + private(0, 2), SHARED[:3] + private(1, 2)])
    decision = explain_cascade(csr, settings_(min_shared_pages=4))
    assert decision.plan is None
    assert decision.reason == "best subgroup shares 3 pages < min_shared_pages 4"
    assert plan_cascade(csr, settings_(min_shared_pages=3)) == CascadePlan([0, 1], 3)


def test_too_few_members_declines():
    csr = view([SHARED + private(0, 1), SHARED + private(1, 1), private(2, 9)])
    decision = explain_cascade(csr, settings_(min_members=3))
    assert decision.plan is None and decision.reason == "2 members < min_members 3"


def test_competing_groups_the_most_saved_reads_wins():
    other = list(range(200, 220))
    # Group A: 2 rows x 12 pages -> saves 12; group B: 4 rows x 5 pages -> saves 15.
    tables = [other[:12] + private(0, 1), SHARED[:5] + private(1, 1), other[:12] + private(2, 1),
              SHARED[:5] + private(3, 1), SHARED[:5] + private(4, 1), SHARED[:5] + private(5, 1)]
    assert plan_cascade(view(tables), settings_()) == CascadePlan([1, 3, 4, 5], 5)
    # Make A's span long enough to win (2 x 16 saves 16 > 15).
    tables[0] = other[:16] + private(0, 1)
    tables[2] = other[:16] + private(2, 1)
    assert plan_cascade(view(tables), settings_()) == CascadePlan([0, 2], 16)
    # The threshold filters before the comparison: with min_members 3 only B qualifies.
    assert plan_cascade(view(tables), settings_(min_members=3)) == CascadePlan([1, 3, 4, 5], 5)


def test_a_shorter_member_does_not_shorten_the_others():
    # Rows 0, 1, 3 share 8 pages; row 2 diverges after 2. {0, 1, 3} x 8 saves 16,
    # {0, 1, 2, 3} x 2 saves 6: the early divergence must not cut everyone to 2.
    tables = [SHARED + private(0, 1), SHARED + private(1, 2), SHARED[:2] + private(3, 5), SHARED + private(2, 1)]
    assert plan_cascade(view(tables), settings_()) == CascadePlan([0, 1, 3], 8)
    # ... nor sink it below the threshold.
    assert plan_cascade(view(tables), settings_(min_shared_pages=6)) == CascadePlan([0, 1, 3], 8)


def test_ties_break_deterministically():
    other = list(range(200, 210))
    tables = [other[:4] + private(0, 1), SHARED[:4] + private(1, 1), other[:4] + private(2, 1),
              SHARED[:4] + private(3, 1)]
    # Equal saved reads and spans: the subgroup whose first row comes first.
    assert plan_cascade(view(tables), settings_()) == CascadePlan([0, 2], 4)


def brute_force_best(tables, offsets, min_shared_pages, min_members):
    """Best saved reads over every subset of rows (tiny inputs only)."""
    best = 0
    eligible = [r for r, t in enumerate(tables) if offsets[r] == 0 and len(t) >= 2]
    for size in range(max(2, min_members), len(eligible) + 1):
        for rows in combinations(eligible, size):
            span = 0
            limit = min(len(tables[r]) - 1 for r in rows)
            while span < limit and len({tables[r][span] for r in rows}) == 1:
                span += 1
            if span >= min_shared_pages:
                best = max(best, span * (size - 1))
    return best


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_planner_finds_the_best_subgroup(data):
    rows = data.draw(st.integers(2, 6))
    # Small alphabets make shared prefixes, divergences and ties common.
    tables = [data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=6)) for _ in range(rows)]
    offsets = data.draw(st.lists(st.sampled_from([0, 0, 0, 3]), min_size=rows, max_size=rows))
    min_shared, min_members = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 3))
    csr = view(tables, offsets=offsets)
    plan = plan_cascade(csr, settings_(min_shared, min_members))
    best = brute_force_best(tables, offsets, min_shared, min_members)
    if plan is None:
        assert best == 0
        return
    members, span = plan.members, plan.shared_pages
    assert span * (len(members) - 1) == best
    assert len(members) >= min_members and span >= min_shared
    assert all(offsets[r] == 0 and len(tables[r]) > span for r in members)
    assert len({tuple(tables[r][:span]) for r in members}) == 1
    assert members == sorted(members)
    np.testing.assert_array_equal(csr.host.pages(members[0])[:span], tables[members[0]][:span])
