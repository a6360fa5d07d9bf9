"""Progress of building a built-in model, on stderr: a bar on a terminal; the
label alone (once) and a closing line in a log file."""

from __future__ import annotations

import sys

import click


class StderrProgress:
    """A callable ``progress(what, done, total)`` for one or more consecutive tasks."""

    def __init__(self, file=None) -> None:
        self.file = file or sys.stderr
        self._bar = None
        self._what: str | None = None
        self._done = 0

    def __call__(self, what: str, done: int, total: int) -> None:
        if what != self._what:
            self.close()
            self._bar = click.progressbar(length=total, label=f"mlxcel: {what}", file=self.file, show_pos=True)
            self._bar.__enter__()
            self._what, self._done = what, 0
        self._bar.update(done - self._done)
        self._done = done
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            click.echo(f"mlxcel: {self._what}: done", file=self.file)
            self._bar = None
