"""The dashboard: a screen that polls a DataSource in a worker thread, turns
each poll into a Frame and hands it to the panels; keys change the engine
only through the source's control calls, also off the UI thread.

The layout follows the terminal (as btop and k9s do): from WIDE columns the
page map has the cascade panels beside it; below, they stack under it, two
abreast from MEDIUM columns; the per-step latency panel shows from TALL rows
and the history plots from PLOTS rows. The controls are prompts over the
screen, so they work whatever is shown, and the footer is always there."""

from __future__ import annotations

from typing import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer

from .answers import AnswersScreen
from .frame import Frame, History, HostInfo, HostProbe, RateMeter, StallWatch
from .help import HelpScreen
from .panels.header import HeaderPanel
from .panels.history import HistoryPanel
from .panels.latency import LatencyPanel
from .panels.launch_paths import LaunchPathsPanel
from .panels.page_map import SORTS, PageMap
from .panels.savings import SavingsPanel
from .panels.status import StatusLine
from .panels.subgroups import SubgroupsPanel
from .prompt import PromptScreen
from .recording import Recorder
from .sequence_screen import SequenceScreen
from .source import DataSource, EngineSource, SourceError, SourceFailed, SourceNotReady

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)  # refresh steps for + and -
CONTROL_ACTIONS = frozenset({"toggle_cascade", "edit_threshold", "sessions", "toggle_pause"})
THRESHOLDS = {"min_shared_pages": "fewest shared pages a cascade needs (>= 1)",
              "min_members": "fewest sequences a cascade subgroup needs (>= 2)"}
WIDE, MEDIUM = 140, 100  # columns: map beside the panels / panels two abreast under it
TALL, PLOTS = 44, 36     # rows: the latency panel shows / the history plots show
HELP_NOTE = ("A threshold prompt applies its value with Enter: the engine refuses a bad one with a message in the "
             "status line and keeps the old value. The map's row cursor picks the sequence Enter opens; "
             "/ filters the rows by id, label, group or state (empty: all). Panels refresh on every poll.")


class DashboardScreen(Screen):
    BINDINGS = [
        Binding("c", "toggle_cascade", "Cascade", tooltip="Switch cascade attention on or off, live"),
        Binding("m", "edit_threshold('min_shared_pages')", "Pages",
                tooltip="Set min_shared_pages (a prompt: Enter applies, Esc leaves)"),
        Binding("n", "edit_threshold('min_members')", "Members",
                tooltip="Set min_members (a prompt: Enter applies, Esc leaves)"),
        Binding("a", "sessions(1)", "+Session", show=False, tooltip="Add a built-in client session"),
        Binding("d", "sessions(-1)", "-Session", show=False, tooltip="Remove the newest built-in session"),
        Binding("p", "toggle_pause", "Pause", tooltip="Pause or resume the engine"),
        Binding("down,j", "cursor(1)", "Down", show=False, tooltip="Select the next sequence"),
        Binding("up,k", "cursor(-1)", "Up", show=False, tooltip="Select the previous sequence"),
        Binding("enter", "detail", "Detail", show=False, tooltip="Open the selected sequence's detail"),
        Binding("slash", "filter", "Filter", tooltip="Show only the rows matching a text (empty: all)"),
        Binding("s", "sort", "Sort", tooltip=f"Sort the rows by {', then '.join(SORTS)}"),
        Binding("l", "answers", "Answers", show=False, tooltip="Show each session's latest question and answer"),
        Binding("plus,equals_sign", "refresh_rate(-1)", "Faster", show=False, tooltip="Poll more often"),
        Binding("minus", "refresh_rate(1)", "Slower", show=False, tooltip="Poll less often"),
        Binding("r", "poll('polling now')", "Refresh", tooltip="Poll the source now"),
        Binding("z", "toggle_fit", "Fit map", show=False,
                tooltip="Page map: one page per cell (scroll sideways) or fit the width (N pages per cell)"),
        Binding("t", "toggle_theme", "Theme", show=False, tooltip="Switch between the dark and the light theme"),
        Binding("question_mark,f1", "help", "Help", tooltip="Show this help (any key closes it)"),
        Binding("escape", "back", "Back", show=False, tooltip="Back to the fleet (attach with several URLs)"),
        Binding("q", "app.quit", "Quit", tooltip="Quit (under `serve` the engine stops with the dashboard)"),
    ]

    frame: reactive[Frame | None] = reactive(None)
    interval: reactive[float] = reactive(1.0)
    poll_error: reactive[str | None] = reactive(None)
    preparing: reactive[str | None] = reactive(None)  # what a source that is not ready yet is doing
    message: reactive[tuple[str, str]] = reactive(("", "info"))
    can_control: reactive[bool] = reactive(True)

    def __init__(self, source: DataSource, url: str | None = None, refresh: float = 1.0, *,
                 host: Callable[[dict], HostInfo] | None = None, notice: str | None = None,
                 recorder: Recorder | None = None, back: bool = False) -> None:
        """host is injectable so tests get fixed host figures; by default, for
        an in-process engine, psutil and MLX, else what the snapshot carries.
        A notice starts in the message line; every poll goes to the recorder;
        back: Esc pops this screen (a fleet's drill-down)."""
        super().__init__()
        self.source = source
        self.url = url
        self.host = host or HostProbe(in_process=isinstance(source, EngineSource))
        self.recorder = recorder
        self.back = back
        self.set_reactive(DashboardScreen.interval, self.validate_interval(refresh))
        self.set_reactive(DashboardScreen.can_control, source.can_control)
        if notice:
            self.set_reactive(DashboardScreen.message, (notice, "error"))
        self._rates = RateMeter()
        self._stall = StallWatch()
        self._history = History()
        self._polls = 0
        self._polling = False
        self._poll_again = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield HeaderPanel(id="header").data_bind(DashboardScreen.frame, DashboardScreen.preparing)
        with Vertical(id="body"):
            with Horizontal(id="main"):
                yield PageMap(id="page-map").data_bind(DashboardScreen.frame, DashboardScreen.preparing)
                with Vertical(id="side"):
                    yield SubgroupsPanel(id="subgroups").data_bind(DashboardScreen.frame)
                    yield SavingsPanel(id="savings").data_bind(DashboardScreen.frame)
                    yield LaunchPathsPanel(id="launch-paths").data_bind(DashboardScreen.frame)
            yield LatencyPanel(id="latency").data_bind(DashboardScreen.frame)
            yield HistoryPanel(id="history").data_bind(DashboardScreen.frame)
        yield StatusLine(id="status").data_bind(DashboardScreen.frame, DashboardScreen.interval,
                                                DashboardScreen.poll_error, DashboardScreen.message,
                                                DashboardScreen.preparing)
        yield Footer()

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.interval, self.tick)
        self.query_one("#map-table", DataTable).focus()
        self.action_poll()

    def on_resize(self) -> None:
        """The layout classes for this terminal size (app.tcss lays each out)."""
        width, height = self.size
        self.set_class(width >= WIDE, "-wide")
        self.set_class(MEDIUM <= width < WIDE, "-medium")
        self.set_class(width < MEDIUM, "-narrow")
        self.set_class(height >= TALL, "-tall")
        self.set_class(height >= PLOTS, "-plots")
        self.query_one(Footer).compact = width < WIDE

    # -- polling --------------------------------------------------------------

    def validate_interval(self, interval: float) -> float:
        if not interval > 0:
            raise ValueError(f"refresh must be a positive number of seconds, got {interval!r}")
        return float(interval)

    def watch_interval(self, interval: float) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = self.set_interval(interval, self.tick)

    def tick(self) -> None:
        """The refresh timer: a slow source is not polled again while it answers."""
        if not self._polling:
            self.action_poll()

    def action_poll(self, said: str | None = None) -> None:
        """Start a poll, unless one is in flight (then poll again right after it)."""
        if said:
            self.say(said)
        if self._polling:
            self._poll_again = True
            return
        self._polling = True
        self.poll_source()

    @work(thread=True, group="poll", exit_on_error=False)
    def poll_source(self) -> None:
        try:
            snapshot = self.source.snapshot()
            metrics = self.source.metrics()
            host = self.host(snapshot)
            if self.recorder is not None:
                self.recorder.write(snapshot, metrics)
        except SourceNotReady as err:
            self.app.call_from_thread(self.poll_not_ready, str(err))
            return
        except SourceFailed:
            self.app.call_from_thread(self.app.exit)
            return
        except Exception as err:  # any failure is a status line, never a traceback
            self.app.call_from_thread(self.poll_failed, describe(err))
            return
        self.app.call_from_thread(self.poll_done, snapshot, metrics, host)

    def poll_done(self, snapshot: dict, metrics: dict[str, float], host: HostInfo) -> None:
        self._polls += 1
        stalled = self._stall.observe(snapshot["cascade"]["enabled"], metrics)
        # Rates and history run on the engine's clock (a replay's too), not this process's.
        rates = self._rates.update(snapshot["timestamp"], metrics)
        self.frame = Frame(snapshot, metrics, rates, host, stalled, self.source.description, self.url,
                           self.source.can_control, self._polls, self._history.update(snapshot))
        self.can_control = self.source.can_control
        self.poll_error = self.preparing = None
        if self.message[0] == "polling now":
            self.say(f"polled: step {snapshot['step']}")
        self.poll_finished()

    def poll_not_ready(self, what: str) -> None:
        self.preparing = what
        self.poll_finished()

    def poll_failed(self, error: str) -> None:
        self.poll_error = error
        self.poll_finished()

    def poll_finished(self) -> None:
        self._polling = False
        if self._poll_again:
            self._poll_again = False
            self.action_poll()

    # -- controls -------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS and not self.can_control:
            return None  # shown greyed out in the footer
        if action == "back" and not self.back:
            return None
        return True

    def watch_can_control(self) -> None:
        self.refresh_bindings()

    def say(self, text: str, severity: str = "info") -> None:
        self.message = (text, severity)

    @work(thread=True, group="control", exit_on_error=False)
    def control(self, call: Callable[[], object], done: str) -> None:
        """Run one control call off the UI thread; report, then re-poll."""
        try:
            call()
        except Exception as err:
            self.app.call_from_thread(self.control_refused, describe(err))
        else:
            self.app.call_from_thread(self.control_done, done)

    def control_done(self, done: str) -> None:
        self.say(done)
        self.action_poll()

    def control_refused(self, error: str) -> None:
        self.say(f"refused: {error}", "error")
        self.action_poll()

    def action_toggle_cascade(self) -> None:
        if self.frame is None:
            return
        enabled = not self.frame.snapshot["cascade"]["enabled"]
        self.control(lambda: self.source.set_cascade(enabled=enabled), f"cascade {'on' if enabled else 'off'}")

    def action_edit_threshold(self, name: str) -> None:
        if self.frame is None:
            return
        old = self.frame.snapshot["cascade"][name]
        self.app.push_screen(PromptScreen(f"{name}: {THRESHOLDS[name]}", str(old)),
                             lambda text: self.apply_threshold(name, old, text))

    def apply_threshold(self, name: str, old: int, text: str | None) -> None:
        if text is None:
            return
        try:
            value = int(text)
        except ValueError:
            self.control_refused(f"{name} must be an integer, got {text!r}; kept {old}")
            return
        self.control(lambda: self.source.set_cascade(**{name: value}), f"{name} = {value}")

    def action_sessions(self, delta: int) -> None:
        add, remove = max(delta, 0), max(-delta, 0)
        self.control(lambda: self.source.change_sessions(add=add, remove=remove),
                     "added a session (a waiting row until admitted)" if add else "removed a session")

    def action_toggle_pause(self) -> None:
        if self.frame is None:
            return
        paused = not self.frame.snapshot["paused"]
        self.control(lambda: self.source.set_paused(paused), "engine paused" if paused else "engine resumed")

    # -- view -------------------------------------------------------------------

    @property
    def page_map(self) -> PageMap:
        return self.query_one(PageMap)

    def action_cursor(self, delta: int) -> None:
        table = self.query_one("#map-table", DataTable)
        table.move_cursor(row=max(0, table.cursor_row + delta))

    def action_detail(self) -> None:
        seq_id = self.page_map.selected
        if seq_id is not None:
            self.app.push_screen(SequenceScreen(self, seq_id))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_detail()

    def action_filter(self) -> None:
        self.app.push_screen(PromptScreen("filter the rows (id, label, group or state; empty shows all)",
                                          self.page_map.filter), self.set_filter)

    def set_filter(self, text: str | None) -> None:
        if text is not None:
            self.page_map.filter = text
            self.say(f"showing rows matching /{text}" if text else "showing every row")

    def action_sort(self) -> None:
        page_map = self.page_map
        page_map.sort = SORTS[(SORTS.index(page_map.sort) + 1) % len(SORTS)]
        self.say(f"rows sorted by {page_map.sort}")

    def action_refresh_rate(self, direction: int) -> None:
        if direction < 0:
            self.interval = max((i for i in INTERVALS if i < self.interval), default=INTERVALS[0])
        else:
            self.interval = min((i for i in INTERVALS if i > self.interval), default=INTERVALS[-1])
        self.say(f"refreshing every {self.interval:g} s")

    def action_toggle_fit(self) -> None:
        self.page_map.fit = not self.page_map.fit

    def action_toggle_theme(self) -> None:
        self.app.theme = "textual-light" if self.app.theme == "textual-dark" else "textual-dark"

    @work(thread=True, group="control", exit_on_error=False)
    def action_answers(self) -> None:
        """Read the sessions off the UI thread, then show them."""
        try:
            sessions = self.source.session_answers()
        except Exception as err:
            self.app.call_from_thread(self.say, f"no answers: {describe(err)}", "error")
        else:
            self.app.call_from_thread(self.app.push_screen, AnswersScreen(sessions))

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen("keys", self.BINDINGS, HELP_NOTE))

    def action_back(self) -> None:
        if self.back:
            self.dismiss()

    def on_unmount(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


class DashboardApp(App):
    """One source's dashboard (`serve`, `attach URL`, `replay FILE`)."""

    CSS_PATH = "app.tcss"
    TITLE = "mlxcel-tui"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, source: DataSource, url: str | None = None, refresh: float = 1.0, **kwargs) -> None:
        super().__init__()
        self.dashboard = DashboardScreen(source, url, refresh, **kwargs)

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self.push_screen(self.dashboard)


def describe(err: Exception) -> str:
    return str(err) if isinstance(err, SourceError) else f"{type(err).__name__}: {err}"
