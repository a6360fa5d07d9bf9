"""`serve --max-prompt-tokens/--max-body-bytes` reach the server's limits;
`--kv-cache-mb` with `--kv-dtype` sizes the pool by the bytes its pages take."""

from __future__ import annotations

import pytest

from mlxcel.engine.limits import ServerLimits
from mlxcel_tui import cli


def serve_and_capture(monkeypatch, *args: str, pool: tuple[str, ...] = ("--kv-blocks", "8")):
    """Run `serve ARGS` in process up to the point it would serve; return the server."""
    captured = []

    def instead_of_serving(engine, server, uv, uv_socket):
        captured.append(server)
        engine.shutdown()

    monkeypatch.setattr(cli, "configure_logging", lambda *a, **k: None)
    monkeypatch.setattr(cli, "run_server", instead_of_serving)
    status = cli.run(cli.tui, ["serve", "tiny", "--headless", "--port", "0", "--sessions", "0", *pool, *args],
                     "mlxcel-tui")
    assert status == 0 and len(captured) == 1
    return captured[0]


def test_limits_come_from_the_command_line(monkeypatch, tiny_model_path):
    server = serve_and_capture(monkeypatch, "--max-prompt-tokens", "9", "--max-body-bytes", "2048")
    assert (server.limits.max_prompt_tokens, server.limits.max_body_bytes) == (9, 2048)


def test_limits_default_to_the_server_defaults(monkeypatch, tiny_model_path):
    server = serve_and_capture(monkeypatch)
    assert server.limits == ServerLimits()


# The tiny model: 4 layers, 2 KV heads 64 wide, float32 on the CPU; pages of 32 tokens.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 64, 32
# Bytes of one token's K (or V) in one head, from each format's definition: float elements; int8 codes and
# one float16 scale; int4 codes two a byte and a float16 scale and zero per 32 channels.
TOKEN_BYTES = {"auto": 4 * HEAD_DIM, "float32": 4 * HEAD_DIM, "float16": 2 * HEAD_DIM, "bfloat16": 2 * HEAD_DIM,
               "int8": HEAD_DIM + 2, "int4": HEAD_DIM // 2 + HEAD_DIM // 32 * 2 * 2}


@pytest.mark.parametrize("kv_dtype", list(TOKEN_BYTES))
def test_the_byte_budget_buys_pages_at_what_they_take_scales_included(monkeypatch, tiny_model_path, kv_dtype):
    budget = 3 * 2**20
    engine = serve_and_capture(monkeypatch, "--kv-dtype", kv_dtype, pool=("--kv-cache-mb", "3")).engine
    page = 2 * LAYERS * BLOCK * KV_HEADS * TOKEN_BYTES[kv_dtype]
    pool = engine.pool
    assert pool.geometry.kv_dtype == ("float32" if kv_dtype == "auto" else kv_dtype)
    assert pool.num_blocks == budget // page and pool.geometry.bytes_per_block == page
    allocated = sum(layer.nbytes for layer in [*pool.keys, *pool.values])   # codes, scales and zeros
    assert allocated == pool.num_blocks * page and budget - page < allocated <= budget
    assert engine.snapshot.pool.model_dtype_bytes_per_block == 2 * LAYERS * BLOCK * KV_HEADS * 4 * HEAD_DIM
