"""One fixed engine run for the tensor-parallel tests.

``python tests/tp_workload.py MODEL_DIR OUT.npz`` runs it on one device;
under ``mlx.launch --backend ring -n 2`` rank 0 runs it on the sharded model
and the other rank follows. The one that runs it writes OUT.npz: every
sampling call's logits (one entry per step), the completions, and what the
run went through (cascade launches, preemptions, the cancel), so the test
can check the run exercised what it compares.

The workload: five prompts behind a 24-token shared prefix (6 pages of 4
tokens: cascade material at min_shared_pages 2), one of them longer than a
step's token budget (a prefill in two chunks: a middle chunk samples
nothing), in a pool too small for all of them (preemptions), cascade
switched off live at step 8 and on again at step 16, one request cancelled
at step 12.
"""

from __future__ import annotations

import sys

import numpy as np

PREFIX = [(7 * i + 3) % 1000 + 3 for i in range(24)]
SUFFIXES = [[11, 12], [13, 14, 15], [16], list(range(30, 44)), [21, 22]]
MAX_TOKENS = 12
NUM_BLOCKS = 16
CASCADE_OFF_AT, CANCEL_AT, CASCADE_ON_AT = 8, 12, 16


def run(model_dir: str, out: str) -> None:
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine
    from mlxcel.engine.model import load_model
    from mlxcel.engine.sequence import SamplingParams
    from mlxcel.engine.tensor_parallel import Ranks, launched
    from mlxcel_tui.workload import follow_as_rank

    ranks = Ranks.join() if launched() else None
    if ranks is not None and not ranks.is_leader:
        follow_as_rank(model_dir, "auto", ranks)
        return
    loaded = load_model(model_dir, group=ranks.group if ranks else None)
    config = EngineConfig(block_size=4, num_blocks=NUM_BLOCKS, max_running=8, max_batched_tokens=32)
    engine = Engine(loaded, config, cascade=CascadeConfig(enabled=True, min_shared_pages=2, min_members=2),
                    ranks=ranks)
    logits = []
    sample = engine.runner.sampler.sample

    def recording(step_logits, seqs, inputs=None):
        logits.append(step_logits)   # lazy: read once the run is over
        return sample(step_logits, seqs, inputs)

    engine.runner.sampler.sample = recording
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    seqs = [engine.submit(PREFIX + suffix, params) for suffix in SUFFIXES]
    steps = 0
    while engine.step():
        steps += 1
        if steps == CASCADE_OFF_AT:
            engine.cascade.update(enabled=False)
        if steps == CANCEL_AT:
            engine.cancel(seqs[1])
        if steps == CASCADE_ON_AT:
            engine.cascade.update(enabled=True)
    cascade_launches = engine.metrics.paged_decode_launches.labels(path="cascade")._value.get()
    result = {f"logits_{i}": np.array(step) for i, step in enumerate(logits)}
    completions = [s.completion_token_ids for s in seqs]
    engine.shutdown()
    np.savez(out, steps=len(logits), completions=np.array([c + [-1] * (MAX_TOKENS - len(c)) for c in completions]),
             finish_reasons=np.array([s.finish_reason for s in seqs]), cascade_launches=cascade_launches,
             preemptions=engine.scheduler.num_preemptions,
             tensor_parallel=ranks.size if ranks else 1, **result)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
