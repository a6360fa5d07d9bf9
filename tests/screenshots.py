"""Regenerate the README's dashboard screenshots from the recorded engine run:

    .venv/bin/python tests/screenshots.py    # writes screenshots/dashboard-*.svg

It replays tests/fixtures/dashboard.jsonl.gz (tests/record_dashboard.py makes
it on the tiny model) at each size the layout is built for: cascade on, with
the plan over the decoding rows, at 200x50, 100x30 and 80x24, and cascade
switched off again at 200x50. Two polls a picture, so the rates have a
previous poll to compare.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_helpers import SIZES, cascading_poll, poll_index, replay_app, two_polls  # noqa: E402

from mlxcel_tui.recording import ReplaySource  # noqa: E402


async def capture(out: Path) -> list[Path]:
    source = ReplaySource(Path(__file__).parent / "fixtures" / "dashboard.jsonl.gz")
    on = cascading_poll(source)
    off = poll_index(source, lambda s: s["step"] > source.polls[on][0]["step"] and not s["cascade"]["enabled"]) + 6
    shots = [(f"dashboard-cascade-on-{name}.svg", size, on) for name, size in SIZES.items()]
    shots.append(("dashboard-cascade-off-200x50.svg", SIZES["200x50"], off))
    written = []
    for name, size, start in shots:
        app = replay_app(start)
        async with app.run_test(size=size) as pilot:
            await two_polls(pilot)
            written.append(Path(app.save_screenshot(name, str(out))))
    return written


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("screenshots"),
              show_default=True, help="Folder to write the SVGs to.")
def main(out: Path) -> None:
    """Write the dashboard screenshots from the recording."""
    out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(capture(out)):
        click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
