"""Controls: cascade on/off and the two thresholds, edited live. The inputs
only say whether the text is an integer; the engine's config decides whether
the value is allowed (and refuses it with a message, keeping the old one)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.validation import Integer
from textual.widgets import Input, Label, Static

from ..frame import Frame
from . import format as fmt

# input id -> cascade config field
THRESHOLDS = {"min-shared-pages": "min_shared_pages", "min-members": "min_members"}


class ControlsPanel(Vertical):
    frame: reactive[Frame | None] = reactive(None)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "controls"

    def compose(self) -> ComposeResult:
        yield Static(id="cascade-switch")
        for input_id, name in THRESHOLDS.items():
            with Horizontal(classes="threshold"):
                yield Label(name.replace("_", " "))
                yield Input(id=input_id, validators=[Integer(failure_description="not an integer")],
                            validate_on=["changed", "submitted"], compact=True)
        yield Static(id="controls-note")

    def watch_frame(self, frame: Frame | None) -> None:
        if frame is None:
            return
        cfg = frame.snapshot["cascade"]
        for input_id in THRESHOLDS:
            self.query_one(f"#{input_id}", Input).disabled = not frame.can_control
        self.show_config(cfg)
        state = ("ON", "bold " + fmt.CASCADE_ON) if cfg["enabled"] else ("OFF", "bold " + fmt.CASCADE_OFF)
        paused = ("paused", "bold " + fmt.WARN) if frame.snapshot["paused"] else ("running", fmt.OK)
        self.query_one("#cascade-switch", Static).update(
            Text.assemble("cascade ", state, " (c) · engine ", paused, " (p)"))
        note = (Text("m / n edit a threshold, Enter applies, Esc leaves · a / d add / remove a session",
                     style=fmt.MUTED) if frame.can_control else
                Text(f"read-only: {frame.source} does not accept control", style="bold " + fmt.WARN))
        self.query_one("#controls-note", Static).update(note)

    def show_config(self, cfg: dict, force: bool = False) -> None:
        """Put the config's thresholds in the inputs; an input being edited is
        left alone unless forced (after an apply or a refusal)."""
        for input_id, name in THRESHOLDS.items():
            box = self.query_one(f"#{input_id}", Input)
            if (force or not box.has_focus) and box.value != str(cfg[name]):
                box.value = str(cfg[name])
