"""Cascade planning: which rows of a decode step share a leading page span
worth attending once.

Detection reads the page table positionally (two rows whose page i is the same
block id share those bytes), never refcounts. Rows are grouped by their first
page and each group is walked as a trie over page positions: at span length L
the candidates are rows with identical first L pages and more than L pages (a
span never reaches a member's last page, the only page that may be partial).
The subgroup removing the most page reads, ``shared_pages * (members - 1)``,
wins; ties go to the longer span, then to the subgroup whose first row comes
first. A row entering its first page mid-page is dropped, the rest may still
cascade.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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


@dataclass(frozen=True)
class CascadePlan:
    members: list[int]   # row indices, ascending
    shared_pages: int    # leading pages every member shares (never a member's last page)
    # The spans attended once, outermost first (DESIGN.md, "Several subgroups
    # and nested spans"); the planner finds one: pages [0, shared_pages) of members.
    spans: tuple[SharedSpan, ...] = ()

    def __post_init__(self) -> None:
        if not self.spans:
            object.__setattr__(self, "spans", (SharedSpan(tuple(self.members), 0, self.shared_pages),))


@dataclass(frozen=True)
class CascadeDecision:
    plan: CascadePlan | None
    reason: str                   # why it cascades, or which rule declined it
    dropped: tuple[int, ...] = ()  # rows entering mid-page, left out of detection


@dataclass(frozen=True)
class Candidate:
    span: int
    rows: tuple[int, ...]

    @property
    def saved_reads(self) -> int:
        return self.span * (len(self.rows) - 1)


def padded_tables(host: HostCsr) -> np.ndarray:
    """[R, max_pages] block ids, -1 past each row's end."""
    pages = host.num_pages()
    width = int(pages.max()) if len(pages) else 0
    column = np.arange(width)
    inside = column < pages[:, None]
    position = np.where(inside, host.indptr[:-1, None] + column, 0)
    return np.where(inside, host.indices[position], -1)


def walk_group(tables: np.ndarray, limit: np.ndarray, rows: np.ndarray, depth: int,
               found: list[Candidate]) -> None:
    """Trie walk below a node whose ``rows`` (>= 2) agree on their first
    ``depth`` pages and may all span at least ``depth``: record the node's
    longest span for this member set, then split at the next position."""
    reach = int(limit[rows].min())
    columns = tables[rows, depth:reach]
    agree = (columns == columns[0]).all(axis=0)
    span = depth + int(np.argmin(agree)) if not agree.all() else reach
    found.append(Candidate(span, tuple(int(r) for r in rows)))
    deeper = rows[limit[rows] > span]
    if len(deeper) < 2:
        return
    for page in np.unique(tables[deeper, span]):
        branch = deeper[tables[deeper, span] == page]
        if len(branch) >= 2:
            walk_group(tables, limit, branch, span + 1, found)


def find_candidates(host: HostCsr) -> tuple[list[Candidate], tuple[int, ...]]:
    """Every (span, member set) node of every first-page group, and the rows
    dropped for entering mid-page while sharing their first page."""
    pages = host.num_pages()
    has_pages = pages > 0
    first = np.full(len(pages), -1, np.int64)
    first[has_pages] = host.indices[host.indptr[:-1][has_pages]]
    values, counts = np.unique(first[has_pages], return_counts=True)
    shares_first = has_pages & np.isin(first, values[counts > 1])
    mid_page = has_pages & (host.first_page_offset != 0)
    dropped = tuple(int(r) for r in np.flatnonzero(mid_page & shares_first))

    limit = pages - 1                        # a member keeps its last page private
    eligible = np.flatnonzero(has_pages & ~mid_page & (limit >= 1))
    group_firsts, group_sizes = np.unique(first[eligible], return_counts=True)
    found: list[Candidate] = []
    if not (group_sizes >= 2).any():         # the common no-sharing case stops here
        return found, dropped
    tables = padded_tables(host)
    for page in group_firsts[group_sizes >= 2]:
        walk_group(tables, limit, eligible[first[eligible] == page], 1, found)
    return found, dropped


def decide(host: HostCsr, min_shared_pages: int, min_members: int) -> CascadeDecision:
    """The best subgroup passing both thresholds, or the rule that declined."""
    candidates, dropped = find_candidates(host)
    note = f"; rows entering mid-page dropped: {', '.join(map(str, dropped))}" if dropped else ""
    passing = [c for c in candidates if c.span >= min_shared_pages and len(c.rows) >= min_members]
    if passing:
        best = max(passing, key=lambda c: (c.saved_reads, c.span, -c.rows[0]))
        plan = CascadePlan(list(best.rows), best.span)
        tokens = best.span * host.block_size
        return CascadeDecision(plan, f"{len(best.rows)} rows share {best.span} pages ({tokens} tokens){note}", dropped)
    if not candidates:
        return CascadeDecision(None, f"no two rows share a first page{note}", dropped)
    enough_members = [c for c in candidates if len(c.rows) >= min_members]
    if enough_members:
        span = max(c.span for c in enough_members)
        return CascadeDecision(None, f"best subgroup shares {span} pages < min_shared_pages {min_shared_pages}{note}",
                               dropped)
    most = max(len(c.rows) for c in candidates)
    return CascadeDecision(None, f"{most} members < min_members {min_members}{note}", dropped)


def explain_cascade(csr: PagedCsrView, config: PlannerSettings) -> CascadeDecision:
    """The decision for this view (a decode step plans once, before its first layer)."""
    return decide(csr.host, config.min_shared_pages, config.min_members)


def plan_cascade(csr: PagedCsrView, config: PlannerSettings) -> CascadePlan | None:
    """The cascade plan for this step, or None. Does not look at ``enabled``:
    the decode path only calls the planner when cascade is on."""
    return explain_cascade(csr, config).plan
