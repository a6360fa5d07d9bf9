"""A bad command line ends with one clear line and a non-zero status, never a
traceback (unless --debug asks for it)."""

from __future__ import annotations

import json
import socket
import subprocess

import psutil
import pytest
from cli_process import SCRIPTS, cli_env, kill_group, run_cli

from mlxcel_tui import cli


@pytest.fixture
def run_tui(monkeypatch, capsys):
    """Run `mlxcel-tui ARGS` in this process: (status, stderr lines)."""
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)  # keep pytest's handlers

    def run(*args: str) -> tuple[int, list[str]]:
        status = cli.run(cli.tui, list(args), "mlxcel-tui")
        return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]

    return run


def model_dir(tmp_path, config) -> str:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


@pytest.fixture
def busy_port():
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def assert_one_error_line(status, lines, *fragments):
    assert status != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: ") and "Traceback" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_model_directory(run_tui, tmp_path):
    status, lines = run_tui("serve", str(tmp_path / "nowhere"), "--headless", "--port", "0")
    assert_one_error_line(status, lines, "model directory not found", "nowhere")


@pytest.mark.parametrize("config, fragment", [
    ("{not json", "malformed"),
    ({"hidden_size": 64}, "malformed"),                   # no model_type
    ({"model_type": "gpt2"}, "'gpt2' is not supported"),
    ({"model_type": "llama"}, "could not load"),          # a supported type without weights
])
def test_malformed_or_unsupported_model_directory(run_tui, tmp_path, config, fragment):
    status, lines = run_tui("serve", model_dir(tmp_path, config), "--headless", "--port", "0")
    assert_one_error_line(status, lines, fragment)


def test_directory_without_config(run_tui, tmp_path):
    status, lines = run_tui("serve", str(tmp_path), "--headless", "--port", "0")
    assert_one_error_line(status, lines, "no config.json")


def test_port_in_use(run_tui, busy_port):
    status, lines = run_tui("serve", "--headless", "--port", str(busy_port))
    assert_one_error_line(status, lines, f"cannot listen on 127.0.0.1:{busy_port}", "in use")


@pytest.mark.parametrize("args, fragment", [
    (["--min-members", "1"], "'--min-members': 1 is not in the range x>=2"),
    (["--min-shared-pages", "0"], "'--min-shared-pages'"),
    (["--system-prompt", "/nonexistent/prompt.txt"], "'--system-prompt'"),
    (["--system-prompt", "/etc/hostname", "--shared-prefix-tokens", "8"], "not both"),
    (["--port", "70000"], "'--port'"),
    (["--port", "eighty"], "'--port'"),
    (["--max-prompt-tokens", "0"], "'--max-prompt-tokens'"),
    (["--max-body-bytes", "-1"], "'--max-body-bytes'"),
    (["--block-size", "0"], "'--block-size'"),
    (["--kv-blocks", "0"], "'--kv-blocks'"),
    (["--kv-dtype", "int3"], "Invalid value for '--kv-dtype': 'int3' is not one of 'auto', 'float32'"),
    (["--sessions", "-1"], "'--sessions'"),
    (["--bogus-option"], "No such option"),
    (["--host", "0.0.0.0"], "refusing to bind 0.0.0.0 without an API key"),
    (["--host", "192.0.2.1", "--api-key", ""], "refusing to bind"),
])
def test_bad_option_values(run_tui, args, fragment):
    status, lines = run_tui("serve", "--headless", *args)
    assert_one_error_line(status, lines, fragment)


def test_unknown_command(run_tui):
    status, lines = run_tui("frobnicate")
    assert_one_error_line(status, lines, "No such command")


def test_debug_shows_the_traceback(run_tui, tmp_path):
    status, lines = run_tui("serve", model_dir(tmp_path, {"model_type": "gpt2"}), "--debug", "--port", "0")
    assert status == 1
    text = "\n".join(lines)
    assert "Traceback (most recent call last)" in text and "ModelLoadError" in text
    assert lines[-1].startswith("Error: model type 'gpt2' is not supported")


def test_help_still_exits_zero(run_tui, capsys):
    assert cli.run(cli.tui, ["serve", "--help"], "mlxcel-tui") == 0
    help_text = capsys.readouterr().out
    assert "--max-prompt-tokens" in help_text and "--max-body-bytes" in help_text


# -- the real console scripts ---------------------------------------------------

def test_console_script_missing_model(mlxcel_home, tmp_path):
    done = run_cli("mlxcel-tui", ["serve", str(tmp_path / "nowhere"), "--headless"], cli_env(mlxcel_home))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "model directory not found" in lines[0], done.stderr


def test_console_script_port_in_use(mlxcel_home, busy_port):
    done = run_cli("mlxcel-tui", ["serve", "--headless", "--port", str(busy_port)], cli_env(mlxcel_home))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "cannot listen" in lines[0], done.stderr


def test_console_script_bad_option(mlxcel_home):
    done = run_cli("mlxcel-tui", ["serve", "--min-members", "1"], cli_env(mlxcel_home))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--min-members" in lines[0], done.stderr


def test_replay_and_record_refusals(run_tui, tmp_path):
    bad = tmp_path / "not-a-recording.jsonl"
    bad.write_text("hello\n")
    assert_one_error_line(*run_tui("replay", str(bad)), "cannot read the recording")
    record = ["--record", str(tmp_path / "r.jsonl")]
    status, lines = run_tui("attach", "http://127.0.0.1:9", "http://127.0.0.1:10", *record)
    assert status == 2 and "give one URL" in lines[-1]
    status, lines = run_tui("serve", "tiny", "--headless", *record)
    assert status == 2 and "needs the dashboard" in lines[-1]
    assert not (tmp_path / "r.jsonl").exists()  # refused before anything was written


# -- a KV page format the model cannot have ---------------------------------------

# Heads 48 wide: int8 pages store them, int4's 32-channel groups do not divide them.
HEAD_DIM_48 = dict(model_type="llama", num_layers=2, hidden_size=96, num_heads=2, num_kv_heads=2, head_dim=48,
                   intermediate_size=128, seed=7)


@pytest.fixture(scope="module")
def head_dim_48_model(mlxcel_home):
    from mlxcel.engine.random_model import ModelSpec, cached_random_model

    return str(cached_random_model("cli-test-head-dim-48", ModelSpec(**HEAD_DIM_48), mlxcel_home))


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def test_a_kv_format_the_head_dim_cannot_store_is_one_line_and_leaves_the_port_free(run_tui, head_dim_48_model):
    port = free_port()
    status, lines = run_tui("serve", head_dim_48_model, "--headless", "--port", str(port), "--kv-dtype", "int4")
    assert_one_error_line(status, lines, "int4 KV pages need a head dim divisible by 32, the model has 48")
    with socket.create_server(("127.0.0.1", port)):   # nothing holds it
        pass


def test_an_unknown_kv_dtype_from_the_environment_is_refused(run_tui, monkeypatch):
    monkeypatch.setenv("MLXCEL_KV_DTYPE", "fp8")
    status, lines = run_tui("serve", "tiny", "--headless", "--port", "0")
    assert_one_error_line(status, lines, "Invalid value for '--kv-dtype': 'fp8' is not one of")


def test_stats_run_refuses_the_format_as_serve_does(run_tui, head_dim_48_model, capsys):
    status = cli.run(cli.mlxcel, ["stats", "--run", head_dim_48_model, "--kv-dtype", "int4"], "mlxcel")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert_one_error_line(status, lines, "int4 KV pages need a head dim divisible by 32")


def test_a_kv_format_refused_on_rank_0_ends_every_rank(mlxcel_home, head_dim_48_model):
    """Two ranks start and load the model; rank 0 refuses the pool and calls
    the start off: one line with rank 0's error alone (rank 1, told, ends
    without one of its own), and no rank is left running."""
    args = [str(SCRIPTS / "mlxcel-tui"), "serve", head_dim_48_model, "--headless", "--port", "0", "--sessions", "0",
            "--tensor-parallel", "2", "--kv-dtype", "int4"]
    with subprocess.Popen(args, env=cli_env(mlxcel_home, MLXCEL_RANK_TIMEOUT="60"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            _, err = proc.communicate(timeout=120)
            # Looked for before anything is killed: what the launcher left behind (run_cli would kill it).
            left = [p for p in psutil.process_iter(["environ"]) if "MLX_RANK" in (p.info["environ"] or {})
                    and p.info["environ"].get("MLXCEL_HOME") == str(mlxcel_home)]
        finally:
            kill_group(proc)
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, err
    assert lines[0].startswith("Error: rank 0 exited with status 1")
    assert "(int4 KV pages need a head dim divisible by 32, the model has 48);" in lines[0]
    assert "the tensor-parallel run stopped" in lines[0]
    assert not left, [p.cmdline() for p in left]
