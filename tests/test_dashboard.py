"""The dashboard under App.run_test + Pilot: on a real in-process engine for the
controls (cascade toggle, thresholds, sessions), on the deterministic fake
source for the rest."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console
from textual.widgets import DataTable, Input, Static

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sessions import SessionManager, synthetic_system_prompt
from mlxcel.engine.builtin_models import TINY_MODEL_NAME, tiny_model_path
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
from mlxcel_tui.app import DashboardApp, settle
from mlxcel_tui.fake_source import FakeSource, demo_source
from mlxcel_tui.frame import STALL_LAUNCHES, HostInfo, RateMeter, StallWatch, launch_key, launches
from mlxcel_tui.panels import format as fmt
from mlxcel_tui.panels.latency import scale_top, sparkline, switch_marks
from mlxcel_tui.panels.launch_paths import LaunchPathsPanel
from mlxcel_tui.panels.status import StatusLine
from mlxcel_tui.source import EngineSource, SourceError, StartingSource

SIZE = (160, 48)
HOST = HostInfo(300 * 2**20, 50.0, 40 * 2**20, 80 * 2**20, "test BLAS")


@pytest.fixture(scope="module")
def loaded():
    return load_model(tiny_model_path(), TINY_MODEL_NAME)


@pytest.fixture
def live(loaded):
    """A real engine on the embedded model: 3 sessions behind a ~96-token system
    prompt at 16 tokens a page, thresholds low enough for it to cascade. The
    test steps it on its own thread, between polls."""
    engine = Engine(loaded, EngineConfig(block_size=16, num_blocks=256),
                    cascade=CascadeConfig(enabled=False, min_shared_pages=2, min_members=2))
    prompt = synthetic_system_prompt(engine.tokenizer, 96, DEFAULT_SYSTEM_PROMPT)
    sessions = SessionManager(engine, prompt, list(DEFAULT_QUESTIONS), max_tokens=6)
    sessions.add(3)
    yield engine, sessions
    engine.shutdown()


def text_of(widget) -> str:
    """What a panel shows, as plain text."""
    renderable = widget.content if isinstance(widget, Static) else widget.render()
    console = Console(width=200, file=io.StringIO(), color_system=None)
    with console.capture() as capture:
        console.print(renderable)
    return capture.get()


def counts(app: DashboardApp) -> tuple[float, float]:
    metrics = app.frame.metrics
    return launches(metrics, "fused_v2"), launches(metrics, "cascade")


async def poll(pilot) -> None:
    await pilot.press("r")
    await settle(pilot)


async def test_cascade_key_switches_engine_and_moves_launch_counters(live):
    engine, sessions = live
    app = DashboardApp(EngineSource(engine, sessions), refresh=3600)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=8)  # every session prefilled and decoding
        await poll(pilot)
        assert app.frame.snapshot["cascade"]["enabled"] is False
        fused0, cascade0 = counts(app)
        assert fused0 > 0 and cascade0 == 0
        assert "MLX active" in text_of(app.query_one("#header"))

        await pilot.press("c")
        await settle(pilot)
        assert engine.cascade.enabled is True
        assert app.frame.snapshot["cascade"]["enabled"] is True
        assert app.message == ("cascade on", "info")
        engine.run_until_idle(max_steps=10)
        await poll(pilot)
        fused1, cascade1 = counts(app)
        assert cascade1 > cascade0 and fused1 > fused0
        assert app.frame.rate("cascade") > 0

        await pilot.press("c")
        await settle(pilot)
        assert engine.cascade.enabled is False
        engine.run_until_idle(max_steps=10)
        await poll(pilot)
        fused2, cascade2 = counts(app)
        assert cascade2 == cascade1 and fused2 > fused1
        assert [s[2] for s in app.frame.snapshot["cascade_switches"]] == [False, True, False]


async def test_bad_threshold_is_refused_and_config_kept(live):
    engine, sessions = live
    app = DashboardApp(EngineSource(engine, sessions), refresh=3600)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        box = app.query_one("#min-members", Input)
        for typed, why in (("1", "min_members must be an integer >= 2, got 1"),
                           ("lots", "min_members must be an integer, got 'lots'")):
            await pilot.press("n")  # focuses the input with its text selected: typing replaces it
            await pilot.press(*typed, "enter")
            await settle(pilot)
            text, severity = app.message
            assert severity == "error" and text.startswith("refused") and why in text
            assert why in text_of(app.query_one(StatusLine))
            assert engine.cascade.min_members == 2
            assert box.value == "2"  # the old value is shown again

        await pilot.press("m", "5", "enter")
        await settle(pilot)
        assert engine.cascade.min_shared_pages == 5 and app.message == ("min_shared_pages = 5", "info")


async def test_adding_a_session_shows_a_new_map_row(live):
    engine, sessions = live
    app = DashboardApp(EngineSource(engine, sessions), refresh=3600)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=6)
        await poll(pilot)
        table = app.query_one("#map-table", DataTable)
        before = {str(row.value) for row in table.rows}
        assert len(before) == 3

        await pilot.press("a")
        await settle(pilot)
        assert len(sessions.sessions) == 4 and app.message == ("added a session", "info")
        engine.step()  # the new session's prefill: its sequence is live now
        await poll(pilot)
        # The other sessions' 6-token turns end and start anew meanwhile: their rows change ids.
        rows = {str(row.value): table.get_row(row.value)[0] for row in table.rows}
        new = next(key for key, label in rows.items() if label.endswith("session-4"))
        assert new not in before and len(rows) == len(engine.snapshot.sequences)

        await pilot.press("d")
        await settle(pilot)
        engine.step()
        await poll(pilot)
        assert len(sessions.sessions) == 3 and new not in {str(row.value) for row in table.rows}


def fake_app(source, **kwargs) -> DashboardApp:
    tick = itertools.count()
    return DashboardApp(source, refresh=3600, clock=lambda: float(next(tick)), host=lambda snap: HOST, **kwargs)


async def test_page_map_marks_plan_span_partial_and_mid_page_pages():
    source = demo_source()
    app = fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        snap = app.frame.snapshot
        plan = snap["plan"]
        table = app.query_one("#map-table", DataTable)
        assert table.row_count == len(snap["sequences"])
        for seq in snap["sequences"]:
            label, group, _, _, cells = table.get_row(str(seq["id"]))
            assert len(cells.plain) == len(seq["pages"])
            member = seq["id"] in plan["members"]
            assert group.endswith("◆") == member
            assert (cells.plain[0] == "▐") == (seq["first_page_offset"] > 0)
            assert (cells.plain[-1] == "█") == (seq["last_page_len"] == snap["pool"]["block_size"])
            magenta = [s for s in cells.spans if "d700d7" in str(s.style)]
            assert (magenta[0].end if magenta else 0) == (plan["shared_pages"] if member else 0)


async def test_map_stays_readable_for_64_sequences_of_8k_tokens():
    source = FakeSource(sessions=64, prompt_tokens=8192, num_blocks=64 * 300)
    app = fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(64):  # one prefill a step
            source.advance()
        await poll(pilot)
        table = app.query_one("#map-table", DataTable)
        assert table.row_count == 64
        widest = max(len(s["pages"]) for s in app.frame.snapshot["sequences"])
        assert widest >= 256
        assert len(table.get_row_at(0)[4].plain) >= 256  # one cell a page, scrolls sideways

        await pilot.press("z")
        await pilot.pause()
        cells = len(table.get_row_at(0)[4].plain)
        assert cells < widest
        assert cells <= table.scrollable_content_region.width
        assert "pages (its first page's colour)" in text_of(app.query_one("#map-legend"))


async def test_warns_when_cascade_is_enabled_but_never_activates():
    source = FakeSource(enabled=True, min_shared_pages=50)  # no subgroup shares 50 pages
    app = fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        panel = app.query_one(LaunchPathsPanel)
        assert "not activating" not in text_of(panel)
        source.advance(STALL_LAUNCHES)
        await poll(pilot)
        warning = text_of(panel)
        assert "cascade is ON but not activating" in warning
        assert "< min_shared_pages 50" in warning
        await pilot.press("m", "4", "enter")
        await settle(pilot)
        await poll(pilot)
        assert "not activating" not in text_of(panel)


async def test_read_only_source_disables_controls():
    source = demo_source(can_control=False)
    app = fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("c", "a", "p")
        await settle(pilot)
        assert source.config.enabled is True and len(source.sessions) == 6 and not source.paused
        assert app.query_one("#min-members", Input).disabled
        assert "read-only" in text_of(app.query_one("#controls-note"))
        assert app.check_action("toggle_cascade", ()) is None


class FailingSource(FakeSource):
    def snapshot(self) -> dict:
        raise SourceError("cannot reach http://127.0.0.1:9: connection refused")


async def test_poll_errors_go_to_the_status_line():
    app = fake_app(FailingSource())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.is_running and app.frame is None
        assert "poll failed: cannot reach http://127.0.0.1:9" in text_of(app.query_one(StatusLine))


async def test_keys_pause_refresh_rate_theme_and_help():
    source = demo_source()
    app = fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        step = source.step
        await pilot.press("p")
        await settle(pilot)
        assert source.paused and app.frame.snapshot["paused"] and source.step == step
        assert "PAUSED" in text_of(app.query_one("#header"))
        await pilot.press("p")
        await settle(pilot)
        assert not source.paused

        app.interval = 1.0
        await pilot.press("plus")
        assert app.interval == 0.5
        await pilot.press("minus", "minus")
        assert app.interval == 2.0

        await pilot.press("t")
        assert app.theme == "textual-light"
        await pilot.press("t")
        assert app.theme == "textual-dark"

        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        keys = text_of(app.screen.query_one("#help-keys"))
        for binding in ("Switch cascade attention", "min_shared_pages", "Add a built-in", "Poll more often"):
            assert binding in keys
        await pilot.press("c")  # any key closes the help, and does nothing else
        await settle(pilot)
        assert type(app.screen).__name__ != "HelpScreen"
        assert source.config.enabled is True


def test_rate_meter_and_stall_watch():
    meter, watch = RateMeter(), StallWatch()
    key = launch_key("cascade")
    assert meter.update(0.0, {key: 10})[key] is None
    assert meter.update(2.0, {key: 30})[key] == 10.0
    assert meter.update(3.0, {key: 5})[key] is None  # counter went back: another engine

    fused = launch_key("fused_v2")
    assert watch.observe(True, {fused: 100, key: 0}) == 0
    assert watch.observe(True, {fused: 140, key: 0}) == 40
    assert watch.observe(True, {fused: 150, key: 2}) == 0  # cascade moved: the watch restarts
    assert watch.observe(False, {fused: 400, key: 2}) == 0


def test_latency_sparkline_scale_clip_and_switch_marks():
    values = [4.0, 5.0, 4.0, 5.0, 100.0]  # a stall would flatten the rest
    top = scale_top(values)
    assert top == 15.0
    line = sparkline(values, [False, False, True, True, True], top)
    assert line.plain[-1] == "█" and str(line.spans[-1].style) == fmt.WARN
    assert {str(s.style) for s in line.spans[:2]} == {fmt.CASCADE_OFF}
    assert switch_marks([False, False, True, True, False], None).plain == "  ▲ ▼"
    assert switch_marks([True, True], False).plain == "▲ "


async def test_a_starting_source_says_what_is_prepared_then_shows_the_engine(live):
    engine, sessions = live
    source = StartingSource()
    source.progress("converting SmolLM2 (Q4_1 GGUF -> float32)", 3, 272)
    app = DashboardApp(source, refresh=3600, host=lambda snap: HOST, notice="serving the tiny model instead")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        preparing = "preparing the model: converting SmolLM2 (Q4_1 GGUF -> float32), 3/272 tensors"
        assert preparing in text_of(app.query_one("#header"))
        status = text_of(app.query_one(StatusLine))
        assert preparing in status and "serving the tiny model instead" in status and "failed" not in status
        assert app.frame is None and not app.can_control
        await pilot.press("c")  # a control before the engine exists does nothing
        engine.process_facts["blas"] = "OpenBLAS (test)"   # as the CLI names its process's BLAS
        source.ready(EngineSource(engine, sessions))
        engine.run_until_idle(max_steps=4)
        await poll(pilot)
        assert app.frame is not None and app.can_control and app.preparing is None
        assert "preparing" not in text_of(app.query_one("#header"))
        assert app.frame.snapshot["extra"]["blas"] == "OpenBLAS (test)"  # the engine's snapshot carries it


async def test_a_failed_start_closes_the_dashboard(monkeypatch):
    source = StartingSource()
    app = DashboardApp(source, refresh=3600, host=lambda snap: HOST)
    exits = []
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        monkeypatch.setattr(app, "exit", lambda *args, **kwargs: exits.append(args))
        source.failed(RuntimeError("the model cache cannot be written"))
        await poll(pilot)
    assert exits == [()]


async def test_answers_key_shows_each_sessions_latest_question_and_answer(live):
    engine, sessions = live
    app = DashboardApp(EngineSource(engine, sessions), refresh=3600, host=lambda snap: HOST)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=24)  # every session has finished a turn of 6 tokens
        assert all(s.turns >= 1 and s.last_answer for s in sessions.sessions)
        await pilot.press("s")
        await settle(pilot)
        shown = text_of(app.screen.query_one("#answers-table"))
        for s in sessions.sessions:
            assert s.label in shown and s.last_question[:20] in shown
        await pilot.press("x")
        await settle(pilot)
        assert not app.screen.query("#answers-table")


async def test_a_forest_of_tenants_shows_every_span_level(loaded, monkeypatch):
    # Two tenants behind a common prompt, each with its own sub-prefix: the
    # page map colours both levels on every member's row and the subgroups
    # panel lists the group with its three spans and their predicted savings
    # (a calibrated model on these kernels: the portable ones only predict).
    from mlxcel.engine import cost_model
    from mlxcel.engine.sessions import tenant_system_prompts
    from mlxcel_tui.panels.page_map import PageMap, span_colour
    from mlxcel_tui.panels.subgroups import SubgroupsPanel

    model = cost_model.CostModel("portable", "cpu", launch_s=1e-5, bytes_per_s=1e9, state_s=1e-12)
    monkeypatch.setattr(cost_model, "current", lambda measure: model)
    engine = Engine(loaded, EngineConfig(block_size=16, num_blocks=256),
                    cascade=CascadeConfig(enabled=True, min_shared_pages=2, min_members=2))
    common = synthetic_system_prompt(engine.tokenizer, 96, DEFAULT_SYSTEM_PROMPT)
    sessions = SessionManager(engine, tenant_system_prompts(engine.tokenizer, common, 2, 48),
                              list(DEFAULT_QUESTIONS), max_tokens=32)
    sessions.add(4)
    try:
        app = DashboardApp(EngineSource(engine, sessions), refresh=3600)
        async with app.run_test(size=SIZE) as pilot:
            for _ in range(12):                        # until every session is prefilled and decoding
                engine.step()
                if engine.snapshot.plan and len(engine.snapshot.plan.spans) == 3:
                    break
            await poll(pilot)
            plan = app.frame.snapshot["plan"]
            assert sorted(s["depth"] for s in plan["spans"]) == [0, 1, 1]
            tree = text_of(app.query_one(SubgroupsPanel))
            assert "3 spans in 1 group, 2 deep" in tree and "group 1: 4 seqs" in tree
            assert "measured decode steps: cascade" in tree and "ms a step" in tree
            assert tree.count("µs/layer (predicted)") == 3
            outer = next(s for s in plan["spans"] if s["depth"] == 0)
            assert f"pages 0–{outer['end']}" in tree
            legend = text_of(app.query_one("#map-legend", Static))
            assert "by depth:" in legend
            table = app.query_one(PageMap).query_one(DataTable)
            row = table.get_row(str(plan["spans"][1]["members"][0]))
            colours = {span.style for span in row[-1].spans}
            assert {span_colour(0), span_colour(1)} <= {str(c) for c in colours}
    finally:
        engine.shutdown()
