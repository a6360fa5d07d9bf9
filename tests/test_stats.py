"""`mlxcel stats`: --run on the default model with cascade on and off, --url
against a live server, and a clear failure when the server is unreachable."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner
from serving import running_server

from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS
from mlxcel_tui.cli import mlxcel

RUN = ["stats", "--run", "tiny", "--format", "json", "--sessions", "3", "--shared-prefix-tokens", "96",
       "--max-tokens", "6", "--min-shared-pages", "2"]


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
    key = 'mlxcel_paged_decode_launches_total{path="cascade"}'
    assert runs["on"][key] > 0
    assert runs["off"][key] == 0
    assert runs["off"]['mlxcel_paged_decode_launches_total{path="fused_v2"}'] > 0


def test_run_reports_the_storage_figure_and_the_plan(runs):
    snap = runs["on"]["snapshot"]
    # Three sessions behind one 96-token prompt: the page tables name more
    # pages than the pool holds, the difference being the shared copy.
    assert snap["pool_blocks_shared"] >= 2
    assert snap["blocks_saved_by_sharing"] >= 2 * 2
    assert snap["prefix_cache"]["hits"] == 2
    assert snap["last_plan"] is None or len(snap["last_plan"]["members"]) >= 2
    assert snap["tokens_per_second"] > 0


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
    assert "mlxcel_cache_pool_paged_blocks_allocated" in table.stdout


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
