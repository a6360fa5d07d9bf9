"""A server this benchmark starts itself: `mlxcel-tui serve --headless
--sessions 0 --port 0` from this very build, its log in a file, its URL read
from the line it prints once listening, ready when /health answers; stopped
with SIGINT (uvicorn's graceful shutdown), then SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

LISTENING = re.compile(r"serving \S+ on (http://\S+)")


class ServerStartError(RuntimeError):
    """The server exited or never answered; the message carries its log's tail."""


def serve_command(model: str, server_args: list[str]) -> list[str]:
    executable = Path(sys.executable).with_name("mlxcel-tui")
    return [str(executable), "serve", model,
            "--headless", "--sessions", "0", "--port", "0", *server_args]


class ManagedServer:
    def __init__(self, name: str, model: str, server_args: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.command = serve_command(model, server_args)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.url: str | None = None

    def __enter__(self) -> "ManagedServer":
        self.launch()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def launch(self) -> None:
        """Start the process; wait_ready() then waits for it (start several, then wait)."""
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 600.0) -> str:
        deadline = time.monotonic() + timeout
        while self.url is None:
            self._check_alive()
            match = LISTENING.search(self.log_tail(200))
            if match:
                self.url = match.group(1)
            elif time.monotonic() > deadline:
                raise ServerStartError(f"{self.name}: no listening line after {timeout:.0f} s\n{self.log_tail()}")
            else:
                time.sleep(0.2)
        while True:
            self._check_alive()
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name}: /health never answered\n{self.log_tail()}")
            time.sleep(0.2)

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ServerStartError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            self.process.send_signal(sig)
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
