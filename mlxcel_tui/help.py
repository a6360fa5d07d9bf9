"""The help screen: every key of the app's one BINDINGS table."""

from __future__ import annotations

from rich.table import Table
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


def key_table(app) -> Table:
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("does")
    rows: dict[str, list] = {}
    for binding in Binding.make_bindings(app.BINDINGS):
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

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static("mlxcel-tui · keys", id="help-title")
            yield Static(key_table(self.app), id="help-keys")
            yield Static("In a threshold input, Enter applies the value: the engine refuses a bad one with a "
                         "message in the status line and keeps the old value. Panels refresh on every poll.\n"
                         "Any key closes this help.", id="help-note")
