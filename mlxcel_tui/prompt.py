"""A one-line prompt over the dashboard (as k9s's `:` and `/` lines): the
threshold edits and the row filter. It only reads the text; what the text
means is decided by whoever asked (the engine refuses a bad threshold)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class PromptScreen(ModalScreen[str | None]):
    """Enter answers with the text, Esc with None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", tooltip="Leave the prompt, changing nothing")]

    def __init__(self, title: str, value: str = "", note: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Static(self.title_text, id="prompt-title")
            yield Input(value=self.value, id="prompt-input", select_on_focus=True)
            yield Static(self.note or "Enter applies · Esc leaves", id="prompt-note")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
