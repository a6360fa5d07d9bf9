"""The answers screen: each built-in session's latest question and the model's
answer to it, as the source had them when the key was pressed."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .help import ClosingScreen


def answers_table(sessions: list[dict]) -> Table:
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=True)
    table.add_column("session", style="bold", no_wrap=True)
    table.add_column("turns", justify="right")
    table.add_column("latest question", ratio=1)
    table.add_column("latest answer", ratio=2)
    for s in sessions:
        table.add_row(s["label"], str(s["turns"]), s.get("question") or "—", s.get("answer") or "—")
    return table


class AnswersScreen(ClosingScreen):
    """The sessions as read when the key was pressed (the screen does not refresh)."""

    def __init__(self, sessions: list[dict]) -> None:
        super().__init__()
        self.sessions = sessions

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="answers"):
            yield Static("mlxcel-tui · latest answers", id="answers-title")
            body = answers_table(self.sessions) if self.sessions else "no built-in sessions run here"
            yield Static(body, id="answers-table")
            yield Static("A session's answer appears once its first turn ends (— until then). "
                         "Any key closes this screen.", id="answers-note")
