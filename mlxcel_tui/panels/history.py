"""History over minutes: tokens/s, decode step time with its host and device
parts, and the share of decode steps that cascaded, plotted against a time
axis (seconds before the newest snapshot). The dashboard keeps the steps
across polls (frame.History); a plot covers the last minute, or up to
HISTORY_SECONDS once there is more."""

from __future__ import annotations

from textual.containers import Horizontal
from textual.reactive import reactive
from textual_plotext import PlotextPlot

from ..frame import HISTORY_SECONDS, Frame
from .latency import scale_top

SPANS = (60, 120, 300, 600, HISTORY_SECONDS)  # seconds a plot reaches back, the shortest that holds the history
BUCKETS = 60


def span_for(age: float) -> int:
    return next((s for s in SPANS if age <= s), SPANS[-1])


def clock(seconds: float) -> str:
    """-75 -> '-1:15'."""
    s = int(round(-seconds))
    return "now" if s == 0 else f"-{s // 60}:{s % 60:02d}"


class HistoryPlot(PlotextPlot):
    """One plot; the panel hands it (x, y, label, colour) series."""

    def show(self, title: str, series: list[tuple[list[float], list[float], str, str]], span: int,
             ylim: tuple[float, float] | None = None) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title if len(series) < 2 else f"{title}: " + " · ".join(f"{c} {label}" for _, _, label, c in series))
        for x, y, _, colour in series:
            if x:  # no plotext legend (it breaks in a short plot): the title names the colours
                plt.plot(x, y, color=colour, marker="braille")
        ticks = [-span, -span / 2, 0]
        plt.xticks(ticks, [clock(t) for t in ticks])
        plt.xlim(-span, 0)
        if ylim:
            plt.ylim(*ylim)
        self.refresh()


class HistoryPanel(Horizontal):
    frame: reactive[Frame | None] = reactive(None)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "history"

    def compose(self):
        yield HistoryPlot(id="plot-tps")
        yield HistoryPlot(id="plot-step")
        yield HistoryPlot(id="plot-share")

    def watch_frame(self, frame: Frame | None) -> None:
        if frame is None or frame.history is None or not self.is_mounted:
            return
        now = frame.snapshot["timestamp"]
        steps = frame.history.steps
        span = span_for(now - steps[0]["timestamp"] if steps else 0)
        width = span / BUCKETS
        buckets = [(b.start + width - now, b) for b in frame.history.buckets(now, width, BUCKETS) if b]
        x = [t for t, _ in buckets]
        tps = [b.tokens / width for _, b in buckets]
        step = [1e3 * b.seconds / b.steps for _, b in buckets]
        host = [1e3 * b.host_seconds / b.steps for _, b in buckets]
        device = [1e3 * b.device_seconds / b.steps for _, b in buckets]
        share = [100 * b.cascade_steps / b.steps for _, b in buckets]
        saved = [100 * b.kv_bytes_saved / b.kv_bytes_flat if b.kv_bytes_flat else 0.0 for _, b in buckets]
        self.query_one("#plot-tps", HistoryPlot).show("tokens/s", [(x, tps, "tok/s", "green")], span)
        # An outlier (the first step, a stall) would flatten the rest: the scale stops at 3x the median.
        self.query_one("#plot-step", HistoryPlot).show(
            "decode step ms", [(x, step, "step", "red"), (x, host, "host", "orange"),
                               (x, device, "device", "blue")], span, (0, 1.1 * scale_top(step)) if step else None)
        self.query_one("#plot-share", HistoryPlot).show(
            "cascade %", [(x, share, "steps", "magenta"), (x, saved, "KV bytes", "cyan")],
            span, (0, 100))
        self.border_subtitle = f"the last {clock(-span)[1:]} min, {width:g} s a point"
