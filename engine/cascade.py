"""Cascade planning: which page spans of a decode step's rows are attended
once, for all the rows that share them.

Detection reads the page table positionally (two rows whose page i is the same
block id share those bytes), never refcounts. Rows are grouped by their first
page and each group is walked as a trie over page positions: a node is a set
of rows with identical pages up to its end and its own pages from its parent's
end, split where block ids diverge or where a row's pages run out (a span
never reaches a member's last page, the only page that may be partial). The
whole forest is the plan: every node with at least ``min_members`` rows whose
pages, counted from where its rows' previous span ended, number at least
``min_shared_pages`` is a span; a node below them leaves its pages to its
children (or to the private level). A caller's ``pays`` may decline a span
too (the fused kernels' cost model); its pages go the same way. A row
entering its first page mid-page is in no span.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol

import numpy as np

from mlxcel.kernels.csr import HostCsr, PagedCsrView


class PlannerSettings(Protocol):
    min_shared_pages: int
    min_members: int


@dataclass(frozen=True)
class SharedSpan:
    """Pages [start, end) of every member's row are the same block ids."""

    members: tuple[int, ...]
    start: int
    end: int

    @property
    def pages(self) -> int:
        return self.end - self.start

    @property
    def saved_reads(self) -> int:
        return self.pages * (len(self.members) - 1)


def best_span(spans) -> SharedSpan:
    """The span removing the most page reads; ties go to the longer span, then
    to the one whose first row comes first."""
    return max(spans, key=lambda s: (s.saved_reads, s.pages, -s.members[0]))


@dataclass(frozen=True)
class CascadePlan:
    members: list[int]   # rows of the span with the most saved reads, ascending
    shared_pages: int    # that span's pages (never a member's last page)
    # Every span attended once, by depth (outermost first), then by first row
    # (DESIGN.md, "Several subgroups and nested spans"). A plan built from
    # members and shared_pages alone is that one span from page 0.
    spans: tuple[SharedSpan, ...] = ()

    def __post_init__(self) -> None:
        if not self.spans:
            object.__setattr__(self, "spans", (SharedSpan(tuple(self.members), 0, self.shared_pages),))

    @classmethod
    def of(cls, spans) -> "CascadePlan":
        """The plan of these spans (each member's contiguous from page 0, nested)."""
        depth_of = span_depths(spans)
        ordered = tuple(sorted(spans, key=lambda s: (depth_of[s], s.members[0])))
        best = best_span(ordered)
        return cls(list(best.members), best.pages, ordered)

    @cached_property
    def levels(self) -> tuple[tuple[SharedSpan, ...], ...]:
        """The spans at each depth: a member's d-th span is at depth d. Spans of
        one depth have disjoint members, so one launch serves them all."""
        depth_of = span_depths(self.spans)
        depth = max(depth_of.values()) + 1
        return tuple(tuple(s for s in self.spans if depth_of[s] == d) for d in range(depth))

    @property
    def depth(self) -> int:
        return len(self.levels)

    def depth_of(self, span: SharedSpan) -> int:
        return next(d for d, level in enumerate(self.levels) if span in level)


def span_depths(spans) -> dict[SharedSpan, int]:
    """Each span's depth: how many spans of its first member end at or before its start."""
    return {s: sum(1 for o in spans if s.members[0] in o.members and o.end <= s.start) for s in spans}


@dataclass(frozen=True)
class CascadeDecision:
    plan: CascadePlan | None
    reason: str                   # why it cascades, or which rule declined it
    dropped: tuple[int, ...] = ()  # rows entering mid-page, left out of detection


@dataclass(frozen=True)
class Node:
    """A trie node: ``rows`` have identical pages [0, end); its own pages
    start at ``begin``, its parent's end."""

    rows: tuple[int, ...]
    begin: int
    end: int
    children: tuple["Node", ...]

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def node_tree(order: list[int], shared: list[int], lo: int, hi: int, begin: int) -> Node:
    """The node of rows order[lo:hi] (>= 2, ``shared[i]`` the pages rows
    order[i] and order[i + 1] may share) and the nodes below it: its end is
    the least sharing inside, its children the runs sharing more."""
    end = min(shared[lo:hi - 1])
    children, start = [], lo
    for i in range(lo, hi):
        if i == hi - 1 or shared[i] == end:      # a run ends after row i
            if i + 1 - start >= 2:
                children.append(node_tree(order, shared, start, i + 1, end))
            start = i + 1
    return Node(tuple(sorted(order[lo:hi])), begin, end, tuple(children))


def page_forest(host: HostCsr) -> tuple[list[Node], tuple[int, ...]]:
    """One trie per first-page group of two or more rows, and the rows dropped
    for entering mid-page while sharing their first page.

    Two rows may share pages up to where their block ids first differ, and
    never a row's last page; this sharing is an ultrametric, so its trie
    follows from sorting the rows by their pages (cut before the last) and
    comparing each with the next."""
    pages = host.num_pages()
    has_pages = pages > 0
    first = np.full(len(pages), -1, np.int64)
    first[has_pages] = host.indices[host.indptr[:-1][has_pages]]
    values, counts = np.unique(first[has_pages], return_counts=True)
    shares_first = has_pages & np.isin(first, values[counts > 1])
    mid_page = has_pages & (host.first_page_offset != 0)
    dropped = tuple(int(r) for r in np.flatnonzero(mid_page & shares_first))

    limit = pages - 1                        # a member keeps its last page private
    eligible = np.flatnonzero(has_pages & ~mid_page & (limit >= 1) & shares_first)
    if len(eligible) < 2:                    # the common no-sharing case stops here
        return [], dropped
    width = int(limit[eligible].max())
    column = np.arange(width)
    inside = column < limit[eligible, None]
    position = np.where(inside, host.indptr[eligible, None] + column, 0)
    # Big-endian, -1 past a row's limit: byte order keeps rows with a common prefix together.
    tables = np.where(inside, host.indices[position], -1).astype(">i4")
    order = sorted(range(len(eligible)), key=lambda i: tables[i].tobytes())
    same = tables[order[1:]] == tables[order[:-1]]
    differ = np.where(same.all(axis=1), width, np.argmin(same, axis=1))
    reach = np.minimum(limit[eligible][order[1:]], limit[eligible][order[:-1]])
    shared = np.minimum(differ, reach).tolist()
    rows = eligible[order].tolist()
    roots, start = [], 0
    for i in range(len(rows)):
        if i == len(rows) - 1 or shared[i] == 0:  # a first-page group ends after row i
            if i + 1 - start >= 2:
                roots.append(node_tree(rows, shared, start, i + 1, 0))
            start = i + 1
    return roots, dropped


# (pages, members) of a span -> whether it is kept (a backend's cost model).
SpanFilter = Callable[[int, int], bool]


def select_spans(node: Node, start: int, depth: int, rules: "SpanRules", kept: list[SharedSpan]) -> None:
    """Spans of ``node`` and below, its rows' ``depth`` spans so far ending at ``start``."""
    if depth < rules.max_depth and rules.keeps(node.end - start, len(node.rows)):
        kept.append(SharedSpan(node.rows, start, node.end))
        start, depth = node.end, depth + 1
    for child in node.children:
        select_spans(child, start, depth, rules, kept)


@dataclass(frozen=True)
class SpanRules:
    min_shared_pages: int
    min_members: int
    pays: SpanFilter | None = None
    max_depth: int = 1 << 30

    def keeps(self, pages: int, members: int) -> bool:
        return (pages >= self.min_shared_pages and members >= self.min_members
                and (self.pays is None or self.pays(pages, members)))


def one_level(roots: list[Node], rules: SpanRules) -> list[SharedSpan]:
    """The one span from page 0 that removes the most page reads (the seed's
    planner: one subgroup, one level); ties go to the longer span, then to the
    subgroup whose first row comes first."""
    spans = [SharedSpan(n.rows, 0, n.end) for root in roots for n in root.walk() if rules.keeps(n.end, len(n.rows))]
    return [best_span(spans)] if spans else []


def describe(plan: CascadePlan, block_size: int) -> str:
    best = best_span(plan.spans)
    text = f"{len(best.members)} rows share {best.pages} pages ({best.pages * block_size} tokens)"
    if len(plan.spans) == 1:
        return text
    groups = len({s.members[0] for s in plan.levels[0]})
    return f"{len(plan.spans)} spans in {groups} groups, {plan.depth} deep; most saved: {text}"


def decide(host: HostCsr, min_shared_pages: int, min_members: int, pays: SpanFilter | None = None,
           max_depth: int | None = None, nested: bool = True) -> CascadeDecision:
    """Every span passing both thresholds (and ``pays``, at most ``max_depth``
    deep), or, not ``nested``, the one best span; or the rule that declined."""
    roots, dropped = page_forest(host)
    note = f"; rows entering mid-page dropped: {', '.join(map(str, dropped))}" if dropped else ""
    rules = SpanRules(min_shared_pages, min_members, pays, max_depth or SpanRules.max_depth)
    kept: list[SharedSpan] = []
    if not nested:
        kept = one_level(roots, rules)
    for root in roots if nested else ():
        select_spans(root, 0, 0, rules, kept)
    if kept:
        plan = CascadePlan.of(kept)
        return CascadeDecision(plan, describe(plan, host.block_size) + note, dropped)
    if not roots:
        return CascadeDecision(None, f"no two rows share a first page{note}", dropped)
    nodes = [n for root in roots for n in root.walk()]
    enough_members = [n for n in nodes if len(n.rows) >= min_members]
    if not enough_members:
        most = max(len(n.rows) for n in nodes)
        return CascadeDecision(None, f"{most} members < min_members {min_members}{note}", dropped)
    span = max(n.end for n in enough_members)
    if span >= min_shared_pages:             # a filter declined what the thresholds allowed
        return CascadeDecision(None, f"no span pays on these kernels{note}", dropped)
    return CascadeDecision(None, f"best subgroup shares {span} pages < min_shared_pages {min_shared_pages}{note}",
                           dropped)


def explain_cascade(csr: PagedCsrView, config: PlannerSettings, pays: SpanFilter | None = None,
                    max_depth: int | None = None, nested: bool = True) -> CascadeDecision:
    """The decision for this view (a decode step plans once, before its first layer)."""
    return decide(csr.host, config.min_shared_pages, config.min_members, pays, max_depth, nested)


def plan_cascade(csr: PagedCsrView, config: PlannerSettings) -> CascadePlan | None:
    """The cascade plan for this step, or None. Does not look at ``enabled``:
    the decode path only calls the planner when cascade is on."""
    return explain_cascade(csr, config).plan
