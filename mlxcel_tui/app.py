"""The dashboard: polls a DataSource in a worker thread, turns each poll into
a Frame and hands it to the panels; keys and inputs change the engine only
through the source's control calls, also off the UI thread."""

from __future__ import annotations

import time
from typing import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input

from .frame import Frame, HostInfo, HostProbe, RateMeter, StallWatch
from .answers import AnswersScreen
from .help import HelpScreen
from .panels.controls import THRESHOLDS, ControlsPanel
from .panels.header import HeaderPanel
from .panels.latency import LatencyPanel
from .panels.launch_paths import LaunchPathsPanel
from .panels.page_map import PageMap
from .panels.status import StatusLine
from .panels.subgroups import SubgroupsPanel
from .source import DataSource, EngineSource, SourceError, SourceFailed, SourceNotReady

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)  # refresh steps for + and -
CONTROL_ACTIONS = frozenset({"toggle_cascade", "focus_input", "sessions", "toggle_pause"})


class DashboardApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mlxcel-tui"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("c", "toggle_cascade", "Cascade", tooltip="Switch cascade attention on or off, live"),
        Binding("m", "focus_input('min-shared-pages')", "Min pages",
                tooltip="Edit min_shared_pages (Enter applies, Esc leaves)"),
        Binding("n", "focus_input('min-members')", "Min members",
                tooltip="Edit min_members (Enter applies, Esc leaves)"),
        Binding("a", "sessions(1)", "+Session", tooltip="Add a built-in client session"),
        Binding("d", "sessions(-1)", "-Session", tooltip="Remove the newest built-in session"),
        Binding("p", "toggle_pause", "Pause", tooltip="Pause or resume the engine"),
        Binding("s", "answers", "Answers", tooltip="Show each session's latest question and answer"),
        Binding("plus,equals_sign", "refresh_rate(-1)", "Faster", tooltip="Poll more often"),
        Binding("minus", "refresh_rate(1)", "Slower", tooltip="Poll less often"),
        Binding("r", "poll", "Refresh", tooltip="Poll the source now"),
        Binding("z", "toggle_fit", "Fit map",
                tooltip="Page map: one page per cell (scroll sideways) or fit the width (N pages per cell)"),
        Binding("t", "toggle_theme", "Theme", tooltip="Switch between the dark and the light theme"),
        Binding("question_mark,f1", "help", "Help", tooltip="Show this help (any key closes it)"),
        Binding("escape", "back", "Back", show=False, tooltip="Leave an input: keys act on the dashboard again"),
        Binding("q", "quit", "Quit", tooltip="Quit (under `serve` the engine stops with the dashboard)"),
    ]

    frame: reactive[Frame | None] = reactive(None)
    interval: reactive[float] = reactive(1.0)
    poll_error: reactive[str | None] = reactive(None)
    preparing: reactive[str | None] = reactive(None)  # what a source that is not ready yet is doing
    message: reactive[tuple[str, str]] = reactive(("", "info"))
    can_control: reactive[bool] = reactive(True)

    def __init__(self, source: DataSource, url: str | None = None, refresh: float = 1.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 host: Callable[[dict], HostInfo] | None = None, notice: str | None = None) -> None:
        """clock and host are injectable so tests get deterministic rates and
        host figures; by default they read the monotonic clock and, for an
        in-process engine, psutil and MLX. A notice starts in the message line."""
        super().__init__()
        self.source = source
        self.url = url
        self.clock = clock
        self.host = host or HostProbe(in_process=isinstance(source, EngineSource))
        self.set_reactive(DashboardApp.interval, self.validate_interval(refresh))
        self.set_reactive(DashboardApp.can_control, source.can_control)
        if notice:
            self.set_reactive(DashboardApp.message, (notice, "error"))
        self._rates = RateMeter()
        self._stall = StallWatch()
        self._polls = 0
        self._polling = False
        self._poll_again = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield HeaderPanel(id="header").data_bind(DashboardApp.frame, DashboardApp.preparing)
        with Horizontal(id="body"):
            yield PageMap(id="page-map").data_bind(DashboardApp.frame)
            with Vertical(id="side"):
                yield SubgroupsPanel(id="subgroups").data_bind(DashboardApp.frame)
                yield LaunchPathsPanel(id="launch-paths").data_bind(DashboardApp.frame)
                yield ControlsPanel(id="controls").data_bind(DashboardApp.frame)
        yield LatencyPanel(id="latency").data_bind(DashboardApp.frame)
        yield StatusLine(id="status").data_bind(DashboardApp.frame, DashboardApp.interval,
                                                DashboardApp.poll_error, DashboardApp.message,
                                                DashboardApp.preparing)
        yield Footer()

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self._timer = self.set_interval(self.interval, self.tick)
        self.query_one("#map-table", DataTable).focus()
        self.action_poll()

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

    def action_poll(self) -> None:
        """Start a poll, unless one is in flight (then poll again right after it)."""
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
        except SourceNotReady as err:
            self.call_from_thread(self.poll_not_ready, str(err))
            return
        except SourceFailed:
            self.call_from_thread(self.exit)
            return
        except Exception as err:  # any failure is a status line, never a traceback
            self.call_from_thread(self.poll_failed, describe(err))
            return
        self.call_from_thread(self.poll_done, snapshot, metrics, host, self.clock())

    def poll_done(self, snapshot: dict, metrics: dict[str, float], host: HostInfo, now: float) -> None:
        self._polls += 1
        stalled = self._stall.observe(snapshot["cascade"]["enabled"], metrics)
        self.frame = Frame(snapshot, metrics, self._rates.update(now, metrics), host, stalled,
                           self.source.description, self.url, self.source.can_control, self._polls)
        self.can_control = self.source.can_control
        self.poll_error = self.preparing = None
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
        return True

    def watch_can_control(self) -> None:
        self.refresh_bindings()

    def say(self, text: str, severity: str = "info") -> None:
        self.message = (text, severity)

    @work(thread=True, group="control", exit_on_error=False)
    def control(self, call: Callable[[], object], done: str) -> None:
        """Run one control call off the UI thread; report, then re-poll."""
        try:
            result = call()
        except Exception as err:
            self.call_from_thread(self.control_refused, describe(err))
        else:
            self.call_from_thread(self.control_done, done, result)

    def control_done(self, done: str, result: object) -> None:
        self.say(done)
        if isinstance(result, dict):  # set_cascade answers with the config in force
            self.query_one(ControlsPanel).show_config(result, force=True)
        self.action_poll()

    def control_refused(self, error: str) -> None:
        self.say(f"refused: {error}", "error")
        if self.frame is not None:  # the old values stay, and the inputs show them again
            self.query_one(ControlsPanel).show_config(self.frame.snapshot["cascade"], force=True)
        self.action_poll()

    def action_toggle_cascade(self) -> None:
        if self.frame is None:
            return
        enabled = not self.frame.snapshot["cascade"]["enabled"]
        self.control(lambda: self.source.set_cascade(enabled=enabled), f"cascade {'on' if enabled else 'off'}")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = THRESHOLDS.get(event.input.id or "")
        if name is None:
            return
        self.query_one("#map-table", DataTable).focus()  # keys act on the dashboard again
        text = event.value.strip()
        try:
            value = int(text)
        except ValueError:
            old = self.frame.snapshot["cascade"][name] if self.frame else None
            self.control_refused(f"{name} must be an integer, got {text!r}; kept {old}")
            return
        self.control(lambda: self.source.set_cascade(**{name: value}), f"{name} = {value}")

    def action_focus_input(self, input_id: str) -> None:
        self.query_one(f"#{input_id}", Input).focus()

    def action_sessions(self, delta: int) -> None:
        add, remove = max(delta, 0), max(-delta, 0)
        self.control(lambda: self.source.change_sessions(add=add, remove=remove),
                     "added a session" if add else "removed a session")

    def action_toggle_pause(self) -> None:
        if self.frame is None:
            return
        paused = not self.frame.snapshot["paused"]
        self.control(lambda: self.source.set_paused(paused), "engine paused" if paused else "engine resumed")

    # -- view -------------------------------------------------------------------

    def action_refresh_rate(self, direction: int) -> None:
        if direction < 0:
            self.interval = max((i for i in INTERVALS if i < self.interval), default=INTERVALS[0])
        else:
            self.interval = min((i for i in INTERVALS if i > self.interval), default=INTERVALS[-1])
        self.say(f"refreshing every {self.interval:g} s")

    def action_toggle_fit(self) -> None:
        page_map = self.query_one(PageMap)
        page_map.fit = not page_map.fit

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    @work(thread=True, group="control", exit_on_error=False)
    def action_answers(self) -> None:
        """Read the sessions off the UI thread, then show them."""
        try:
            sessions = self.source.session_answers()
        except Exception as err:
            self.call_from_thread(self.say, f"no answers: {describe(err)}", "error")
        else:
            self.call_from_thread(self.push_screen, AnswersScreen(sessions))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_back(self) -> None:
        self.query_one("#map-table", DataTable).focus()


async def settle(pilot) -> None:
    """Under App.run_test: wait until no poll or control call is in flight and
    their results are on screen (a control's re-poll included)."""
    for _ in range(20):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if not len(pilot.app.workers):
            return
    raise TimeoutError("the dashboard kept starting workers")


def describe(err: Exception) -> str:
    return str(err) if isinstance(err, SourceError) else f"{type(err).__name__}: {err}"
