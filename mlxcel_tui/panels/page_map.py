"""Page-sharing map: every live sequence as a row of its KV pages (queued
ones below them, with no pages yet).

A cell is one page (or, fitted to the width, a stated number of pages: then it
shows its first page). Its colour is the page's refcount bucket, or, on a
member's pages inside a span of the last cascade plan, the span's depth
(magenta outermost, then cyan, violet, white), every group of the step; its
glyph shows how full it is (a partial last page is a partial block) and ▐ marks
a first page entered mid-page. Rows are ordered by sharing group so shared
columns line up (s picks another order) and / filters them.
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
COLUMNS = ("sequence", "group", "state", "tokens", "pages", "pages →")
FIXED_COLUMNS = 5
MIN_FIT_CELLS = 16
COMPACT_LEGEND = 130  # columns below which the legend is one line
SORTS = ("group", "id", "tokens", "tok/s")  # s cycles through them; group lines shared columns up


def state_cell(seq: dict) -> Text:
    """What a row is doing: waiting, its prefill progress, or its decode rate."""
    if seq["status"] == "waiting":
        return Text("waiting", style="italic")
    if seq["status"] == "prefilling":
        done, total = min(seq["num_cached_tokens"], seq["num_prompt_tokens"]), seq["num_prompt_tokens"]
        return Text(f"prefill {100 * done // max(total, 1)}%", style="bold #d78700")
    rate = seq.get("tokens_per_second")
    return Text("decoding" if rate is None else f"{rate:,.1f} tok/s", justify="right")


def matches(seq: dict, group: str, needle: str) -> bool:
    """The / filter: a case-blind substring of the row's id, label, group or status."""
    hay = f"#{seq['id']} {seq['label']} {group} {seq['status']}".lower()
    return needle.lower() in hay


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


def legend(scale: int, block_size: int, compact: bool = False, depth: int = 1) -> Text:
    """``depth``: the last plan's span levels (beyond one, each gets its colour)."""
    if compact:  # one line: the colours only
        parts: list = []
        for _, label, colour in REFCOUNT_BUCKETS:
            parts += [("█", colour), f"{label.split(' (')[0]} "]
        parts += [("█", PLAN_COLOUR), "plan "] if depth == 1 else (
            ["spans "] + [p for d in range(depth) for p in (("█", span_colour(d)), f"{d} ")])
        parts += [("▌", "bold"), "partial ", (MID_PAGE, "bold"), "mid-page · "]
        parts.append(f"cell = {scale} page{'s' * (scale > 1)} · z fits")
        return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")
    parts = []
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
    """The map as a table of rows, one per live or queued sequence, with a
    row cursor (arrows, j/k) the detail screen opens on, a / filter and a
    sort order."""

    frame: reactive[Frame | None] = reactive(None)
    preparing: reactive[str | None] = reactive(None)
    fit: reactive[bool] = reactive(False)
    filter: reactive[str] = reactive("")
    sort: reactive[str] = reactive(SORTS[0])

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "page-sharing map"
        self._keys: list[str] = []
        self._rows: dict[str, list] = {}
        self._layout: tuple[int, int] = (0, 0)  # (scale, widest map cell) of the table as built

    def compose(self) -> ComposeResult:
        yield Static(id="map-legend")
        # The row cursor only shades the row: the page cells keep their colours.
        table = DataTable(id="map-table", cursor_type="row", cursor_foreground_priority="renderable")
        table.fixed_columns = FIXED_COLUMNS
        yield table

    def watch_frame(self) -> None:
        self.update_table()

    def watch_preparing(self) -> None:
        self.update_table()

    def watch_fit(self) -> None:
        self.update_table()

    def watch_filter(self) -> None:
        self.update_table()

    def watch_sort(self) -> None:
        self.update_table()

    def on_resize(self) -> None:
        if self.fit:
            self.update_table()

    @property
    def selected(self) -> int | None:
        """The sequence id under the row cursor."""
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        return int(key) if key is not None else None

    def scale(self, widest: int) -> int:
        if not self.fit or not widest:
            return 1
        table = self.query_one(DataTable)
        fixed = sum(col.get_render_width(table) for col in list(table.columns.values())[:FIXED_COLUMNS])
        room = max(MIN_FIT_CELLS, table.scrollable_content_region.width - fixed - 3)
        return math.ceil(widest / room)

    def ordered(self, sequences: list[dict], group_of: dict[int, tuple[int, str]], last: int) -> list[dict]:
        if self.sort == "id":
            return sorted(sequences, key=lambda s: s["id"])
        if self.sort == "tokens":
            return sorted(sequences, key=lambda s: (-s["num_tokens"], s["id"]))
        if self.sort == "tok/s":
            return sorted(sequences, key=lambda s: (-(s.get("tokens_per_second") or 0.0), s["id"]))
        return sorted(sequences, key=lambda s: (group_of.get(s["id"], (last,))[0], s["id"]))

    def rows(self, frame: Frame, scale: int) -> list[tuple[str, list]]:
        snap = frame.snapshot
        sequences = snap["sequences"]
        block_size = snap["pool"]["block_size"]
        spans = plan_spans(snap["plan"])
        groups = sharing_groups(sequences)
        group_of = {sid: (i, g.name) for i, g in enumerate(groups) for sid in g.members}
        out = []
        for seq in self.ordered(sequences, group_of, len(groups)) + list(snap.get("queued", ())):
            own = [sp for sp in spans if seq["id"] in sp["members"]]
            group = group_of.get(seq["id"], (0, "—"))[1] + (" ◆" if own else "")
            if self.filter and not matches(seq, group, self.filter):
                continue
            out.append((str(seq["id"]), [
                f"#{seq['id']} {seq['label']}", group, state_cell(seq),
                Text(str(seq["num_tokens"]), justify="right"), Text(str(len(seq["pages"])), justify="right"),
                row_cells(seq, own, scale, block_size),
            ]))
        return out

    def update_table(self) -> None:
        frame = self.frame
        if not self.is_mounted:
            return
        if frame is None:
            self.query_one("#map-legend", Static).update(
                Text(f"◌ {self.preparing or 'waiting for the first snapshot'} …", style="bold #d78700"))
            self.border_subtitle = "loading"
            return
        sequences = frame.snapshot["sequences"]
        widest = max((len(s["pages"]) for s in sequences), default=0)
        scale = self.scale(widest)
        block_size = frame.snapshot["pool"]["block_size"]
        depth = 1 + max((sp["depth"] for sp in plan_spans(frame.snapshot["plan"])), default=0)
        self.query_one("#map-legend", Static).update(legend(scale, block_size, self.size.width < COMPACT_LEGEND,
                                                            depth))
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
        shown = f"{len(rows)} sequences" if rows else "no sequences (a adds a session)"
        if self.filter:
            shown += f" matching /{self.filter}"
        self.border_subtitle = f"{shown} · sort: {self.sort} (s)"

    def rebuild(self, table: DataTable, rows: list[tuple[str, list]]) -> None:
        """Rebuild from scratch: rows came or went, or cells must shrink. The
        cursor stays on the sequence it was on while that one is shown."""
        selected = self.selected if table.row_count else None
        table.clear(columns=True)
        for i, label in enumerate(COLUMNS):
            table.add_column(label, key=str(i))
        for key, cells in rows:
            table.add_row(*cells, key=key)
        keys = [key for key, _ in rows]
        if selected is not None and str(selected) in keys:
            table.move_cursor(row=keys.index(str(selected)), animate=False)
