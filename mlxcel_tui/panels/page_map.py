"""Page-sharing map: every live sequence as a row of its KV pages.

A cell is one page (or, fitted to the width, a stated number of pages: then it
shows its first page). Its colour is the page's refcount bucket, or, on a
member's pages inside a span of the last cascade plan, the span's depth
(magenta outermost, then cyan, violet, white), every group of the step; its
glyph shows how full it is (a partial last page is a partial block) and ▐ marks
a first page entered mid-page. Rows are ordered by sharing group so shared
columns line up.
"""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Static

from ..frame import Frame, sharing_groups

# (highest refcount in the bucket or None, legend label, colour)
REFCOUNT_BUCKETS = ((1, "1 ref (private)", "#8a8a8a"), (3, "2–3", "#5f87d7"), (7, "4–7", "#00af87"),
                    (15, "8–15", "#d7af00"), (None, "16+ refs", "#d75f00"))
PLAN_COLOUR = "#d700d7"
# A span's colour by its depth in the plan: the outermost is PLAN_COLOUR.
SPAN_COLOURS = (PLAN_COLOUR, "#00d7ff", "#af87ff", "#ffffff")
EIGHTHS = "▏▎▍▌▋▊▉█"
MID_PAGE = "▐"
COLUMNS = ("sequence", "group", "tokens", "pages", "pages →")
FIXED_COLUMNS = 4
MIN_FIT_CELLS = 16


def refcount_colour(refcount: int) -> str:
    return next(colour for top, _, colour in REFCOUNT_BUCKETS if top is None or refcount <= top)


def fill_glyph(fill: float) -> str:
    """A left-aligned block as wide as the filled fraction, in eighths rounded
    up; only a full cell gets the full block."""
    return EIGHTHS[-1] if fill >= 1 else EIGHTHS[min(7, max(1, math.ceil(fill * 8))) - 1]


def span_colour(depth: int) -> str:
    return SPAN_COLOURS[min(depth, len(SPAN_COLOURS) - 1)]


def plan_spans(plan: dict | None) -> list[dict]:
    """The plan's spans (start, end, depth, members); a plan without them is
    its one span from page 0."""
    if not plan:
        return []
    return list(plan.get("spans") or ()) or [
        {"start": 0, "end": plan["shared_pages"], "depth": 0, "members": plan["members"]}]


def row_cells(seq: dict, spans: list[dict], scale: int, block_size: int) -> Text:
    """The row's cells; ``spans``: the plan's spans this sequence is a member of."""
    pages, refcounts = seq["pages"], seq["refcounts"]
    n = len(pages)
    runs: list[tuple[str, str]] = []
    for start in range(0, n, scale):
        stop = min(start + scale, n)
        tokens = (stop - start) * block_size
        if stop == n:
            tokens -= block_size - seq["last_page_len"]
        if start == 0:
            tokens -= seq["first_page_offset"]
        span = next((sp for sp in spans if sp["start"] <= start < sp["end"]), None)
        colour = span_colour(span["depth"]) if span else refcount_colour(refcounts[start])
        glyph = MID_PAGE if start == 0 and seq["first_page_offset"] else fill_glyph(tokens / (scale * block_size))
        if runs and runs[-1][1] == colour:
            runs[-1] = (runs[-1][0] + glyph, colour)
        else:
            runs.append((glyph, colour))
    return Text.assemble(*runs, no_wrap=True)


def legend(scale: int, block_size: int, depth: int = 1) -> Text:
    """``depth``: the last plan's span levels (beyond one, each gets its colour)."""
    parts: list = []
    for _, label, colour in REFCOUNT_BUCKETS:
        parts += [("█", colour), f" {label}  "]
    if depth > 1:
        parts.append("spans of the last plan (◆ members), by depth:")
        for d in range(depth):
            parts += [" ", ("█", span_colour(d)), f" {d}"]
        parts.append("  ")
    else:
        parts += [("█", PLAN_COLOUR), " level-0 span of the last plan (◆ members)  "]
    parts += [
              ("▌", "bold"), " partial page  ", (MID_PAGE, "bold"), " first page entered mid-page\n"]
    unit = "1 page" if scale == 1 else f"{scale} pages (its first page's colour)"
    parts.append(f"1 cell = {unit}, {block_size} tokens/page · z: {'1 page per cell' if scale > 1 else 'fit width'}")
    return Text.assemble(*parts)


class PageMap(Vertical):
    frame: reactive[Frame | None] = reactive(None)
    fit: reactive[bool] = reactive(False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "page-sharing map"
        self._keys: list[str] = []
        self._rows: dict[str, list] = {}
        self._layout: tuple[int, int] = (0, 0)  # (scale, widest map cell) of the table as built

    def compose(self) -> ComposeResult:
        yield Static(id="map-legend")
        # No cursor: a highlighted row would hide its page colours; arrows and PgUp/PgDn scroll.
        table = DataTable(id="map-table", cursor_type="none")
        table.fixed_columns = FIXED_COLUMNS
        yield table

    def watch_frame(self) -> None:
        self.update_table()

    def watch_fit(self) -> None:
        self.update_table()

    def on_resize(self) -> None:
        if self.fit:
            self.update_table()

    def scale(self, widest: int) -> int:
        if not self.fit or not widest:
            return 1
        table = self.query_one(DataTable)
        fixed = sum(col.get_render_width(table) for col in list(table.columns.values())[:FIXED_COLUMNS])
        room = max(MIN_FIT_CELLS, table.scrollable_content_region.width - fixed - 3)
        return math.ceil(widest / room)

    def rows(self, frame: Frame, scale: int) -> list[tuple[str, list]]:
        snap = frame.snapshot
        sequences = snap["sequences"]
        block_size = snap["pool"]["block_size"]
        spans = plan_spans(snap["plan"])
        groups = sharing_groups(sequences)
        group_of = {sid: (i, g.name) for i, g in enumerate(groups) for sid in g.members}
        ordered = sorted(sequences, key=lambda s: (group_of.get(s["id"], (len(groups),))[0], s["id"]))
        out = []
        for seq in ordered:
            own = [sp for sp in spans if seq["id"] in sp["members"]]
            group = group_of.get(seq["id"], (0, "—"))[1] + (" ◆" if own else "")
            out.append((str(seq["id"]), [
                f"#{seq['id']} {seq['label']}", group,
                Text(str(seq["num_tokens"]), justify="right"), Text(str(len(seq["pages"])), justify="right"),
                row_cells(seq, own, scale, block_size),
            ]))
        return out

    def update_table(self) -> None:
        frame = self.frame
        if frame is None or not self.is_mounted:
            return
        sequences = frame.snapshot["sequences"]
        widest = max((len(s["pages"]) for s in sequences), default=0)
        scale = self.scale(widest)
        block_size = frame.snapshot["pool"]["block_size"]
        depth = 1 + max((sp["depth"] for sp in plan_spans(frame.snapshot["plan"])), default=0)
        self.query_one("#map-legend", Static).update(legend(scale, block_size, depth))
        rows = self.rows(frame, scale)
        keys = [key for key, _ in rows]
        table = self.query_one(DataTable)
        width = math.ceil(widest / scale)
        if keys != self._keys or scale != self._layout[0] or width < self._layout[1]:
            self.rebuild(table, rows)
        else:
            for key, cells in rows:
                for column, (old, new) in enumerate(zip(self._rows[key], cells)):
                    if old != new:
                        table.update_cell(key, str(column), new, update_width=True)
        self._keys, self._rows, self._layout = keys, dict(rows), (scale, width)
        self.border_subtitle = f"{len(rows)} sequences" if rows else "no live sequences (a adds a session)"

    def rebuild(self, table: DataTable, rows: list[tuple[str, list]]) -> None:
        """Rebuild from scratch: rows came or went, or cells must shrink."""
        table.clear(columns=True)
        for i, label in enumerate(COLUMNS):
            table.add_column(label, key=str(i))
        for key, cells in rows:
            table.add_row(*cells, key=key)
