"""`mlxcel stats`: --run on the default model with cascade on and off, --url
against a live server, --watch redrawn on a terminal and JSON Lines piped,
structured JSON, units in the table, help for every option, and a clear
failure when the server is unreachable."""

from __future__ import annotations

import json
import socket

import click
import pytest
from click.testing import CliRunner
from serving import running_server

from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS
from mlxcel_tui import stats as stats_module
from mlxcel_tui.cli import mlxcel, tui

RUN = ["stats", "--run", "tiny", "--format", "json", "--sessions", "3", "--shared-prefix-tokens", "96",
       "--max-tokens", "6", "--min-shared-pages", "2"]


def metric(data: dict, name: str, **labels) -> float:
    """The one sample `name` with exactly these labels in `--format json`'s records."""
    [value] = [m["value"] for m in data["metrics"] if m["name"] == name and m["labels"] == labels]
    return value


def stats_json(*args: str) -> dict:
    result = CliRunner().invoke(mlxcel, [*RUN, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def runs(tiny_model_path):
    return {"on": stats_json("--cascade"), "off": stats_json("--no-cascade")}


def test_run_gives_the_same_tokens_with_cascade_on_and_off(runs):
    on, off = runs["on"]["sessions"], runs["off"]["sessions"]
    assert len(on) == len(off) == 3
    assert [s["completions"] for s in on] == [s["completions"] for s in off]
    assert all(len(s["completions"]) == 1 and 1 <= len(s["completions"][0]) <= 6 for s in on)
    assert any(len(set(s["completions"][0])) > 1 for s in on)  # equal, and not one token repeated


def test_cascade_counts_only_when_on(runs):
    name = "mlxcel_paged_decode_launches_total"
    assert metric(runs["on"], name, path="cascade") > 0
    assert metric(runs["off"], name, path="cascade") == 0
    assert metric(runs["off"], name, path="fused_v2") > 0
    assert all(set(m) == {"name", "labels", "value"} for m in runs["on"]["metrics"])


def test_run_reports_the_storage_figure_and_the_plan(runs):
    snap = runs["on"]["snapshot"]
    # Three sessions behind one 96-token prompt: the page tables name more
    # pages than the pool holds, the difference being the shared copy.
    assert snap["pool_blocks_shared"] >= 2
    assert snap["blocks_saved_by_sharing"] >= 2 * 2
    assert snap["prefix_cache"]["hits"] == 2
    assert snap["last_plan"] is None or snap["last_plan"]["members"] >= 2
    assert snap["tokens_per_second"] > 0


def test_run_on_int8_pages_says_the_format_its_bytes_and_the_pages_gained(tiny_model_path):
    """The tiny model (4 layers, 2 KV heads 64 wide, float32) on int8 pages of 32 tokens:
    2 x 4 x 32 x 2 x (64 codes + a 2-byte scale) bytes a page, 256 / 66 as many pages as float32."""
    data = stats_json("--kv-dtype", "int8")
    snap = data["snapshot"]
    page = 2 * 4 * 32 * 2 * (64 + 2)
    assert (snap["kv_dtype"], snap["model_dtype"], snap["pool_block_bytes"]) == ("int8", "float32", page)
    assert snap["model_dtype_block_bytes"] == 2 * 4 * 32 * 2 * 4 * 64
    assert snap["pages_vs_model_dtype"] == pytest.approx(256 / 66)
    assert metric(data, "mlxcel_kv_cache_page_bytes") == page
    assert snap["pool_blocks"] == 2**30 // page   # the default 1 GiB budget bought at int8's price
    assert any(len(set(s["completions"][0])) > 1 for s in data["sessions"])
    table = CliRunner().invoke(mlxcel, [*RUN[:-2], "--format", "table", "--kv-dtype", "int8"],
                               catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert "int8 · 33.0 KiB each, all layers · 3.88x the pages of float32 in the same bytes" in table.stdout
    assert "mlxcel_kv_cache_pages_vs_model_dtype_ratio" in table.stdout and "3.88x" in table.stdout


def test_url_reads_a_live_server(make_engine):
    engine = make_engine(enabled=True)
    engine.submit([5, 6, 7, 8], None)
    with running_server(engine) as (base, _):
        result = CliRunner().invoke(mlxcel, ["stats", "--url", base, "--format", "json"])
        prom = CliRunner().invoke(mlxcel, ["stats", "--url", base, "--format", "prometheus"])
        table = CliRunner().invoke(mlxcel, ["stats", "--url", base])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["snapshot"]["pool_blocks"] == engine.pool.num_blocks
    assert "mlxcel_paged_decode_launches_total" in prom.stdout and "# TYPE" in prom.stdout
    assert metric(data, "mlxcel_cache_pool_paged_blocks_allocated") == engine.pool.num_blocks
    assert "mlxcel_cache_pool_paged_blocks_allocated" in table.stdout
    block_mib = engine.pool.num_blocks * engine.pool.geometry.bytes_per_block / 2**20
    assert f"of {engine.pool.num_blocks} blocks used" in table.stdout and f"{block_mib:.1f} MiB" in table.stdout
    assert " ms" in table.stdout and "%" in table.stdout
    assert "MiB MLX buffer cache" in table.stdout and metric(data, "mlxcel_mlx_cache_memory_bytes") >= 0


def test_watch_writes_json_lines_when_piped_and_redraws_on_a_terminal(make_engine, monkeypatch):
    engine = make_engine()
    with running_server(engine) as (base, _):
        piped = CliRunner().invoke(mlxcel, ["stats", "--url", base, "--watch", "0.1", "--count", "3"])
        monkeypatch.setattr(stats_module, "_is_terminal", lambda: True)
        terminal = CliRunner().invoke(mlxcel, ["stats", "--url", base, "--watch", "0.1", "--count", "2"])
    assert piped.exit_code == 0, piped.output
    lines = piped.stdout.splitlines()
    assert len(lines) == 3
    readings = [json.loads(line) for line in lines]
    assert all(r["snapshot"]["pool_blocks"] == engine.pool.num_blocks for r in readings)
    assert readings[0]["time"] <= readings[1]["time"] <= readings[2]["time"]
    assert terminal.exit_code == 0, terminal.output
    frames = terminal.stdout.split(stats_module.REDRAW)
    assert frames[0] == "" and len(frames) == 3 and all("KV pool" in f for f in frames[1:])


def test_table_has_no_block_id_lists(runs, tiny_model_path):
    result = CliRunner().invoke(mlxcel, [*RUN[:-2], "--format", "table", "--min-shared-pages", "2"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "shared_blocks" not in result.stdout and "[" not in result.stdout.split("metrics")[0]
    assert "members sharing" in result.stdout or "none (" in result.stdout


def all_commands():
    yield from ((f"mlxcel {name}", command) for name, command in mlxcel.commands.items())
    yield from ((f"mlxcel-tui {name}", command) for name, command in tui.commands.items())


def test_every_option_has_help_and_the_readme_synopsis_lists_stats_options():
    from pathlib import Path

    for name, command in all_commands():
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help and param.help.strip(), (name, param.name)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    synopsis = readme[readme.index("mlxcel stats ("):readme.index("```", readme.index("mlxcel stats ("))]
    for param in mlxcel.commands["stats"].params:
        for opt in param.opts + param.secondary_opts:
            assert opt in synopsis, opt
    assert "_MLXCEL_COMPLETE=bash_source mlxcel" in readme and "_MLXCEL_TUI_COMPLETE" in readme


def test_unreachable_server_is_a_clear_nonzero_exit():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(mlxcel, ["stats", "--url", f"http://127.0.0.1:{port}"])
    assert result.exit_code != 0
    assert "cannot reach" in result.output


def test_url_and_run_are_exclusive():
    result = CliRunner().invoke(mlxcel, ["stats"])
    assert result.exit_code == 2 and "exactly one of --url" in result.output


def test_run_table_shows_each_sessions_latest_question_and_answer(runs):
    first = runs["on"]["sessions"][0]
    assert first["question"] in DEFAULT_QUESTIONS and first["answer"]
    result = CliRunner().invoke(mlxcel, [*RUN[:3], "--sessions", "2", "--max-tokens", "4", "--format", "table"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "latest question" in result.stdout and "latest answer" in result.stdout
    assert "session-1" in result.stdout and DEFAULT_QUESTIONS[0][:12] in result.stdout
