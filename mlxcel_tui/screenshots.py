"""Regenerate the README's dashboard screenshots on the embedded default model:

    .venv/bin/python -m mlxcel_tui.screenshots    # writes screenshots/dashboard-cascade-{on,off}.svg

It runs what `mlxcel-tui serve` runs (default model, thresholds and system
prompt, 4 sessions, the engine on its own thread, the dashboard polling every
second) and presses the dashboard's own keys: STEPS engine steps with cascade
off, then `c` and STEPS steps (the "on" picture), then `c` again and STEPS
steps (the "off" picture). Timings and memory figures are the machine's own,
so the pictures differ a little from run to run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

SIZE = (160, 48)
STEPS = 48
SESSIONS = 4
SETTLE_SECONDS = 2.5  # two polls after the last step counted, so the rates cover engine work


async def capture(out: Path, steps: int) -> list[Path]:
    from .app import DashboardApp, settle
    from .workload import build_engine, start_sessions, system_prompt_text
    from .source import EngineSource

    engine = build_engine(None, cascade=False, min_shared_pages=None, min_members=None)
    sessions = start_sessions(engine, SESSIONS, system_prompt_text(engine, None, None), max_tokens=64)
    app = DashboardApp(EngineSource(engine, sessions))
    written = []
    try:
        async with app.run_test(size=SIZE) as pilot:
            async def run(name: str | None) -> None:
                target = engine.step_count + steps
                engine.start()
                while engine.step_count < target:
                    await pilot.pause(0.1)
                await pilot.pause(SETTLE_SECONDS)
                engine.stop()
                # A session between two turns has no live sequence: step on (a
                # prefill or two) until the picture shows every session.
                for _ in range(2 * SESSIONS):
                    if len(engine.snapshot.sequences) == SESSIONS:
                        break
                    engine.step()
                await pilot.press("r")
                await settle(pilot)
                if name:
                    written.append(Path(app.save_screenshot(name, str(out))))

            await run(None)
            for name in ("dashboard-cascade-on.svg", "dashboard-cascade-off.svg"):
                await pilot.press("c")
                await settle(pilot)
                await run(name)
    finally:
        engine.shutdown()
    return written


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("screenshots"),
              show_default=True, help="Folder to write the SVGs to.")
@click.option("--steps", type=click.IntRange(1), default=STEPS, show_default=True,
              help="Engine steps before each picture.")
def main(out: Path, steps: int) -> None:
    """Write the dashboard screenshots with cascade on and off."""
    out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(capture(out, steps)):
        click.echo(f"wrote {path}")


if __name__ == "__main__":
    from mlxcel.engine import blas

    blas.reexec_with_openblas()
    main()
