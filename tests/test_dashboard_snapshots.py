"""Snapshot tests (pytest-textual-snapshot) of the dashboard replaying the
recorded engine run (tests/fixtures/dashboard.jsonl.gz) at the three sizes
its layout is built for. `pytest --snapshot-update` rewrites
tests/__snapshots__/ after a deliberate change to what the dashboard shows."""

from __future__ import annotations

import pytest

from dashboard_helpers import INT8_POOL, SIZES, replay_app, settle, two_polls


@pytest.mark.parametrize("size", SIZES)
def test_main_screen(snap_compare, size):
    assert snap_compare(replay_app(), terminal_size=SIZES[size], run_before=two_polls)


@pytest.mark.parametrize("size", ["80x24", "200x50"])
def test_main_screen_of_an_int8_pool(snap_compare, size):
    """The header's pool line with the page format (the recording predates it; older servers draw as above)."""
    assert snap_compare(replay_app(pool=INT8_POOL), terminal_size=SIZES[size], run_before=two_polls)


def test_main_screen_light_theme(snap_compare):
    assert snap_compare(replay_app(), press=["t"], terminal_size=SIZES["200x50"], run_before=two_polls)


@pytest.mark.parametrize("size", ["80x24", "200x50"])
def test_help_screen(snap_compare, size):
    assert snap_compare(replay_app(), press=["question_mark"], terminal_size=SIZES[size], run_before=two_polls)


def test_sequence_detail_screen(snap_compare):
    async def open_detail(pilot):
        await two_polls(pilot)
        await pilot.press("j", "enter")
        await settle(pilot)

    assert snap_compare(replay_app(), terminal_size=SIZES["100x30"], run_before=open_detail)
