"""`serve --max-prompt-tokens/--max-body-bytes` reach the server's limits."""

from __future__ import annotations

from mlxcel.engine.limits import ServerLimits
from mlxcel_tui import cli


def serve_and_capture(monkeypatch, *args: str):
    """Run `serve ARGS` in process up to the point it would serve; return the server."""
    captured = []

    def instead_of_serving(engine, server, uv, uv_socket):
        captured.append(server)
        engine.shutdown()

    monkeypatch.setattr(cli, "configure_logging", lambda *a, **k: None)
    monkeypatch.setattr(cli, "run_server", instead_of_serving)
    status = cli.run(cli.tui, ["serve", "tiny", "--headless", "--port", "0", "--sessions", "0", "--kv-blocks", "8", *args],
                     "mlxcel-tui")
    assert status == 0 and len(captured) == 1
    return captured[0]


def test_limits_come_from_the_command_line(monkeypatch, tiny_model_path):
    server = serve_and_capture(monkeypatch, "--max-prompt-tokens", "9", "--max-body-bytes", "2048")
    assert (server.limits.max_prompt_tokens, server.limits.max_body_bytes) == (9, 2048)


def test_limits_default_to_the_server_defaults(monkeypatch, tiny_model_path):
    server = serve_and_capture(monkeypatch)
    assert server.limits == ServerLimits()
