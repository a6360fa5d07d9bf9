"""The baseline arm: the same prompts through mlx-lm's own BatchGenerator in
this process (continuous batching, one dense KV cache per sequence, no paging,
no prefix sharing), with its default batch sizes, greedy and without stop
tokens so every request yields exactly max_tokens tokens.

Timing starts when all prompts are inserted; a request's first token is its
first generation response. The KV figure is the generator's cache bytes
(``prompt_cache_nbytes``: every sequence's keys and values, as allocated),
sampled after every step; peak memory is ``mx.get_peak_memory`` since the arm
was created (reset there, so the server arms' figures are not mixed in).
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx

from .arm_run import ArmRun
from .stats import RequestRecord
from .workload import Workload


def detokenize(tokenizer, tokens: list[int]) -> str:
    """Text as the server streams it: end-of-sequence tokens are not shown."""
    detokenizer = tokenizer.detokenizer
    for token in tokens:
        if token not in tokenizer.eos_token_ids:
            detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


class MlxLmArm:
    name = "mlx-lm"

    def __init__(self, model_path: Path) -> None:
        import mlx_lm

        self.model, self.tokenizer = mlx_lm.load(str(model_path))
        mx.reset_peak_memory()

    def run(self, workload: Workload, rep: int) -> ArmRun:
        from mlx_lm.generate import BatchGenerator

        generator = BatchGenerator(self.model, max_tokens=workload.max_tokens, stop_tokens=None)
        records: dict[int, RequestRecord] = {}
        tokens: dict[int, list[int]] = {}
        last_seen: dict[int, float] = {}
        kv_peak = 0
        start = time.perf_counter()
        uids = generator.insert([r.token_ids for r in workload.requests],
                                [workload.max_tokens] * workload.concurrency)
        for uid, request in zip(uids, workload.requests):
            records[uid] = RequestRecord(request.index, prompt_tokens=len(request.token_ids))
            tokens[uid] = []
        with generator.stats() as stats:
            while responses := generator.next_generated():
                now = time.perf_counter()
                kv_peak = max(kv_peak, generator.prompt_cache_nbytes)
                for response in responses:
                    record = records[response.uid]
                    if tokens[response.uid]:
                        record.itl.append(now - last_seen[response.uid])
                    else:
                        record.ttft = now - start
                    tokens[response.uid].append(response.token)
                    record.latency = now - start
                    last_seen[response.uid] = now
        duration = time.perf_counter() - start
        generator.close()
        for uid, record in records.items():
            record.output_tokens = len(tokens[uid])
            record.token_ids = tokens[uid]
            record.text = detokenize(self.tokenizer, tokens[uid])
            if record.output_tokens != workload.max_tokens:
                record.error = f"generated {record.output_tokens} tokens, expected {workload.max_tokens}"
        return ArmRun(self.name, workload.concurrency, rep, workload.variant, workload.shared_tokens,
                      [records[uid] for uid in uids], duration,
                      decode_seconds=stats.decode_time,
                      decode_tokens=stats.generation_tokens,
                      peak_memory_bytes=mx.get_peak_memory(), kv_peak_bytes=kv_peak)
