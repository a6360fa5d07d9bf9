"""`--tensor-parallel N` on this machine: the same command again as N ranks
under ``mlx.launch`` (MLX's own launcher: ring over TCP on the CPU, NCCL where
CUDA is the device), this process watching them.

The launcher's output passes through, except its per-rank exit notes and the
ring's socket chatter (whole or in pieces): when a rank ends badly this
process says so in one line (with the rank's own error, if it printed one)
and exits 1.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
from dataclasses import dataclass, field
from typing import Callable

from mlxcel.engine.tensor_parallel import BACKEND_ENV, RANKS_ENV

LAUNCHER = "from mlx._distributed_utils.launch import main; main()"
ENTRY = {"mlxcel-tui": "tui_main", "mlxcel": "mlxcel_main"}
RANK_ENDED = re.compile(r"Node with rank (\d+) (exited with code (-?\d+)|was killed)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The launcher prints a warning's tag and its text in separate writes, and the ring backend its socket messages
# word by word ("[ring]", "Socket", "4", ...), while another thread passes the ranks' output on in whatever
# pieces it read: a rank's line can land inside either, and the rest of the message end up a line of its own.
WARNING_TAG = re.compile(r"^\[WARN\](?: ?(?=Error: )|(?=\S)|\s*$)")   # bare, or before a rank's line
RING_WORDS = re.compile(r"\[ring\]|Socket|(?:Receiving from|Sending to) socket|was closed by the peer|"
                        r"failed with errno|Too many send/recv errors\. Aborting\.\.\.|connection to a peer was lost")
RING_NUMBERS = re.compile(r"^[\s\d]*")   # a socket's number or an errno, left at the start once the words are out
FAILED_GRACE = 5.0  # seconds mlx.launch gets to end the other ranks once rank 0 ended badly
# Seconds rank 0 gets once another rank failed: mlx.launch asks it to stop, and it first tells its clients (a
# step waiting on the lost rank is a fault after tensor_parallel.STOPPING_TIMEOUT, whose error streams out).
LEADER_GRACE = 15.0
PR_SET_PDEATHSIG = 1     # prctl(2)
STOP_GRACE = 20.0   # seconds the ranks get to stop after an interrupt before they are killed


def launch_command(prog: str, args: list[str], ranks: int, backend: str) -> list[str]:
    """mlx.launch running ``prog args`` as ``ranks`` ranks on this machine, on
    free ports (its defaults would collide with a second launch)."""
    entry = f"from mlxcel_tui.cli import {ENTRY[prog]}; {ENTRY[prog]}()"
    ports = ["--nccl-port", str(free_ports(1))] if backend == "nccl" else ["--starting-port", str(free_ports(ranks))]
    return [sys.executable, "-c", LAUNCHER, "--backend", backend, "-n", str(ranks), *ports, "--",
            sys.executable, "-c", entry, *args]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on the loopback now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count <= 65535 and all(_free(port) for port in range(first, first + count)):
            return first
    raise OSError(f"found no {count} consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rank_env(ranks: int, backend: str) -> dict[str, str]:
    env = dict(os.environ)
    env[RANKS_ENV], env[BACKEND_ENV] = str(ranks), backend
    env.setdefault("NCCL_NVLS_ENABLE", "0")   # NVLink multicast off (see the device notes)
    return env


@dataclass
class Ranks:
    """The launched ranks: their launcher process and what their output said."""

    process: subprocess.Popen
    on_line: Callable[[str], None]
    ended: list[str] = field(default_factory=list)    # "rank 1 was killed", ...
    errors: list[str] = field(default_factory=list)   # the ranks' own "Error: ..." lines
    url: str | None = None
    url_known: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def read(self) -> None:
        """Follow the launcher's stderr until it ends (a thread's work)."""
        for raw in self.process.stderr:
            line = ANSI.sub("", raw.rstrip("\n"))
            for ended in RANK_ENDED.finditer(line):
                code = ended.group(3)
                if code != "0":
                    self.ended.append(f"rank {ended.group(1)} "
                                      + ("was killed" if code is None else f"exited with status {code}"))
            line = without_chatter(line)
            if not line.strip():
                continue
            if line.startswith("Error: "):
                self.errors.append(line.removeprefix("Error: "))
                continue
            serving = re.search(r"mlxcel: serving .* on (\S+)", line)
            if serving:
                self.url = serving.group(1)
                self.url_known.set()
            self.on_line(line)
        self.process.wait()
        self.url_known.set()

    def interrupt(self) -> None:
        """Ask every rank to stop, as Ctrl-C would (rank 0 ends its requests and
        tells the others). Not the launcher itself: it would die with a traceback."""
        try:
            for rank in psutil.Process(self.process.pid).children():
                rank.send_signal(signal.SIGINT)
        except psutil.NoSuchProcess:
            pass

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def leader_ended(self) -> bool:
        return any(e.startswith("rank 0 ") for e in self.ended)

    def failure(self) -> str | None:
        """One line for a run whose ranks did not all end well, else None."""
        if not self.ended and not self.errors:
            return None
        # By rank, not by when the launcher saw each end: a rank that fails makes the others' collectives fail
        # too, in whichever order (rank 0 decides, so its end comes first).
        what = "; ".join(sorted(self.ended, key=lambda e: int(e.split()[1]))) if self.ended else "a rank failed"
        cause = f" ({'; '.join(self.errors)})" if self.errors else ""
        return f"{what}{cause}; the tensor-parallel run stopped"


def without_chatter(line: str) -> str:
    """A line of the launcher's stderr less its exit notes, its warning tag and
    the ring's socket messages: what a rank wrote, if anything."""
    # A rank's error is kept whole from its "Error: " on: its message can quote the ring's own.
    head, error, tail = RANK_ENDED.sub("", line).partition("Error: ")
    rest = RING_NUMBERS.sub("", RING_WORDS.sub("", head))
    if "[ring]" in head or not rest.strip():
        head = rest
    return WARNING_TAG.sub("", head + error + tail)


def die_with_parent() -> None:
    """In mlx.launch's process, before it runs: on Linux the kernel kills it when
    this launcher dies (else it and its ranks would outlive a killed launcher;
    each rank ends when mlx.launch does)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):   # not Linux: the ranks end when a peer or rank 0's messages stop
        pass


def start(prog: str, args: list[str], ranks: int, backend: str, on_line: Callable[[str], None]) -> Ranks:
    """Start the ranks in a session of their own (so an interrupt reaches them
    only through ``interrupt``), their output followed on a thread."""
    process = subprocess.Popen(launch_command(prog, args, ranks, backend), env=rank_env(ranks, backend),
                               stdin=subprocess.PIPE,   # mlx.launch polls its stdin: never /dev/null (always ready)
                               stdout=None, stderr=subprocess.PIPE, text=True, errors="replace",
                               start_new_session=True, preexec_fn=die_with_parent)
    launched = Ranks(process, on_line)
    launched.reader = threading.Thread(target=launched.read, name="mlxcel-ranks-output", daemon=True)
    launched.reader.start()
    return launched


def run_to_end(launched: Ranks) -> None:
    """Wait for the ranks; Ctrl-C or SIGTERM here stops them in order. Raises
    CliError when a rank ended badly."""
    from .options import CliError

    previous = signal.signal(signal.SIGTERM, lambda *_: launched.interrupt())
    failed_at = None
    try:
        while launched.wait(0.5) is None:
            if failed_at is None and launched.failure():
                failed_at = time.monotonic()
            elif failed_at is not None and time.monotonic() - failed_at > (
                    FAILED_GRACE if launched.leader_ended() else LEADER_GRACE):
                launched.kill()   # a hung rank the launcher cannot end (it waits for it)
    except KeyboardInterrupt:
        stop(launched)
    finally:
        signal.signal(signal.SIGTERM, previous)
    launched.reader.join(5)   # the launcher's last lines
    failure = launched.failure()
    if failure:
        raise CliError(failure)


def stop(launched: Ranks) -> None:
    launched.interrupt()
    if launched.wait(STOP_GRACE) is None:
        launched.kill()
        launched.wait()


def launch_ranks(prog: str, args: list[str], ranks: int, backend: str | None, dashboard: bool = False,
                 api_key: str | None = None) -> None:
    """Run ``prog args`` (this very command line) as ``ranks`` ranks and wait for
    them; with ``dashboard`` (serve without --headless) the ranks serve headless
    and this process shows the dashboard of rank 0's server."""
    from mlxcel.engine.tensor_parallel import default_backend

    backend = backend or default_backend()
    if not dashboard:
        run_to_end(start(prog, args, ranks, backend, lambda line: print(line, file=sys.stderr, flush=True)))
        return
    log = open(os.environ.get("MLXCEL_LOG_FILE", os.devnull), "a")
    launched = start(prog, [*args, "--headless"], ranks, backend, lambda line: print(line, file=log, flush=True))
    print(f"mlxcel: starting {ranks} ranks over {backend} ...", file=sys.stderr, flush=True)
    try:
        show_dashboard(launched, api_key)
    finally:
        stop(launched)
        log.close()
    failure = launched.failure()
    if failure:
        from .options import CliError

        raise CliError(failure)


def show_dashboard(launched: Ranks, api_key: str | None) -> None:
    """The dashboard of rank 0's server once it serves, until it is closed or the ranks end."""
    from .app import DashboardApp
    from .source import HttpSource

    try:
        launched.url_known.wait()
    except KeyboardInterrupt:
        return
    if launched.url is None:   # the ranks ended before serving
        return
    app = DashboardApp(HttpSource(launched.url, api_key), url=launched.url)

    def close_when_ended() -> None:
        launched.process.wait()
        app.call_from_thread(app.exit)

    threading.Thread(target=close_when_ended, daemon=True).start()
    app.run()
