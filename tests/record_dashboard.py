"""Record the engine run the dashboard tests and screenshots replay:

    .venv/bin/python tests/record_dashboard.py    # writes tests/fixtures/dashboard.jsonl.gz

The tiny model (`mlxcel-tui serve tiny`'s) on this thread: four built-in
sessions behind a shared ~160-token system prompt at 16 tokens a page, prompts
prefilled 64 tokens a step so prefills show their progress; cascade off, then
on, then off again; a fifth session added (recorded once while it waits) and a
long HTTP-like request prefilled beside the decodes. Three engine steps a
poll, a poll a second, so the history spans minutes of wall time as a
dashboard would see it. What is recorded is what the dashboard reads: each
poll's snapshot and metric samples, through the package's Recorder.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_helpers import RECORDING  # noqa: E402

POLLS = 150
STEPS_PER_POLL = 3
CASCADE_ON, ADD_SESSION, LONG_PROMPT, CASCADE_OFF = 20, 60, 75, 120


def main() -> None:
    from mlxcel.engine.builtin_models import TINY, builtin_model
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine
    from mlxcel.engine.model import load_model
    from mlxcel.engine.sequence import SamplingParams
    from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
    from mlxcel.engine.sessions import SessionManager, synthetic_system_prompt
    from mlxcel.engine import blas
    from mlxcel_tui.recording import Recorder
    from mlxcel_tui.source import EngineSource

    path, name = builtin_model(TINY, None)
    engine = Engine(load_model(path, name), EngineConfig(block_size=16, num_blocks=512, max_running=16, max_batched_tokens=64),
                    cascade=CascadeConfig(enabled=False, min_shared_pages=2, min_members=2))
    engine.process_facts["blas"] = blas.describe()
    prompt = synthetic_system_prompt(engine.tokenizer, 160, DEFAULT_SYSTEM_PROMPT)
    sessions = SessionManager(engine, prompt, list(DEFAULT_QUESTIONS), max_tokens=24)
    sessions.add(4)
    source = EngineSource(engine, sessions)
    RECORDING.parent.mkdir(exist_ok=True)
    recorder = Recorder(RECORDING, source.description)
    rng = random.Random(0)
    try:
        for poll in range(POLLS):
            began = time.monotonic()
            if poll == CASCADE_ON:
                engine.cascade.update(enabled=True)
            if poll == CASCADE_OFF:
                engine.cascade.update(enabled=False)
            if poll == ADD_SESSION:
                sessions.add(1)  # recorded while it waits, before a step admits it
            if poll == LONG_PROMPT:
                ids = [rng.randrange(3, engine.vocab_size) for _ in range(600)]
                engine.submit(ids, SamplingParams(max_tokens=16, ignore_eos=True), label="http")
            recorder.write(source.snapshot(), source.metrics())
            for _ in range(STEPS_PER_POLL):
                engine.step()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    finally:
        recorder.close()
        engine.shutdown()
    print(f"wrote {RECORDING} ({RECORDING.stat().st_size} bytes, {POLLS} polls)")


if __name__ == "__main__":
    from mlxcel.engine import blas

    blas.reexec_with_openblas()
    main()
