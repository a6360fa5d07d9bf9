"""The help screen: every key of the screen's one BINDINGS table."""

from __future__ import annotations

from rich.table import Table
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


def key_table(app, bindings) -> Table:
    table = Table(box=None, padding=(0, 2), show_edge=False, expand=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("does", ratio=1)
    rows: dict[str, list] = {}
    for binding in Binding.make_bindings(bindings):
        row = rows.setdefault(binding.action, [[], binding.tooltip or binding.description])
        row[0].append(app.get_key_display(binding))
    for keys, does in rows.values():
        table.add_row(" ".join(dict.fromkeys(keys)), does)
    return table


class ClosingScreen(ModalScreen):
    """Shown over the dashboard; like htop's help, any key or a click closes it."""

    def on_key(self, event: events.Key) -> None:
        event.stop()
        self.dismiss()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.dismiss()


class HelpScreen(ClosingScreen):
    """The keys of the screen it was opened from; scrolls where the terminal is short."""

    def __init__(self, title: str, bindings, note: str) -> None:
        super().__init__()
        self.title_text = title
        self.bindings = bindings
        self.note = note

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(f"mlxcel-tui · {self.title_text}", id="help-title")
            yield Static(key_table(self.app, self.bindings), id="help-keys")
            yield Static(self.note + "\nAny key closes this help.", id="help-note")
