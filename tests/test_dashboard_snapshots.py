"""Snapshot tests (pytest-textual-snapshot) of the dashboard on the
deterministic fake source, with the clock and the host figures injected.
`pytest --snapshot-update` rewrites tests/__snapshots__/ after a deliberate
change to what the dashboard shows."""

from __future__ import annotations

import itertools

from mlxcel_tui.app import DashboardApp, settle
from mlxcel_tui.fake_source import demo_source
from mlxcel_tui.frame import HostInfo

SIZE = (160, 48)
HOST = HostInfo(300 * 2**20, 50.0, 40 * 2**20, 80 * 2**20, "OpenBLAS (preloaded)")


def make_app() -> DashboardApp:
    tick = itertools.count()
    return DashboardApp(demo_source(), url="http://127.0.0.1:8000", refresh=3600,
                        clock=lambda: float(next(tick)), host=lambda snap: HOST)


async def two_polls(pilot) -> None:
    """The mount poll and one more, so the rates have a previous poll to compare."""
    await settle(pilot)
    pilot.app.action_poll()
    await settle(pilot)


def test_main_screen(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=two_polls)


def test_main_screen_light_theme(snap_compare):
    assert snap_compare(make_app(), press=["t"], terminal_size=SIZE, run_before=two_polls)


def test_help_screen(snap_compare):
    assert snap_compare(make_app(), press=["question_mark"], terminal_size=SIZE, run_before=two_polls)
