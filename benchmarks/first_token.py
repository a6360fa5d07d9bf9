"""Time to the first session's first token, as a new user meets it: the seconds
from starting `scripts/serve.sh` (the venv already there) until the engine has
generated the first token of a built-in session, on a fresh $MLXCEL_HOME so the
default model's first-use conversion is included (and timed on its own).

    python benchmarks/first_token.py [--keep-home DIR] [-- extra serve arguments]

It runs `scripts/serve.sh --headless --port 0` and polls the server's snapshot
(GET /v1/cascade) every 0.1 s; the dashboard shows the same token at its next
poll (every 1 s by default). Lines of the server's stderr are echoed with the
time they arrived.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SERVING = re.compile(r"serving \S+ on (http://\S+)")
CONVERTED = re.compile(r"converting .*: done")


def first_generated(snapshot: dict) -> bool:
    return any(s["num_tokens"] > s["num_prompt_tokens"] for s in snapshot["sequences"])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-home", type=Path, default=None, help="use (and keep) this MLXCEL_HOME")
    parser.add_argument("serve_args", nargs="*", help="extra arguments for `mlxcel-tui serve`")
    args = parser.parse_args(argv)
    home = args.keep_home or Path(tempfile.mkdtemp(prefix="mlxcel-first-token-"))
    env = {**os.environ, "MLXCEL_HOME": str(home)}
    start = time.monotonic()
    proc = subprocess.Popen([str(ROOT / "scripts" / "serve.sh"), "--headless", "--port", "0", *args.serve_args],
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    marks: dict[str, float] = {}
    url: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            now = time.monotonic() - start
            print(f"[{now:6.1f} s] {line.rstrip()}", flush=True)
            if CONVERTED.search(line):
                marks.setdefault("conversion done", now)
            match = SERVING.search(line)
            if match:
                marks.setdefault("listening", now)
                url.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    try:
        while "first token" not in marks:
            if proc.poll() is not None:
                sys.exit(f"serve exited with {proc.returncode}")
            if url:
                try:
                    if first_generated(httpx.get(f"{url[0]}/v1/cascade", timeout=5).json()["snapshot"]):
                        marks["first token"] = time.monotonic() - start
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    for name, seconds in marks.items():
        print(f"{name}: {seconds:.1f} s after start")
    print(f"MLXCEL_HOME: {home}")
    return marks


if __name__ == "__main__":
    main()
