"""The real console scripts in a subprocess, as a user runs them."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPTS = Path(sys.executable).parent
SERVING_LINE = re.compile(r"serving \S+ on (http://\S+)")


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}
    return env | {"MLXCEL_HOME": str(home), "MLXCEL_OPENBLAS": "0", "HF_HUB_OFFLINE": "1"} | extra


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a script started in a session of its own with everything below it (a tensor-parallel run's
    mlx.launch and ranks outlive a killed launcher)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_cli(script: str, args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    with subprocess.Popen([str(SCRIPTS / script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.communicate()
            raise
        finally:
            kill_group(proc)    # what it left running, if anything
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class ServeProcess:
    """`mlxcel-tui serve --headless ...` running; `url` once it says where it serves."""

    def __init__(self, args: list[str], env: dict[str, str], timeout: float = 60, preexec_fn=None) -> None:
        self.proc = subprocess.Popen([str(SCRIPTS / "mlxcel-tui"), "serve", "--headless", *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=preexec_fn, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_for_url(timeout)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                match = SERVING_LINE.search(self.lines.get(timeout=0.2))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if match:
                return match.group(1)
        self.kill()
        raise RuntimeError("serve did not start:\n" + "".join(self.stderr))

    def wait(self, timeout: float) -> int:
        """The exit status, once the lines it wrote last are in ``stderr`` too."""
        status = self.proc.wait(timeout)
        self._reader.join(5)
        return status

    def kill(self) -> None:
        kill_group(self.proc)
        self.proc.wait(10)
