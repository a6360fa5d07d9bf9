"""Per-step latency: decode step time, the engine's host time of each step
and tokens/s over the recent steps as sparklines coloured by whether cascade
was on, with the switches marked. Host time near the step time means the
engine, not the device, sets the pace."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame
from . import format as fmt

BARS = "▁▂▃▄▅▆▇█"
LABEL = 16  # width of the row labels


def scale_top(values: list[float]) -> float:
    """The value a full bar stands for: the maximum, or three times the median
    when an outlier (a first step, a stall) would flatten everything else."""
    if not values:
        return 0.0
    median = sorted(values)[len(values) // 2]
    return min(max(values), 3 * median) if median > 0 else max(values)


def sparkline(values: list[float], states: list[bool], top: float) -> Text:
    """One bar per value scaled from 0 to top, coloured by cascade state;
    values above top are full bars in the warning colour."""
    text = Text(no_wrap=True)
    for value, on in zip(values, states):
        if top and value > top:
            text.append(BARS[-1], fmt.WARN)
            continue
        level = min(len(BARS) - 1, int(value / top * len(BARS))) if top else 0
        text.append(BARS[level], fmt.CASCADE_ON if on else fmt.CASCADE_OFF)
    return text


def switch_marks(states: list[bool], first_state: bool | None) -> Text:
    """▲ under the first step after cascade was switched on, ▼ after off."""
    text = Text(no_wrap=True)
    previous = first_state
    for on in states:
        if previous is not None and on != previous:
            text.append("▲" if on else "▼", "bold " + (fmt.CASCADE_ON if on else fmt.CASCADE_OFF))
        else:
            text.append(" ")
        previous = on
    return text


class LatencyPanel(Widget):
    frame: reactive[Frame | None] = reactive(None)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "decode step latency"

    def render(self) -> Text:
        f = self.frame
        if f is None:
            return Text("…")
        snap = f.snapshot
        room = max(8, self.content_size.width - LABEL)
        records = snap["recent_steps"]
        decode = [r for r in records if r["kind"] == "decode"]
        shown = decode[-room:]
        # The state before the first shown step, so a switch right at the edge still shows.
        before = decode[-room - 1]["cascade_enabled"] if len(decode) > room else None
        states = [r["cascade_enabled"] for r in shown]
        step_ms = [r["seconds"] * 1e3 for r in shown]
        host_ms = [r.get("host_seconds", 0.0) * 1e3 for r in shown]
        tps = [r["tokens"] / r["seconds"] if r["seconds"] else 0.0 for r in shown]
        switches = snap["cascade_switches"][1:]
        last = switches[-1] if switches else None
        switched = f" · switched {'on' if last[2] else 'off'} at step {last[0]}" if last else ""
        head = Text.assemble(
            ("p50 ", "bold"), fmt.ms(snap["latency_p50_seconds"]), ("  p99 ", "bold"),
            fmt.ms(snap["latency_p99_seconds"]), ("  tokens/s ", "bold"), f"{snap['tokens_per_second']:,.1f}",
            f"  over the last {len(decode)} decode steps{switched}")
        host, device = snap.get("host_p50_seconds"), snap.get("device_p50_seconds")
        if host is not None and device is not None:
            pace = "host" if host >= device else "device"
            head.append_text(Text.assemble("\n", ("host ", "bold"), fmt.ms(host), ("  device ", "bold"),
                                           fmt.ms(device), f"  (p50; the {pace} sets the pace)"))
        if not shown:
            return Text.assemble(head, "\n", ("no decode step yet", fmt.MUTED))
        ms_top, tps_top = scale_top(step_ms), scale_top(tps)
        lines = [
            head,
            Text.assemble(f"{'step ms ≤' + format(ms_top, '.1f'):<{LABEL}}", sparkline(step_ms, states, ms_top)),
            Text.assemble(" " * LABEL, switch_marks(states, before)),
            Text.assemble(f"{'host ms ≤' + format(ms_top, '.1f'):<{LABEL}}", sparkline(host_ms, states, ms_top)),
            Text.assemble(f"{'tok/s ≤' + format(tps_top, ',.0f'):<{LABEL}}", sparkline(tps, states, tps_top)),
            Text.assemble((" " * LABEL), ("█", fmt.CASCADE_ON), " cascade on  ", ("█", fmt.CASCADE_OFF),
                          " cascade off  ", ("█", fmt.WARN), " above the scale  ▲▼ switched on/off"
                          "  (bars from 0; newest right)"),
        ]
        return Text("\n").join(lines)
