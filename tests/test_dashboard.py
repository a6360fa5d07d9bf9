"""The dashboard under App.run_test + Pilot: on a real in-process engine for the
controls (cascade toggle, thresholds, sessions, pause) and everything that
needs an engine to move, on the recorded engine run (tests/fixtures) for the
views."""

from __future__ import annotations

import io
import json
from dataclasses import asdict

import pytest
from rich.console import Console
from textual.geometry import Region
from textual.widgets import DataTable, Input, Static

from dashboard_helpers import HOST, INT8_POOL, RECORDING, SIZES, poll_index, replay_app, settle, two_polls
from mlxcel.engine.builtin_models import TINY_MODEL_NAME, tiny_model_path
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
from mlxcel.engine.snapshot import RankView, TensorParallelView
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
from mlxcel.engine.sessions import SessionManager, synthetic_system_prompt
from mlxcel_tui.app import DashboardApp
from mlxcel_tui.fleet import FleetApp
from mlxcel_tui.frame import STALL_LAUNCHES, History, RateMeter, StallWatch, launch_key, launches
from mlxcel_tui.panels import format as fmt
from mlxcel_tui.panels.latency import scale_top, sparkline, switch_marks
from mlxcel_tui.panels.header import tensor_parallel_line
from mlxcel_tui.panels.launch_paths import LaunchPathsPanel
from mlxcel_tui.panels.status import StatusLine
from mlxcel_tui.recording import Recorder, ReplaySource, read_recording
from mlxcel_tui.source import EngineSource, SourceError, StartingSource

SIZE = SIZES["200x50"]


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
    metrics = app.dashboard.frame.metrics
    return launches(metrics, "fused_v2"), launches(metrics, "cascade")


async def poll(pilot) -> None:
    await pilot.press("r")
    await settle(pilot)


def live_app(engine, sessions) -> DashboardApp:
    return DashboardApp(EngineSource(engine, sessions), refresh=3600, host=lambda snap: HOST)


# -- controls on a real engine ------------------------------------------------

async def test_cascade_key_switches_engine_and_moves_launch_counters(live):
    engine, sessions = live
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=8)  # every session prefilled and decoding
        await poll(pilot)
        dash = app.dashboard
        assert dash.frame.snapshot["cascade"]["enabled"] is False
        fused0, cascade0 = counts(app)
        assert fused0 > 0 and cascade0 == 0

        await pilot.press("c")
        await settle(pilot)
        assert engine.cascade.enabled is True and dash.message == ("cascade on", "info")
        # No decode step since the switch: the panel says the next one plans, not "declined: cascade off".
        assert "switched on: the next decode step plans" in text_of(app.screen.query_one("#subgroups"))
        assert "declined" not in text_of(app.screen.query_one("#subgroups"))
        engine.run_until_idle(max_steps=10)
        await poll(pilot)
        fused1, cascade1 = counts(app)
        assert cascade1 > cascade0 and fused1 > fused0
        assert dash.frame.rate("cascade") > 0
        saved = text_of(app.screen.query_one("#savings"))
        assert "not read" in saved and "in all" in saved

        await pilot.press("c")
        await settle(pilot)
        assert engine.cascade.enabled is False
        engine.run_until_idle(max_steps=10)
        await poll(pilot)
        fused2, cascade2 = counts(app)
        assert cascade2 == cascade1 and fused2 > fused1
        assert [s[2] for s in dash.frame.snapshot["cascade_switches"]] == [False, True, False]


async def test_bad_threshold_is_refused_and_config_kept(live):
    engine, sessions = live
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dash = app.dashboard
        for typed, why in (("1", "min_members must be an integer >= 2, got 1"),
                           ("lots", "min_members must be an integer, got 'lots'")):
            await pilot.press("n")  # a prompt with the old value selected: typing replaces it
            assert app.screen.query_one("#prompt-input", Input).value == "2"
            await pilot.press(*typed, "enter")
            await settle(pilot)
            text, severity = dash.message
            assert severity == "error" and text.startswith("refused") and why in text
            assert why in text_of(dash.query_one(StatusLine))
            assert engine.cascade.min_members == 2
            assert "min members 2" in text_of(dash.query_one("#subgroups"))

        await pilot.press("m", "5", "enter")
        await settle(pilot)
        assert engine.cascade.min_shared_pages == 5 and dash.message == ("min_shared_pages = 5", "info")
        await pilot.press("m", "9", "escape")  # Esc leaves the prompt, changing nothing
        await settle(pilot)
        assert engine.cascade.min_shared_pages == 5 and app.screen is dash


async def test_an_added_session_shows_at_once_as_a_waiting_row(live):
    engine, sessions = live
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=6)
        await poll(pilot)
        table = app.screen.query_one("#map-table", DataTable)
        before = {str(row.value) for row in table.rows}
        assert len(before) == 3

        await pilot.press("a")
        await settle(pilot)  # the control re-polls: no engine step in between
        assert len(sessions.sessions) == 4
        rows = {str(row.value): table.get_row(row.value) for row in table.rows}
        new = next(key for key, cells in rows.items() if cells[0].endswith("session-4"))
        assert rows[new][2].plain == "waiting" and new not in before
        assert "1 waiting" in text_of(app.screen.query_one("#header"))
        engine.step()  # admitted: its row holds pages now
        await poll(pilot)
        assert str(new) in {str(row.value) for row in table.rows}
        assert table.get_row(new)[2].plain != "waiting"

        await pilot.press("d")
        await settle(pilot)
        engine.step()
        await poll(pilot)
        assert len(sessions.sessions) == 3 and new not in {str(row.value) for row in table.rows}


async def test_pause_refresh_rate_theme_and_refresh_feedback(live):
    engine, sessions = live
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dash = app.dashboard
        await pilot.press("p")
        await settle(pilot)
        assert engine.paused and dash.frame.snapshot["paused"]
        assert "PAUSED" in text_of(dash.query_one("#header"))
        await pilot.press("p")
        await settle(pilot)
        assert not engine.paused

        engine.run_until_idle(max_steps=3)
        await pilot.press("r")
        await settle(pilot)
        assert dash.message == (f"polled: step {engine.step_count}", "info")

        dash.interval = 1.0
        await pilot.press("plus")
        assert dash.interval == 0.5
        await pilot.press("minus", "minus")
        assert dash.interval == 2.0
        await pilot.press("t")
        assert app.theme == "textual-light"
        await pilot.press("t")
        assert app.theme == "textual-dark"


async def test_warns_when_cascade_is_enabled_but_never_activates(live):
    engine, sessions = live
    engine.cascade.update(enabled=True, min_shared_pages=50)  # no subgroup shares 50 pages
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=4)
        await poll(pilot)
        panel = app.screen.query_one(LaunchPathsPanel)
        assert "not activating" not in text_of(panel)
        while app.dashboard.frame.stalled_launches < STALL_LAUNCHES:  # the sessions keep asking
            engine.step()
            await poll(pilot)
        warning = " ".join(text_of(panel).split())
        assert "cascade is ON but not activating" in warning
        assert f"Planner: {app.dashboard.frame.snapshot['decline_reason']}" in warning
        await pilot.press("m", "2", "enter")
        await settle(pilot)
        engine.run_until_idle(max_steps=4)
        await poll(pilot)
        assert "not activating" not in text_of(panel)


async def test_a_long_prefill_shows_its_progress_in_the_row_and_the_header(loaded):
    engine = Engine(loaded, EngineConfig(block_size=16, num_blocks=256, max_running=8, max_batched_tokens=40))
    try:
        engine.submit(list(range(3, 203)), SamplingParams(max_tokens=4), label="long")
        app = live_app(engine, None)
        async with app.run_test(size=SIZE) as pilot:
            engine.step()
            engine.step()
            await poll(pilot)
            seq = app.dashboard.frame.snapshot["sequences"][0]
            assert seq["status"] == "prefilling" and 0 < seq["num_cached_tokens"] < seq["num_prompt_tokens"]
            done, total = seq["num_cached_tokens"], seq["num_prompt_tokens"]
            assert f"1 prefilling {done}/{total} tokens" in text_of(app.screen.query_one("#header"))
            cells = app.screen.query_one("#map-table", DataTable).get_row(str(seq["id"]))
            assert cells[2].plain == f"prefill {100 * done // total}%"
    finally:
        engine.shutdown()


async def test_a_starting_source_says_what_is_prepared_then_shows_the_engine(live):
    engine, sessions = live
    source = StartingSource()
    source.progress("converting SmolLM2 (Q4_1 GGUF -> float32)", 3, 272)
    app = DashboardApp(source, refresh=3600, host=lambda snap: HOST, notice="serving the tiny model instead")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dash = app.dashboard
        preparing = "preparing the model: converting SmolLM2 (Q4_1 GGUF -> float32), 3/272 tensors"
        assert preparing in text_of(dash.query_one("#header"))
        assert preparing in text_of(dash.query_one("#map-legend"))  # the map says it too, not a blank
        status = text_of(dash.query_one(StatusLine))
        assert preparing in status and "serving the tiny model instead" in status and "failed" not in status
        assert dash.frame is None and not dash.can_control
        await pilot.press("c")  # a control before the engine exists does nothing
        engine.process_facts["blas"] = "OpenBLAS (test)"   # as the CLI names its process's BLAS
        source.ready(EngineSource(engine, sessions))
        engine.run_until_idle(max_steps=4)
        await poll(pilot)
        assert dash.frame is not None and dash.can_control and dash.preparing is None
        assert "preparing" not in text_of(dash.query_one("#header"))
        assert dash.frame.snapshot["extra"]["blas"] == "OpenBLAS (test)"


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
    app = live_app(engine, sessions)
    async with app.run_test(size=SIZE) as pilot:
        engine.run_until_idle(max_steps=24)  # every session has finished a turn of 6 tokens
        assert all(s.turns >= 1 and s.last_answer for s in sessions.sessions)
        await pilot.press("l")
        await settle(pilot)
        shown = text_of(app.screen.query_one("#answers-table"))
        for s in sessions.sessions:
            assert s.label in shown and s.last_question[:20] in shown
        await pilot.press("x")
        await settle(pilot)
        assert not app.screen.query("#answers-table")


async def test_map_stays_readable_for_64_sequences_of_256_pages(loaded):
    """64 real sequences behind one shared prompt (prefilled once, then
    adopted from the prefix cache) of 256 pages each, as 8K-token prompts at
    32 tokens a page would be (2 tokens a page here, so a CPU runs it in
    seconds): a row per sequence, one cell a page, or fitted to the width."""
    engine = Engine(loaded, EngineConfig(block_size=2, num_blocks=2048, max_running=64, max_batched_tokens=1024))
    try:
        prompt = [3 + i % 200 for i in range(512)]
        for i in range(64):
            engine.submit(prompt + [300 + i], SamplingParams(max_tokens=64, ignore_eos=True), label=f"r{i}")
        while len(engine.scheduler.running) + len(engine.scheduler.retiring) < 64:
            engine.step()
        app = live_app(engine, None)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            table = app.screen.query_one("#map-table", DataTable)
            assert table.row_count == 64
            widest = max(len(s["pages"]) for s in app.dashboard.frame.snapshot["sequences"])
            assert widest >= 256
            assert len(table.get_row_at(0)[5].plain) >= 256  # one cell a page, scrolls sideways
            await pilot.press("z")
            await pilot.pause()
            cells = len(table.get_row_at(0)[5].plain)
            assert cells < widest and cells <= table.scrollable_content_region.width
            assert "pages (its first page's colour)" in text_of(app.screen.query_one("#map-legend"))
    finally:
        engine.shutdown()


# -- views on the recorded run ------------------------------------------------

async def test_page_map_marks_plan_span_and_partial_pages():
    app = replay_app()
    async with app.run_test(size=SIZE) as pilot:
        await two_polls(pilot)
        snap = app.dashboard.frame.snapshot
        plan = snap["plan"]
        assert plan and len(plan["members"]) >= 3
        table = app.screen.query_one("#map-table", DataTable)
        assert table.row_count == len(snap["sequences"]) + len(snap["queued"])
        for seq in snap["sequences"]:
            label, group, _, _, _, cells = table.get_row(str(seq["id"]))
            assert label.startswith(f"#{seq['id']} ") and len(cells.plain) == len(seq["pages"])
            member = seq["id"] in plan["members"]
            assert group.endswith("◆") == member
            assert (cells.plain[-1] == "█") == (seq["last_page_len"] == snap["pool"]["block_size"])
            magenta = [s for s in cells.spans if "d700d7" in str(s.style)]
            assert (magenta[0].end if magenta else 0) == (plan["shared_pages"] if member else 0)
        # The plan's member ids are the ids the rows show.
        subgroups = text_of(app.screen.query_one("#subgroups"))
        assert " ".join(f"#{m}" for m in plan["members"]) in subgroups


async def test_selection_detail_filter_and_sort_keys():
    app = replay_app()
    async with app.run_test(size=SIZE) as pilot:
        await two_polls(pilot)
        dash = app.dashboard
        table = dash.query_one("#map-table", DataTable)
        first = dash.page_map.selected
        await pilot.press("j")
        second = dash.page_map.selected
        assert second != first and table.cursor_row == 1
        await pilot.press("k")
        assert dash.page_map.selected == first

        await pilot.press("j", "enter")
        await settle(pilot)
        assert type(app.screen).__name__ == "SequenceScreen"
        shown = text_of(app.screen.query_one("#sequence-detail"))
        seq = next(s for s in dash.frame.snapshot["sequences"] if s["id"] == second)
        assert f"#{second} {seq['label']}" in shown and "TTFT" in shown
        assert f"pages ({len(seq['pages'])})" in shown
        assert f"{seq['pages'][0]}:{seq['refcounts'][0]}" in shown  # block:refcount
        assert "member of the last plan" in shown
        assert seq["prompt_head"][:10] in shown
        dash.action_poll()  # the detail follows the polls
        await settle(pilot)
        assert "#" in text_of(app.screen.query_one("#sequence-detail"))
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is dash

        label = seq["label"]
        await pilot.press("slash", *label, "enter")
        await settle(pilot)
        assert dash.page_map.filter == label
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == [f"#{second} {label}"]
        await pilot.press("slash", "backspace", "enter")  # the prompt starts with the filter selected
        await settle(pilot)
        assert dash.page_map.filter == "" and table.row_count > 1

        sorts = []
        for _ in range(4):
            await pilot.press("s")
            await pilot.pause()
            sorts.append(dash.page_map.sort)
        assert sorts == ["id", "tokens", "tok/s", "group"]
        await pilot.press("s", "s")
        await pilot.pause()
        tokens = [int(table.get_row_at(i)[3].plain) for i in range(table.row_count)]
        assert tokens == sorted(tokens, reverse=True)


async def test_history_reaches_back_over_the_polls_with_a_time_axis():
    source = ReplaySource(RECORDING)
    app = replay_app(len(source.polls) - 2)
    async with app.run_test(size=SIZE) as pilot:
        await two_polls(pilot)
        frame = app.dashboard.frame
        steps = frame.history.steps
        assert steps[-1]["timestamp"] - steps[0]["timestamp"] > 120  # over two minutes of decode steps
        assert app.screen.query_one("#history").border_subtitle == "the last 5:00 min, 5 s a point"


def test_history_buckets_and_restart():
    history = History(seconds=100)
    record = {"kind": "decode", "tokens": 4, "seconds": 0.01, "host_seconds": 0.004, "device_seconds": 0.006,
              "path": "cascade", "kv_bytes_flat": 1000, "kv_bytes_saved": 400}
    steps = [dict(record, step=i, timestamp=1000.0 + i, path="cascade" if i % 2 else "fused_v2")
             for i in range(1, 11)]
    history.update({"recent_steps": steps[:6], "timestamp": 1006.0})
    history.update({"recent_steps": steps[3:], "timestamp": 1010.0})  # overlapping polls count once
    assert [r["step"] for r in history.steps] == list(range(1, 11))
    buckets = history.buckets(1010.5, 5.0, 2)  # [1000.5, 1005.5), [1005.5, 1010.5)
    assert [b.steps for b in buckets] == [5, 5] and [b.cascade_steps for b in buckets] == [3, 2]
    assert buckets[0].tokens == 20 and buckets[1].kv_bytes_saved == 2000
    assert history.saved_per_second(1010.0, 5.0) == pytest.approx(5 * 400 / 5.0)
    history.update({"recent_steps": [dict(record, step=1, timestamp=2000.0)], "timestamp": 2000.0})
    assert [r["step"] for r in history.steps] == [1]  # another engine: its steps start again


async def test_a_recording_is_read_only():
    app = replay_app()
    async with app.run_test(size=SIZE) as pilot:
        await two_polls(pilot)
        dash = app.dashboard
        enabled = dash.frame.snapshot["cascade"]["enabled"]
        await pilot.press("c", "a", "p", "m")
        await settle(pilot)
        assert dash.check_action("toggle_cascade", ()) is None and not dash.can_control
        assert app.screen is dash  # m opened no prompt
        assert dash.frame.snapshot["cascade"]["enabled"] == enabled


def test_recorder_writes_what_replay_reads(tmp_path):
    """Each line carries only its new steps; replay rebuilds every snapshot whole."""
    _, polls = read_recording(RECORDING)
    path = tmp_path / "again.jsonl"
    recorder = Recorder(path, "test")
    for snap, metrics in polls[:40]:
        recorder.write(snap, metrics)
    recorder.close()
    described, again = read_recording(path)
    assert described == "test" and again == polls[:40]
    assert path.stat().st_size < sum(len(str(s)) for s, _ in polls[:40]) / 2  # steps are not repeated
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(SourceError, match="is not a mlxcel-tui recording"):
        ReplaySource(tmp_path / "bad.jsonl")
    with pytest.raises(SourceError, match="--start must be in"):
        ReplaySource(path, start=40)


GiB = 2**30


def shown_lines(widget) -> list[str]:
    """A widget's lines as they are on screen (cut to its width and height), less its padding."""
    return ["".join(segment.text for segment in strip).strip()
            for strip in widget.render_lines(Region(0, 0, *widget.outer_size))]


@pytest.mark.parametrize("size", ["200x50", "80x24"])
async def test_an_int8_engine_shows_its_page_format_in_the_header(loaded, size):
    """A real int8 engine: the pool line names the format, a page's bytes (2 x 4 layers x 16 tokens x 2 KV
    heads x (64 codes + a 2-byte scale) = 16.5 KiB) and the pages gained over float32's 64 KiB (3.88x);
    at the model's own dtype it says so. A recording from before these fields shows the pool as before."""
    for kv_dtype, wide, narrow in (
            ("int8", "int8 · 16.5 KiB/page (16 tokens) · 3.88x pages vs float32",
             "int8 · 16.5 KiB/page · 3.9x pages"),
            (None, "float32 · 64.0 KiB/page (16 tokens) · the model's dtype",
             "float32 · 64.0 KiB/page · model dtype")):
        engine = Engine(loaded, EngineConfig(block_size=16, num_blocks=64, kv_dtype=kv_dtype))
        prompt = synthetic_system_prompt(engine.tokenizer, 96, DEFAULT_SYSTEM_PROMPT)
        sessions = SessionManager(engine, prompt, list(DEFAULT_QUESTIONS), max_tokens=4)
        sessions.add(2)
        engine.run_until_idle(max_steps=3)
        app = live_app(engine, sessions)
        async with app.run_test(size=SIZES[size]) as pilot:
            await settle(pilot)
            pool_line = shown_lines(app.dashboard.query_one("#header"))[2]
            live = app.dashboard.frame.snapshot["pool"]["live"]
        engine.shutdown()
        assert pool_line.startswith("KV pool ") and live > 0
        if size == "200x50":
            assert f"{live}/64 live ({fmt.percent(live, 64)}) · {wide} · " in pool_line
            assert "/block" not in pool_line and pool_line.endswith(" evictions")   # said once; all of it fits
        else:   # cut to 80 columns, the format still shown
            assert f" · {narrow} · " in pool_line and len(pool_line) <= 80
    old = replay_app()
    async with old.run_test(size=SIZES[size]) as pilot:
        await two_polls(pilot)
        pool_line = shown_lines(old.dashboard.query_one("#header"))[2]
    assert pool_line.startswith("KV pool ") and "/page" not in pool_line
    assert ("64.0 KiB/block" in pool_line) == (size == "200x50")


@pytest.mark.parametrize("size", ["200x50", "80x24"])
async def test_a_tensor_parallel_engine_shows_its_ranks_in_the_header(size, tmp_path):
    """The recorded run as a two-rank engine would report it: EngineSnapshot's
    tensor_parallel as to_dict gives it, through the recording format (as the
    HTTP source sees it: JSON); the header gains one line and the rest keeps its place."""
    view = TensorParallelView(2, "nccl", (RankView(0, 2, int(1.2 * GiB), int(3.4 * GiB), int(4.0 * GiB)),
                                          RankView(1, 2, int(1.2 * GiB), int(2.9 * GiB), int(3.5 * GiB))))
    _, polls = read_recording(RECORDING)
    path = tmp_path / "tp.jsonl"
    recorder = Recorder(path, "a two-rank engine")
    for snap, metrics in polls:
        recorder.write({**snap, "tensor_parallel": asdict(view)}, metrics)
    recorder.close()
    source = ReplaySource(path, start=len(polls) - 2)
    assert source.polls[-1][0]["tensor_parallel"] == json.loads(json.dumps(asdict(view)))
    app = DashboardApp(source, refresh=3600, host=lambda snap: HOST)
    async with app.run_test(size=SIZES[size]) as pilot:
        await two_polls(pilot)
        header = app.dashboard.query_one("#header")
        lines = shown_lines(header)
        if size == "200x50":
            assert header.size.height == 5 and lines[3] == (
                "tensor parallel 2 ranks · nccl · each 2 KV heads, pool 1.2 GiB"
                " · r0 MLX 3.4 GiB (peak 4.0 GiB) · r1 MLX 2.9 GiB (peak 3.5 GiB)")
            assert lines[4].startswith("process RSS 300.0 MiB")
        else:  # the short form, whole at 80 columns; the process line is left out as without TP
            assert header.size.height == 4 and lines[3] == (
                "TP 2 ranks · nccl · pool 1.2 GiB each · r0 MLX 3.4 GiB · r1 MLX 2.9 GiB")
        assert lines[2].startswith("KV pool")
    unheard = asdict(view) | {"ranks": [asdict(RankView(1, 2, int(1.2 * GiB), 0, 0))]}
    assert str(tensor_parallel_line(unheard, wide=True)).endswith(" · r1 MLX n/a (peak n/a)")
    plain = replay_app()
    async with plain.run_test(size=SIZES[size]) as pilot:
        await two_polls(pilot)
        header = plain.dashboard.query_one("#header")
        assert not header.has_class("-tensor-parallel") and header.size.height == (4 if size == "200x50" else 3)
        assert not any(line.startswith(("TP ", "tensor parallel")) for line in shown_lines(header))


async def test_help_lists_every_key_of_the_one_table_and_any_key_closes_it():
    app = replay_app()
    async with app.run_test(size=SIZES["80x24"]) as pilot:
        await two_polls(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        keys = text_of(app.screen.query_one("#help-keys"))
        for binding in app.dashboard.BINDINGS:
            assert binding.tooltip.split(" (")[0] in keys
        await pilot.press("c")  # any key closes the help, and does nothing else
        await settle(pilot)
        assert app.screen is app.dashboard


@pytest.mark.parametrize("size", SIZES)
async def test_every_size_shows_the_map_rows_the_footer_and_the_cascade_state(size):
    app = replay_app()
    async with app.run_test(size=SIZES[size]) as pilot:
        await two_polls(pilot)
        dash = app.dashboard
        table = dash.query_one("#map-table", DataTable)
        assert table.size.height >= 5  # the header row and at least four sequences
        footer = dash.query_one("Footer")
        assert footer.region.bottom == SIZES[size][1] and footer.region.height == 1
        subgroups = dash.query_one("#subgroups")
        assert subgroups.region.height > 2 and subgroups.region.right <= SIZES[size][0]
        assert dash.has_class("-wide" if size == "200x50" else "-medium" if size == "100x30" else "-narrow")


async def test_fleet_shows_a_row_per_server_and_enter_opens_its_dashboard():
    sources = [ReplaySource(RECORDING, 30), ReplaySource(RECORDING, 130)]
    for snap, _ in sources[1].polls:   # b as an int8 server reports its pool; a as one from before the format
        snap["pool"] = {**snap["pool"], **INT8_POOL}
    app = FleetApp(sources, ["http://a:8000", "http://b:8000"], refresh=3600)
    async with app.run_test(size=SIZES["100x30"]) as pilot:
        await settle(pilot)
        table = app.screen.query_one("#fleet-table", DataTable)
        assert table.row_count == 2
        a, b = (table.get_row_at(i) for i in range(2))
        assert a[0] == "http://a:8000" and a[3].plain == "ON" and b[3].plain == "OFF"
        assert a[5].plain.endswith("%)") and b[5].plain.endswith("%) int8")
        assert a[1] == sources[0].polls[30][0]["model"]
        await pilot.press("j", "enter")
        await settle(pilot)
        assert type(app.screen).__name__ == "DashboardScreen" and app.screen.source is sources[1]
        assert app.screen.frame.snapshot["cascade"]["enabled"] is False
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is app.fleet


async def test_fleet_row_of_a_server_that_does_not_answer_says_why():
    class Unreachable(ReplaySource):
        def snapshot(self):
            raise SourceError("cannot reach http://127.0.0.1:9: connection refused")

    app = FleetApp([Unreachable(RECORDING), ReplaySource(RECORDING, 30)], ["down", "up"], refresh=3600)
    async with app.run_test(size=SIZES["100x30"]) as pilot:
        await settle(pilot)
        table = app.screen.query_one("#fleet-table", DataTable)
        assert "connection refused" in table.get_row_at(0)[7].plain
        assert table.get_row_at(1)[3].plain == "ON"


async def test_poll_errors_go_to_the_status_line():
    class Failing(ReplaySource):
        def snapshot(self):
            raise SourceError("cannot reach http://127.0.0.1:9: connection refused")

    app = DashboardApp(Failing(RECORDING), refresh=3600)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.is_running and app.dashboard.frame is None
        assert "poll failed: cannot reach http://127.0.0.1:9" in text_of(app.dashboard.query_one(StatusLine))


def test_a_replayed_switch_poll_says_the_next_step_plans():
    """The recording's poll right after cascade was switched on: the last decode step ran flat."""
    source = ReplaySource(RECORDING)
    i = poll_index(source, lambda s: s["cascade"]["enabled"])
    from mlxcel_tui.frame import pending_switch

    assert source.polls[i][0]["decline_reason"] == "cascade off"
    assert pending_switch(source.polls[i][0]) == "switched on: the next decode step plans"
    j = poll_index(source, lambda s: s["plan"] is not None)
    assert pending_switch(source.polls[j][0]) is None


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
        app = live_app(engine, sessions)
        async with app.run_test(size=SIZE) as pilot:
            for _ in range(12):                        # until every session is prefilled and decoding
                engine.step()
                if engine.snapshot.plan and len(engine.snapshot.plan.spans) == 3:
                    break
            await poll(pilot)
            plan = app.dashboard.frame.snapshot["plan"]
            assert sorted(s["depth"] for s in plan["spans"]) == [0, 1, 1]
            tree = text_of(app.screen.query_one(SubgroupsPanel))
            assert "3 spans in 1 group, 2 deep" in tree and "group 1: 4 seqs" in tree
            assert "measured decode steps: cascade" in tree and "ms a step" in tree
            assert tree.count("µs/layer (predicted)") == 3
            outer = next(s for s in plan["spans"] if s["depth"] == 0)
            assert f"pages 0–{outer['end']}" in tree
            legend = text_of(app.screen.query_one("#map-legend", Static))
            assert "by depth:" in legend
            table = app.screen.query_one(PageMap).query_one(DataTable)
            row = table.get_row(str(plan["spans"][1]["members"][0]))
            colours = {span.style for span in row[-1].spans}
            assert {span_colour(0), span_colour(1)} <= {str(c) for c in colours}
    finally:
        engine.shutdown()
