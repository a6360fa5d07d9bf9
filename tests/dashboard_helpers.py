"""Helpers the dashboard tests and the screenshot script share: waiting for
the dashboard to settle under App.run_test, and the recorded engine run they
replay (tests/fixtures/dashboard.jsonl.gz, made by tests/record_dashboard.py)."""

from __future__ import annotations

from pathlib import Path

from mlxcel_tui.app import DashboardApp
from mlxcel_tui.frame import HostInfo
from mlxcel_tui.recording import ReplaySource

RECORDING = Path(__file__).parent / "fixtures" / "dashboard.jsonl.gz"
SIZES = {"80x24": (80, 24), "100x30": (100, 30), "200x50": (200, 50)}
HOST = HostInfo(300 * 2**20, 50.0, 40 * 2**20, 80 * 2**20, "test BLAS")


async def settle(pilot) -> None:
    """Wait until no poll or control call is in flight and their results are
    on screen (a control's re-poll included)."""
    app = pilot.app
    for _ in range(20):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not len(app.workers) and not any(len(s.workers) for s in app.screen_stack):
            return
    raise TimeoutError("the dashboard kept starting workers")


def poll_index(source: ReplaySource, test) -> int:
    """The first recorded poll whose snapshot passes test(snapshot)."""
    return next(i for i, (snap, _) in enumerate(source.polls) if test(snap))


# The recorded run's pool (tiny model, 16-token pages, float32: 64 KiB a page) as an int8 pool would report
# it: a page's 2 x 4 layers x 16 tokens x 2 heads x (64 codes + a 2-byte scale) = 16.5 KiB.
INT8_POOL = {"bytes_per_block": 16896, "kv_dtype": "int8", "model_dtype": "float32",
             "model_dtype_bytes_per_block": 65536}


def replay_app(start: int | None = None, pool: dict | None = None, **kwargs) -> DashboardApp:
    """The recording from poll start (default: cascade on with every session
    decoding), with fixed host figures; the test polls it. ``pool``: fields
    to set in every snapshot's pool (the recording predates some)."""
    source = ReplaySource(RECORDING)
    for snap, _ in source.polls if pool else ():
        snap["pool"] = {**snap["pool"], **pool}
    if start is None:
        start = cascading_poll(source)
    source.position = start - 1
    return DashboardApp(source, url="http://127.0.0.1:8000", refresh=3600, **kwargs)


def cascading_poll(source: ReplaySource) -> int:
    """A poll well into the cascading part: a plan over several decoding rows."""
    first = poll_index(source, lambda s: s["plan"] is not None and len(s["plan"]["members"]) >= 3)
    return min(first + 6, len(source.polls) - 2)


async def two_polls(pilot) -> None:
    """The mount poll and one more, so the rates have a previous poll to compare."""
    await settle(pilot)
    pilot.app.dashboard.action_poll()
    await settle(pilot)
