"""Tensor-parallel serving on two ranks of the ring backend (this CPU): the
same tokens and per-step logits as one device, the launcher's errors, a rank
that dies or hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from cli_process import SCRIPTS, ServeProcess, cli_env, run_cli

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(__file__).with_name("tp_workload.py")

SMALL_LLAMA = dict(model_type="llama", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32,
                   intermediate_size=256, seed=5, init_std=0.1)


@pytest.fixture(scope="module")
def llama_model_path(mlxcel_home):
    from mlxcel.engine.random_model import ModelSpec, cached_random_model

    return cached_random_model("tp-test-llama", ModelSpec(**SMALL_LLAMA), mlxcel_home)


def run_ranks(model: Path, out: Path, env: dict[str, str]) -> None:
    from mlxcel_tui.launch import free_ports

    command = [str(SCRIPTS / "mlx.launch"), "--backend", "ring", "-n", "2", "-p", str(free_ports(2)),
               "--python", sys.executable, "--", str(WORKLOAD), str(model), str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.exists(), done.stdout + done.stderr


# The llama run traces the layers' halves (a GPU's default: all_sum inside mx.compile), on both sides.
@pytest.mark.parametrize("family, traced", [("llama", "on"), ("qwen3", "off")])
def test_two_ranks_match_one_device(family, traced, llama_model_path, tiny_model_path, tmp_path, mlxcel_home,
                                    monkeypatch):
    """Greedy tokens equal and every step's logits equal up to the reordered
    float32 sums of the sharded matmuls (all_sum adds two partial products:
    a few ulps of logits ~10 in size, so 1e-4 absolute), through cascade on,
    off and on again, preemptions and a cancel."""
    sys.path.insert(0, str(WORKLOAD.parent))
    import tp_workload

    model = llama_model_path if family == "llama" else tiny_model_path
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    monkeypatch.setenv("MLXCEL_TRACED_LAYERS", traced)
    tp_workload.run(str(model), str(one))
    run_ranks(model, two, cli_env(mlxcel_home, MLXCEL_RANK_TIMEOUT="60", MLXCEL_TRACED_LAYERS=traced))
    a, b = np.load(one), np.load(two)
    assert int(a["tensor_parallel"]) == 1 and int(b["tensor_parallel"]) == 2
    # The run exercised what it claims: cascade launches, preemptions, the cancel, tokens that vary.
    assert int(b["cascade_launches"]) > 0 and int(b["preemptions"]) > 0
    assert b["finish_reasons"][1] == "cancelled" and set(b["finish_reasons"]) == {"cancelled", "length"}
    assert len(np.unique(b["completions"][b["completions"] >= 0])) > 5
    np.testing.assert_array_equal(a["completions"], b["completions"])
    for key in ("steps", "cascade_launches", "preemptions"):
        assert int(a[key]) == int(b[key]), key
    for step in range(int(a["steps"])):
        np.testing.assert_allclose(b[f"logits_{step}"], a[f"logits_{step}"], rtol=0, atol=1e-4,
                                   err_msg=f"step {step}")


def test_step_inputs_round_trip():
    from mlxcel.engine.config import CascadeSettings
    from mlxcel.engine.step_inputs import StepInputs

    rng = np.random.default_rng(0)
    tables = tuple(tuple(int(b) for b in rng.integers(0, 500, rng.integers(1, 9))) for _ in range(5))
    for prefill in (None, (3, 4, 5)):
        inputs = StepInputs(tuple((int(i), int(v)) for i, v in rng.integers(0, 99, (5, 2))), tables,
                            tuple(int(p) for p in rng.integers(0, 30, 5)), prefill, 2 if prefill else 0,
                            9 if prefill else 0, (7, 8, 9, 10, 11, 12, 13) if prefill else (), prefill is not None,
                            CascadeSettings(True, 3, 2, 7))
        assert StepInputs.unpack(inputs.pack()) == inputs
    with pytest.raises(ValueError, match="disagree"):
        StepInputs.unpack(np.concatenate([inputs.pack(), [1]]))


def test_impossible_split_fails_before_anything_starts(mlxcel_home):
    """The tiny model's 2 KV heads do not split 3 ways: one line, nothing bound, no rank started."""
    env = cli_env(mlxcel_home)
    done = run_cli("mlxcel-tui", ["serve", "tiny", "--headless", "--port", "0", "--tensor-parallel", "3"], env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: mlxcel-tiny-qwen3 cannot be split over 3 ranks: its 8 attention heads do not divide by 3"]


def rank_process(server: ServeProcess, rank: int) -> psutil.Process:
    for proc in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if proc.environ().get("MLX_RANK") == str(rank):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no rank {rank} under the server")


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_lost_rank_ends_the_server_with_one_error(fault, mlxcel_home):
    """A streaming request is under way when rank 1 is killed (its connection
    closes; at the default rank timeout: mlx.launch stops rank 0, which gives
    the ranks 2 s more) or stopped (it answers nothing: a 2 s rank timeout): the
    client's stream ends cleanly, the server ends within seconds, its last line
    says what happened."""
    env = cli_env(mlxcel_home, **({"MLXCEL_RANK_TIMEOUT": "2"} if fault == "hung" else {}))
    server = ServeProcess(["tiny", "--port", "0", "--sessions", "0", "--tensor-parallel", "2"], env, timeout=120)
    try:
        body = {"model": "mlxcel-tiny-qwen3", "prompt": "Hello there", "max_tokens": 4000, "stream": True,
                "ignore_eos": True}
        chunks = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            chunks.append(next(lines))
            follower = rank_process(server, 1)
            follower.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
            lost = time.monotonic()
            chunks.extend(lines)
        assert chunks[-1] == "data: [DONE]" or '"finish_reason":"error"' in "".join(chunks).replace(" ", "")
        status = server.wait(timeout=20)
        elapsed = time.monotonic() - lost
        assert status == 1 and elapsed < 15
        last = "".join(server.stderr).strip().splitlines()[-1]
        assert last.startswith("Error: ") and "the tensor-parallel run stopped" in last
        if fault == "killed":
            # Rank 0 sees the loss either as the ring's closed connection (caught mid-send) or, waiting in a
            # collective the ring never ends, as the watchdog's timeout: which depends on where it was.
            assert "rank 1 exited with status -9" in last
            assert "no answer from the other ranks for 2 s" in last or "connection to a peer was lost" in last
        else:
            assert "no answer from the other ranks for 2 s" in last
    finally:
        if fault == "hung":
            try:
                follower.send_signal(signal.SIGKILL)
            except (psutil.Error, NameError):
                pass
        server.kill()


def test_a_killed_launcher_takes_its_ranks_with_it(mlxcel_home):
    """`kill -9` of the process a user started (not its process group): mlx.launch dies with it and every
    rank notices its launcher is gone, so nothing is left serving or holding the port."""
    server = ServeProcess(["tiny", "--port", "0", "--sessions", "0", "--tensor-parallel", "2"], cli_env(mlxcel_home),
                          timeout=120)
    try:
        below = psutil.Process(server.proc.pid).children(recursive=True)   # mlx.launch and the two ranks
        assert len(below) == 3
        server.proc.kill()                       # the launcher alone
        server.proc.wait(10)
        gone, alive = psutil.wait_procs(below, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        server.kill()


def test_stats_run_headless_on_two_ranks(mlxcel_home):
    env = cli_env(mlxcel_home, MLXCEL_RANK_TIMEOUT="120")   # about the output: no fault on a loaded machine
    done = run_cli("mlxcel", ["stats", "--run", "tiny", "--tensor-parallel", "2", "--sessions", "2",
                              "--max-tokens", "4", "--format", "json", "--kv-dtype", "int8"], env, timeout=180)
    assert done.returncode == 0, done.stderr
    import json

    out = json.loads(done.stdout)
    tp = out["snapshot"]["tensor_parallel"]
    assert tp["size"] == 2 and tp["backend"] == "ring" and [r["rank"] for r in tp["ranks"]] == [0, 1]
    assert all(r["kv_heads"] == 1 and r["active_memory_bytes"] > 0 for r in tp["ranks"])
    # Rank 0's int8 pool format reached rank 1 (PoolFacts): its pool of the same blocks takes as many bytes
    # (1 GiB by default; float32 pages would take 3.9x that), so the two ranks hold about as much memory.
    page = 2 * 4 * 32 * 1 * (64 + 2)   # one KV head a rank
    assert out["snapshot"]["kv_dtype"] == "int8" and out["snapshot"]["pool_block_bytes"] == page
    active = [r["active_memory_bytes"] for r in tp["ranks"]]
    assert max(active) < 1.5 * min(active), active
    metrics = {(m["name"], tuple(sorted(m["labels"].items()))): m["value"] for m in out["metrics"]}
    assert all(metrics[("mlxcel_rank_mlx_active_memory_bytes", (("rank", r),))] > 0 for r in ("0", "1"))
    assert metrics[("mlxcel_completion_tokens_total", ())] == 8


async def test_the_dashboard_attached_to_a_two_rank_server_shows_the_ranks(mlxcel_home):
    """How a user sees a tensor-parallel server: rank 0 serves headless, the
    dashboard attaches over HTTP and its header names both ranks."""
    from dashboard_helpers import settle
    from mlxcel_tui.app import DashboardApp
    from mlxcel_tui.panels import format as fmt
    from mlxcel_tui.source import HttpSource

    # A long rank timeout: this test is about what the dashboard shows, not a rank slowed by a loaded machine.
    server = ServeProcess(["tiny", "--port", "0", "--sessions", "0", "--tensor-parallel", "2"],
                          cli_env(mlxcel_home, MLXCEL_RANK_TIMEOUT="120"), timeout=120)
    try:
        app = DashboardApp(HttpSource(server.url, timeout=60), url=server.url, refresh=3600)
        async with app.run_test(size=(200, 50)) as pilot:
            await settle(pilot)
            header = app.dashboard.query_one("#header")
            assert header.has_class("-tensor-parallel") and "tensor parallel 2 ranks · ring · each 1 KV heads" in \
                str(header.render())
            deadline = time.monotonic() + 60   # each rank's memory comes with the ranks' next message
            while not all(r["active_memory_bytes"] for r in app.dashboard.frame.snapshot["tensor_parallel"]["ranks"]) \
                    and time.monotonic() < deadline:
                await pilot.pause(0.5)
                await pilot.press("r")
                await settle(pilot)
            assert app.dashboard.poll_error is None, "".join(server.stderr)
            tp = app.dashboard.frame.snapshot["tensor_parallel"]
            assert [r["rank"] for r in tp["ranks"]] == [0, 1] and all(r["active_memory_bytes"] > 0 for r in tp["ranks"])
            text = str(header.render())
            for r in tp["ranks"]:
                assert f" · r{r['rank']} MLX {fmt.size(r['active_memory_bytes'])} (peak " in text
    finally:
        server.kill()


def test_the_failure_line_names_the_ranks_in_rank_order():
    # The launcher reports the ranks' ends as it sees them; a failed rank 0 often shows after rank 1, whose
    # collective broke because of it.
    from mlxcel_tui.launch import Ranks

    ranks = Ranks(process=None, on_line=lambda line: None,
                  ended=["rank 1 exited with status 1", "rank 0 exited with status 1"], errors=["no pool"])
    assert ranks.failure() == ("rank 0 exited with status 1; rank 1 exited with status 1 (no pool); "
                               "the tensor-parallel run stopped")


def test_a_ranks_error_that_lands_inside_a_launcher_warning_is_still_its_error():
    # mlx.launch writes "[WARN]" and the warning's text apart, from another thread than the ranks' output:
    # rank 0's error line can land between them (seen on a loaded machine).
    from mlxcel_tui.launch import Ranks

    class Launcher:
        stderr = ["\x1b[33m[WARN]Error: int4 KV pages need a head dim divisible by 32\n",
                  " Node with rank 0 exited with code 1 \x1b[0m\n",
                  "Error: rank 1 lost rank 0\n", "\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m\n"]

        def wait(self):
            return 1

    passed = []
    ranks = Ranks(process=Launcher(), on_line=passed.append)
    ranks.read()
    assert passed == []
    assert ranks.failure() == ("rank 0 exited with status 1; rank 1 exited with status 1 (int4 KV pages need a head "
                               "dim divisible by 32; rank 1 lost rank 0); the tensor-parallel run stopped")


def test_the_rings_socket_messages_in_pieces_are_dropped_around_a_ranks_lines():
    # The ring backend writes "[ring] Socket 4 was closed by the peer" word by word: a read of rank 1's output can
    # end inside it, and rank 0's error or the launcher's exit note land there (seen under load).
    from mlxcel_tui.launch import Ranks

    class Launcher:
        stderr = ["[ring] Socket 4Error: int4 KV pages need a head dim divisible by 32\n",
                  " was closed by the peer\n",
                  "[ring] Socket\x1b[33m[WARN] Node with rank 0 exited with code 1 \x1b[0m\n", " 4 was closed by the peer\n",
                  "[ring] Receiving from socket 5 failed with errno 104\n", "[ring] Too many send/recv errors. Aborting...\n",
                  "\x1b[33m[WARN] Error: rank 1 of 2: [ring] connection to a peer was lost\n",
                  " Node with rank 1 exited with code 3 \x1b[0m\n",
                  "  File \"x.py\", line 3: Socket 8000 in use\n"]

        def wait(self):
            return 1

    passed = []
    ranks = Ranks(process=Launcher(), on_line=passed.append)
    ranks.read()
    assert passed == ["  File \"x.py\", line 3: Socket 8000 in use"]   # a rank's own line, indented, kept whole
    assert ranks.failure() == ("rank 0 exited with status 1; rank 1 exited with status 3 (int4 KV pages need a head "
                               "dim divisible by 32; rank 1 of 2: [ring] connection to a peer was lost); the "
                               "tensor-parallel run stopped")


class Fault(Exception):
    pass


@pytest.fixture
def rank_1_of_2(monkeypatch):
    """Rank 1 of two as Ranks sees it, its start gather answered with rank 0's row given (and its own), its faults
    raised here instead of ending the process."""
    import mlx.core as mx
    from mlxcel.engine import tensor_parallel as tp

    ranks = tp.Ranks(mx.distributed.init(), "ring", 5.0)
    ranks.rank, ranks.size = 1, 2

    def answer(rank_0_row):
        gathered = lambda mine, group: mx.concatenate([mx.array([rank_0_row], dtype=mx.int32), mine])
        monkeypatch.setattr(tp.mx.distributed, "all_gather", gathered)

    def fault(message):
        raise Fault(message)

    monkeypatch.setattr(ranks, "fault", fault)
    return ranks, answer


FACTS = (2, 4, 2, 32, 512)


def test_the_start_gives_every_rank_rank_0s_pool(rank_1_of_2):
    from mlxcel.engine.tensor_parallel import POOL_DTYPES, START_MARK, PoolFacts

    ranks, answer = rank_1_of_2
    answer([START_MARK, 0, *FACTS, 300, 32, POOL_DTYPES.index("int8")])
    assert ranks.share_pool(FACTS, None) == PoolFacts(300, 32, "int8")


def test_a_start_rank_0_called_off_ends_the_others_without_an_error(rank_1_of_2):
    from mlxcel.engine.tensor_parallel import CALLED_OFF, START_MARK

    ranks, answer = rank_1_of_2
    answer([START_MARK, 0, *FACTS, 0, 0, CALLED_OFF])
    assert ranks.share_pool(FACTS, None) is None


def test_rank_0_gone_mid_start_is_a_fault_not_another_model(rank_1_of_2):
    # MLX 0.32's ring gather can return a closed peer's row unwritten instead of failing (these words were seen).
    ranks, answer = rank_1_of_2
    answer([0, 0, -1129699184, 32746, 0, 0, 0, 0, 0, 0])
    with pytest.raises(Fault, match="^rank 1 of 2: rank 0 ended before every rank loaded the model$"):
        ranks.share_pool(FACTS, None)


def test_a_rank_with_another_model_is_refused(rank_1_of_2):
    from mlxcel.engine.tensor_parallel import START_MARK, RankError

    ranks, answer = rank_1_of_2
    answer([START_MARK, 0, 2, 4, 2, 64, 512, 300, 32, 0])
    with pytest.raises(RankError, match=r"rank 1 loaded a model of another shape than rank 0's \(\[2, 4, 2, 32, 512\] "
                                        r"against \[2, 4, 2, 64, 512\]\)"):
        ranks.share_pool(FACTS, None)
