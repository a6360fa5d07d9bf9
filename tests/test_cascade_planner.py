"""Cascade planner: one test per decline rule, subgroup search,
and a brute-force check over random page tables."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel.engine.cascade import CascadePlan, SharedSpan, explain_cascade, plan_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.kernels import PagedCsrView
from mlxcel.kernels.csr import host_csr
from paged_cases import tree_tables

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
    # A member whose table ends inside the shared run ends the outer span at
    # its pages - 1; the others go on sharing in a nested span.
    short = SHARED[:5]
    decision = explain_cascade(view([short, SHARED + private(1, 1), SHARED + private(2, 1)]), settings_())
    assert decision.plan.spans == (SharedSpan((0, 1, 2), 0, 4), SharedSpan((1, 2), 4, 8))
    assert (decision.plan.members, decision.plan.shared_pages) == ([0, 1, 2], 4)   # 8 saved reads against 4
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


def test_disjoint_groups_each_get_their_span():
    other = list(range(200, 220))
    # Group A: 2 rows x 12 pages saves 12; group B: 4 rows x 5 pages saves 15.
    tables = [other[:12] + private(0, 1), SHARED[:5] + private(1, 1), other[:12] + private(2, 1),
              SHARED[:5] + private(3, 1), SHARED[:5] + private(4, 1), SHARED[:5] + private(5, 1)]
    plan = plan_cascade(view(tables), settings_())
    assert plan.spans == (SharedSpan((0, 2), 0, 12), SharedSpan((1, 3, 4, 5), 0, 5))
    assert plan.levels == (plan.spans,)                       # one depth: one launch serves both
    assert (plan.members, plan.shared_pages) == ([1, 3, 4, 5], 5)
    # A's span grows past B's saved reads (2 x 16 saves 16 > 15): members follow it.
    tables[0] = other[:16] + private(0, 1)
    tables[2] = other[:16] + private(2, 1)
    assert plan_cascade(view(tables), settings_()).members == [0, 2]
    # The thresholds apply per span: with min_members 3 only B is one.
    assert plan_cascade(view(tables), settings_(min_members=3)) == CascadePlan([1, 3, 4, 5], 5)


def test_a_shorter_member_does_not_shorten_the_others():
    # Rows 0, 1, 3 share 8 pages; row 2 diverges after 2: the four rows share
    # [0, 2), the three go on to 8 in a nested span.
    tables = [SHARED + private(0, 1), SHARED + private(1, 2), SHARED[:2] + private(3, 5), SHARED + private(2, 1)]
    plan = plan_cascade(view(tables), settings_())
    assert plan.spans == (SharedSpan((0, 1, 2, 3), 0, 2), SharedSpan((0, 1, 3), 2, 8))
    assert plan.members == [0, 1, 3] and plan.shared_pages == 6
    # Below the threshold the outer node leaves its pages to the nested one.
    assert plan_cascade(view(tables), settings_(min_shared_pages=6)).spans == (SharedSpan((0, 1, 3), 0, 8),)


def test_ties_break_deterministically():
    other = list(range(200, 210))
    tables = [other[:4] + private(0, 1), SHARED[:4] + private(1, 1), other[:4] + private(2, 1),
              SHARED[:4] + private(3, 1)]
    # Equal saved reads and pages: members are the span whose first row comes first.
    plan = plan_cascade(view(tables), settings_())
    assert plan.members == [0, 2] and len(plan.spans) == 2


def test_nesting_three_deep_and_two_groups(rng):
    # Group A: 6 pages for 4 rows, then 3 pages for two of them, then 2 more
    # for both of those; group B: 4 pages for 3 rows. Rows shuffled.
    tree_a = (6, [(3, [(2, [1, 2])]), 1, 3])
    tree_b = (4, [2, 1, 1])
    tables = tree_tables(rng, tree_a) + tree_tables(rng, tree_b)
    order = rng.permutation(len(tables))
    shuffled = [tables[i] for i in order]
    row = {old: new for new, old in enumerate(order)}
    plan = plan_cascade(view(shuffled), settings_())
    rows = lambda olds: tuple(sorted(row[o] for o in olds))        # noqa: E731
    want = {SharedSpan(rows([0, 1, 2, 3]), 0, 6), SharedSpan(rows([0, 1]), 6, 11), SharedSpan(rows([4, 5, 6]), 0, 4)}
    assert set(plan.spans) == want
    # The two rows sharing 6 + 3 + 2 pages are one node (nothing tells 3 from 2):
    # depth 2; a third level appears once a third row leaves in the middle.
    assert plan.depth == 2
    tree_a = (6, [(3, [(2, [1, 2]), 1]), 1, 3])
    tables = tree_tables(rng, tree_a) + tree_tables(rng, tree_b)
    plan = plan_cascade(view(tables), settings_())
    assert plan.depth == 3
    assert plan.levels[0] == (SharedSpan((0, 1, 2, 3, 4), 0, 6), SharedSpan((5, 6, 7), 0, 4))
    assert plan.levels[1] == (SharedSpan((0, 1, 2), 6, 9),)
    assert plan.levels[2] == (SharedSpan((0, 1), 9, 11),)


def test_a_nested_node_below_the_thresholds_goes_to_its_children_or_private(rng):
    # 4 rows share 8 pages; two of them 1 more (below min_shared_pages 2), of
    # which... none go further: the page stays private. With a deeper pair
    # below it the page goes to the pair's span.
    tables = tree_tables(rng, (8, [(1, [1, 2]), 1, 2]))
    plan = plan_cascade(view(tables), settings_(min_shared_pages=2))
    assert plan.spans == (SharedSpan((0, 1, 2, 3), 0, 8),)
    tables = tree_tables(rng, (8, [(1, [(3, [1, 1]), 1]), 1, 2]))
    plan = plan_cascade(view(tables), settings_(min_shared_pages=2))
    assert plan.spans == (SharedSpan((0, 1, 2, 3, 4), 0, 8), SharedSpan((0, 1), 8, 12))
    # Too few members at the nested node: its pages stay private.
    plan = plan_cascade(view(tables), settings_(min_shared_pages=2, min_members=3))
    assert plan.spans == (SharedSpan((0, 1, 2, 3, 4), 0, 8),)


def sharers(tables, offsets, row, page):
    """Rows sharing ``row``'s page ``page`` (same pages up to it, both with a
    later page, neither entering mid-page): what a span over it must hold."""
    if offsets[row] or page >= len(tables[row]) - 1:
        return ()
    return tuple(r for r, t in enumerate(tables)
                 if offsets[r] == 0 and len(t) - 1 > page and t[:page + 1] == tables[row][:page + 1])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_planner_spans_are_the_forest(data):
    rows = data.draw(st.integers(2, 7))
    # Small alphabets make shared prefixes, divergences, nesting and ties common.
    tables = [data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=7)) for _ in range(rows)]
    offsets = data.draw(st.lists(st.sampled_from([0, 0, 0, 3]), min_size=rows, max_size=rows))
    min_shared, min_members = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 3))
    plan = plan_cascade(view(tables, offsets=offsets), settings_(min_shared, min_members))
    spans = plan.spans if plan else ()
    covered = {}
    for span in spans:
        assert len(span.members) >= min_members and span.pages >= min_shared
        for member in span.members:
            assert offsets[member] == 0 and len(tables[member]) > span.end          # never the last page
            assert tables[member][:span.end] == tables[span.members[0]][:span.end]
            for page in range(span.start, span.end):
                assert (member, page) not in covered
                covered[member, page] = span
    for member in {m for s in spans for m in s.members}:
        own = sorted((s for s in spans if member in s.members), key=lambda s: s.start)
        assert own[0].start == 0                                                     # contiguous from page 0
        for outer, inner in zip(own, own[1:]):
            assert inner.start == outer.end and set(inner.members) <= set(outer.members)   # nested
        assert [plan.levels[d].count(s) for d, s in enumerate(own)] == [1] * len(own)    # depth = position
    for row in range(rows):
        for page in range(len(tables[row])):
            span = covered.get((row, page))
            # Each page's span holds exactly its sharers; with one-page spans
            # allowed every page with enough sharers is in one.
            if span is not None:
                assert set(span.members) <= set(sharers(tables, offsets, row, page))
                assert min_shared > 1 or set(span.members) == set(sharers(tables, offsets, row, page))
            elif min_shared == 1:
                assert len(sharers(tables, offsets, row, page)) < min_members
    if plan:
        best = max(s.saved_reads for s in spans)
        assert (len(plan.members) - 1) * plan.shared_pages == best
        assert plan.members == sorted(plan.members)
