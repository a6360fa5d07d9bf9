"""Recording what the dashboard reads, and replaying it, as dolphie does.

A recording is JSON lines (gzip-compressed when the name ends in ``.gz``): a
header line, then one line per poll with the snapshot and the metric samples
the dashboard read. A snapshot's recent steps overlap the previous poll's, so
a line carries only the steps that are new since the line before it and how
many the snapshot held; replay puts each snapshot's list back together.

`mlxcel-tui serve --record FILE` and `attach --record FILE` write one;
`mlxcel-tui replay FILE` shows it again, one poll a line, read-only.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO

from .source import SourceError

FORMAT = "mlxcel-tui recording"
VERSION = 1


def open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


class Recorder:
    """Appends each poll of one source to a recording."""

    def __init__(self, path: Path, description: str) -> None:
        self.path = Path(path)
        try:
            self._file = open_text(self.path, "w")
        except OSError as err:
            raise SourceError(f"cannot write the recording {self.path}: {err.strerror or err}") from None
        self._last_step: int | None = None
        self._write({"format": FORMAT, "version": VERSION, "source": description})

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def write(self, snapshot: dict, metrics: dict[str, float]) -> None:
        steps = snapshot["recent_steps"]
        if self._last_step is not None and steps and steps[-1]["step"] < self._last_step:
            self._last_step = None  # the step counter went back: another engine, all its steps are new
        new = [s for s in steps if self._last_step is None or s["step"] > self._last_step]
        if steps:
            self._last_step = steps[-1]["step"]
        rest = {k: v for k, v in snapshot.items() if k != "recent_steps"}
        self._write({"snapshot": rest, "new_steps": new, "recent": len(steps), "metrics": metrics})

    def close(self) -> None:
        self._file.close()


def read_recording(path: Path) -> tuple[str, list[tuple[dict, dict[str, float]]]]:
    """(the recorded source's description, every poll's (snapshot, metrics))."""
    path = Path(path)
    try:
        with open_text(path, "r") as file:
            lines = [json.loads(line) for line in file if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as err:
        raise SourceError(f"cannot read the recording {path}: {err}") from None
    if not lines or lines[0].get("format") != FORMAT:
        raise SourceError(f"{path} is not a {FORMAT}")
    if lines[0].get("version") != VERSION:
        raise SourceError(f"{path} is version {lines[0].get('version')}; this mlxcel-tui reads {VERSION}")
    polls, steps = [], []
    for line in lines[1:]:
        if line["new_steps"] and steps and line["new_steps"][0]["step"] <= steps[-1]["step"]:
            steps = []  # another engine's steps begin
        steps = (steps + line["new_steps"])[-max(line["recent"], 1):]
        polls.append(({**line["snapshot"], "recent_steps": steps[-line["recent"]:] if line["recent"] else []},
                      line["metrics"]))
    if not polls:
        raise SourceError(f"{path} holds no poll")
    return lines[0]["source"], polls


class ReplaySource:
    """A recording as a read-only DataSource: each poll reads the next line,
    and the last one stays on screen once the recording ends."""

    can_control = False

    def __init__(self, path: Path, start: int = 0) -> None:
        self.path = Path(path)
        self.recorded, self.polls = read_recording(self.path)
        if not 0 <= start < len(self.polls):
            raise SourceError(f"--start must be in [0, {len(self.polls) - 1}] for {self.path.name}, got {start}")
        self.position = start - 1  # the poll shown last

    @property
    def description(self) -> str:
        return f"replay · {self.path.name} · poll {self.position + 1}/{len(self.polls)} of {self.recorded}"

    @property
    def ended(self) -> bool:
        return self.position >= len(self.polls) - 1

    def snapshot(self) -> dict:
        self.position = min(self.position + 1, len(self.polls) - 1)
        return self.polls[self.position][0]

    def metrics(self) -> dict[str, float]:
        return self.polls[max(self.position, 0)][1]

    def _refuse(self, *args, **kwargs):
        raise SourceError("a recording is read-only")

    set_cascade = change_sessions = set_paused = _refuse

    def session_answers(self) -> list[dict]:
        return []
