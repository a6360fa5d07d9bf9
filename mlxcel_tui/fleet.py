"""The fleet view (`mlxcel-tui attach URL [URL ...]`): one row per server
(model, tokens/s, cascade state and share of launches, pool use and page format), each
polled in its own worker; Enter opens that server's dashboard, Esc comes back."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static

from .app import DashboardScreen, describe
from .frame import launches
from .help import HelpScreen
from .panels import format as fmt
from .source import DataSource

COLUMNS = ("server", "model", "tokens/s", "cascade", "cascade share", "KV pool", "sequences", "state")


@dataclass(frozen=True)
class ServerRow:
    """What the fleet shows of one server after a poll."""

    name: str
    snapshot: dict | None = None
    metrics: dict | None = None
    error: str | None = None

    def cells(self) -> list:
        if self.snapshot is None:
            return [self.name, "—", "—", "—", "—", "—", "—", Text(self.error or "connecting …", style=fmt.BAD
                                                               if self.error else fmt.MUTED)]
        snap, metrics = self.snapshot, self.metrics or {}
        pool = snap["pool"]
        enabled = snap["cascade"]["enabled"]
        fused, cascade = launches(metrics, "fused_v2"), launches(metrics, "cascade")
        state = Text("paused", style=fmt.WARN) if snap["paused"] else Text("running", style=fmt.OK)
        return [self.name, snap["model"], Text(f"{snap['tokens_per_second']:,.1f}", justify="right"),
                Text("ON", style="bold " + fmt.CASCADE_ON) if enabled else Text("OFF", style=fmt.CASCADE_OFF),
                Text(fmt.percent(cascade, fused) + " of launches", justify="right"),
                Text(f"{pool['live']}/{pool['num_blocks']} ({fmt.percent(pool['live'], pool['num_blocks'])})"
                     + (f" {pool['kv_dtype']}" if pool.get("kv_dtype") else ""), justify="right"),
                Text(f"{len(snap['sequences'])} live · {snap['waiting']} waiting", justify="right"), state]


class FleetScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open", tooltip="Open the selected server's dashboard (Esc there comes back)"),
        Binding("down,j", "cursor(1)", "Down", show=False, tooltip="Select the next server"),
        Binding("up,k", "cursor(-1)", "Up", show=False, tooltip="Select the previous server"),
        Binding("r", "poll", "Refresh", tooltip="Poll every server now"),
        Binding("question_mark,f1", "help", "Help", tooltip="Show this help (any key closes it)"),
        Binding("q", "app.quit", "Quit", tooltip="Quit"),
    ]

    def __init__(self, sources: list[DataSource], names: list[str], refresh: float = 1.0) -> None:
        super().__init__()
        self.sources = sources
        self.names = names
        self.refresh_seconds = refresh
        self.rows = [ServerRow(name) for name in names]
        self._timer: Timer | None = None
        self._polling: set[int] = set()

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("mlxcel-tui fleet ", "bold"), f"{len(self.sources)} servers · "
                                   "Enter opens one's dashboard"), id="fleet-title")
        table = DataTable(id="fleet-table", cursor_type="row")
        for label in COLUMNS:
            table.add_column(label, key=label)
        for i, row in enumerate(self.rows):
            table.add_row(*row.cells(), key=str(i))
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.refresh_seconds, self.action_poll)
        self.query_one(DataTable).focus()
        self.action_poll()

    def action_poll(self) -> None:
        for i in range(len(self.sources)):
            if i not in self._polling:  # a slow server is not asked again while it answers
                self._polling.add(i)
                self.poll_server(i)

    @work(thread=True, group="fleet", exit_on_error=False)
    def poll_server(self, i: int) -> None:
        source = self.sources[i]
        try:
            row = ServerRow(self.names[i], source.snapshot(), source.metrics())
        except Exception as err:  # a server that does not answer is a row saying why
            row = ServerRow(self.names[i], error=describe(err))
        self.app.call_from_thread(self.show, i, row)

    def show(self, i: int, row: ServerRow) -> None:
        self._polling.discard(i)
        self.rows[i] = row
        table = self.query_one(DataTable)
        for label, cell in zip(COLUMNS, row.cells()):
            table.update_cell(str(i), label, cell, update_width=True)

    def action_cursor(self, delta: int) -> None:
        table = self.query_one(DataTable)
        table.move_cursor(row=max(0, table.cursor_row + delta))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        i = self.query_one(DataTable).cursor_row
        self.app.push_screen(DashboardScreen(self.sources[i], self.names[i], self.refresh_seconds, back=True))

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen("fleet keys", self.BINDINGS, "One row per server, polled every "
                                        f"{self.refresh_seconds:g} s; a server that does not answer says why."))


class FleetApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mlxcel-tui fleet"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, sources: list[DataSource], names: list[str], refresh: float = 1.0) -> None:
        super().__init__()
        self.fleet = FleetScreen(sources, names, refresh)

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self.push_screen(self.fleet)
