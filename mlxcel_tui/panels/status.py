"""Status line: the poll state (errors included, never a traceback) and the
answer to the last control request."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..frame import Frame
from . import format as fmt


class StatusLine(Widget):
    frame: reactive[Frame | None] = reactive(None)
    interval: reactive[float] = reactive(1.0)
    poll_error: reactive[str | None] = reactive(None)
    preparing: reactive[str | None] = reactive(None)
    message: reactive[tuple[str, str]] = reactive(("", "info"))  # (text, "info" | "error")

    def render(self) -> Text:
        polls = self.frame.poll if self.frame else 0
        if self.poll_error:
            poll = Text(f"⚠ poll failed: {self.poll_error} (showing poll #{polls})", style="bold " + fmt.BAD)
        elif self.preparing:
            poll = Text(f"◌ {self.preparing} …", style="bold " + fmt.WARN)
        elif self.frame is None:
            poll = Text("connecting …", style=fmt.MUTED)
        else:
            poll = Text(f"● poll #{polls} every {self.interval:g} s", style=fmt.OK)
        text, severity = self.message
        return Text.assemble(poll, "  ", (text, "bold " + fmt.BAD if severity == "error" else ""), no_wrap=True,
                             overflow="ellipsis")
