"""One forward pass over the pool, built and enqueued: the decode rows of a
step and the prefill chunk beside them share every matmul. Nothing here
waits for the device; the sampled tokens come back as a lazy array the
engine reads once the step has run."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import AttentionShape, CsrBuilder, PagedCsrView
from mlxcel.kernels.csr import host_csr, upload
from mlxcel.kernels.layer_ops import layer_ops

from .config import CascadeSettings
from .decode_plan import DecodeOutcome, DecodePlanner, gather_outcome, log_first_launch
from .layer_halves import TracedLayers, traced_layers_wanted
from .model import LoadedModel, StepContext, build_projection_kernels, final_hidden, head_logits, on_cpu
from .pool import BlockPool
from .sampler import Sampled, Sampler
from .scheduler import ScheduledStep
from .step_inputs import StepInputs
from .tensor_parallel import Ranks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launched:
    """A step on its way: its sampled tokens (one per sampling row, lazy, with
    their log-probabilities when a row asked), what its attention launches did
    (the decode rows', the prefill chunk's), when its graph was built (what
    follows is MLX's, from ``ModelRunner.launch``: encoding the kernels, on the
    CPU running all but the last few of them), and the arrays it evaluates."""

    sampled: Sampled
    outcomes: tuple[DecodeOutcome, ...]
    built: float    # perf_counter when the graph was complete
    outputs: tuple[mx.array, ...]

    @property
    def tokens(self) -> mx.array:
        return self.sampled.tokens


class ModelRunner:
    """Builds and enqueues each step's graph. Under tensor parallelism (``ranks``)
    rank 0's runner sends every step's inputs to the other ranks before its
    graph, and theirs build the same graph from them (``follow``)."""

    def __init__(self, loaded: LoadedModel, pool: BlockPool, ranks: Ranks | None = None) -> None:
        self.loaded = loaded
        self.pool = pool
        self.ranks = ranks
        self.sampler = Sampler()
        self.csr_builder = CsrBuilder(pool.block_size)
        self.planner = DecodePlanner()
        self.traced_layers = traced_layers_wanted()
        self.shape = AttentionShape(loaded.num_heads, loaded.num_kv_heads, loaded.head_dim, loaded.dtype,
                                    pool.geometry.page_dtype, pool.block_size, loaded.scale)

    def build_kernels(self, max_rows: int) -> None:
        """Compile now the projection kernels a decode step of up to ``max_rows`` rows compiles at its first
        launch: on CUDA the skinny matmul is an instance per 16 rows, seconds each to compile, and the first
        step of a new size stalled every stream that long (once per process: MLX keeps no disk cache of
        custom kernels). A tensor-parallel model's projections hold collectives: not built ahead."""
        if self.ranks is not None:
            return
        ops = layer_ops()
        wanted = {each: rows for each in dict.fromkeys((ops, ops.host_bound()))
                  if (rows := each.instance_rows(max_rows))}
        if not wanted:
            return
        start, built = time.perf_counter(), False
        for each, rows in wanted.items():
            built = build_projection_kernels(self.loaded.model, each, rows) or built
        if built:
            counts = "/".join(map(str, sorted({count for rows in wanted.values() for count in rows})))
            log.info("built the projection kernels of %s-row steps in %.1f s", counts, time.perf_counter() - start)

    def step(self, batch: ScheduledStep, last_tokens: mx.array | None, settings: CascadeSettings) -> Launched:
        """One forward pass: each decode row feeds its last token (``last_tokens``,
        possibly the previous step's lazy output) at position num_cached_tokens,
        the prefill chunk its prompt tokens; the page tables must already cover
        every position. Samples the decode rows, and the chunk's last token when
        it ends the prompt. Builds the graph; ``launch`` enqueues it."""
        inputs = StepInputs.of(batch, settings)
        # Under tensor parallelism MLX may block on a rank that stopped answering: sending the inputs here,
        # async_eval (once the stream holds enough work) in launch; the watchdog covers each.
        with self.ranks.watch("a step to be built") if self.ranks is not None else nullcontext():
            if self.ranks is not None:
                self.ranks.send_step(inputs)   # enqueued before the graph: the other ranks build theirs from it
            hidden, evaluated, outcomes = self.forward(inputs, last_tokens)
        sampling = batch.decode + ([batch.prefill] if batch.finishes_prefill else [])
        logits = head_logits(self.loaded.model, hidden)
        sampled = (self.sampler.sample(logits, sampling, last_tokens) if sampling
                   else Sampled(mx.zeros((0,), mx.int32)))
        return Launched(sampled, outcomes, time.perf_counter(),
                        (*sampled.arrays, *evaluated))

    def launch(self, launched: Launched) -> None:
        """Enqueue a built step (``mx.async_eval``): on the CPU this runs all but the last few of its tasks."""
        with self.ranks.watch("a step to be enqueued") if self.ranks is not None else nullcontext():
            self.enqueue(*launched.outputs)

    def follow(self, inputs: StepInputs) -> None:
        """A rank other than 0: the same step from rank 0's inputs, its decode
        tokens from rank 0 inside the graph; nothing sampled."""
        _, evaluated, _ = self.forward(inputs, None)
        self.enqueue(*evaluated)   # the caller watches: it may block

    def enqueue(self, *outputs: mx.array) -> None:
        """``mx.async_eval`` of a step's outputs and the pool's arrays: outputs of
        every step, so each layer's write stays in place and the graph does not
        grow. On the CPU the pool goes first, in an eval of its own: an eval's
        last task holds every output's buffer until it runs, and the next step's
        first K/V stores (scatters, in place only into a buffer nothing else
        holds), dispatched while it waits, each copied a layer's pool (traced
        halves, which dispatch them a few tasks into a step). A GPU's steps
        mostly store K/V in their kernels (the outputs then hold the last
        store, ``forward``): one eval."""
        if on_cpu():
            mx.async_eval(self.pool.keys, self.pool.values)
            mx.async_eval(*outputs)
        else:
            mx.async_eval(*outputs, self.pool.keys, self.pool.values)

    def forward(self, inputs: StepInputs,
                last_tokens: mx.array | None) -> tuple[mx.array, tuple[mx.array, ...], tuple[DecodeOutcome, ...]]:
        """The graph up to the last norm on the rows that sample; what every rank
        must evaluate besides the sampled tokens (under tensor parallelism the
        last norm on every row: its last layer's collectives, which a middle
        prefill chunk's sampling rows would leave out on rank 0 alone; where the
        q/k/v ops stored K/V in place, the last store: a middle chunk samples
        nothing, and the pool's arrays are not the stores' outputs); and what its
        attention launches did (the decode rows', the prefill chunk's)."""
        bs = self.pool.block_size
        rows = inputs.decode_rows
        positions = np.asarray(inputs.positions, np.int32)
        blocks = [table[p // bs] for table, p in zip(inputs.decode_tables, inputs.positions)]
        tokens = []
        if rows:
            tokens.append(last_tokens if self.ranks is None
                          else self.ranks.share_tokens(last_tokens, rows, self.loaded.vocab_size))
        ops = layer_ops()
        ctx = StepContext(self.pool, *upload(positions, blocks, positions % bs), decode_rows=rows, ops=ops,
                          # Only where every read of the pool comes after the store: the fused decode kernels
                          # take q, the store's output; a prefill chunk's gather is ordered after q (attend).
                          store_in_kernel=ops.stores_in_place and (not rows or kernels.fused_takes(self.shape)),
                          traced=self.traced_layers if inputs.prefill_table is None else TracedLayers.OFF)
        outcomes = []
        if rows:
            ctx.decode_csr = self.csr_builder.build(inputs.decode_keys, inputs.decode_tables, positions + 1,
                                                    row_keys=inputs.decode_keys)
            ctx.plan = self.planner.plan(ctx.decode_csr, inputs.settings, self.shape)
        if inputs.prefill_table is not None:
            start, end, table = inputs.prefill_start, inputs.prefill_end, inputs.prefill_table
            ctx.prefill_csr = PagedCsrView.from_host(host_csr([table], [end], bs))
            chunk_blocks, chunk_offsets = self.pool.slots(table, start, end - start)
            ctx.positions = mx.concatenate([ctx.positions, mx.arange(start, end, dtype=mx.int32)])
            ctx.slot_blocks = mx.concatenate([ctx.slot_blocks, mx.array(chunk_blocks, dtype=mx.int32)])
            ctx.slot_offsets = mx.concatenate([ctx.slot_offsets, mx.array(chunk_offsets, dtype=mx.int32)])
            tokens.append(mx.array(inputs.prefill_tokens, dtype=mx.int32))
        # Rows that sample nothing (a middle chunk's) get no logits: their graph is never evaluated. A step of
        # decode rows only samples every row, with no gather of the rows.
        sample_rows = None
        if inputs.prefill_table is not None:
            last = [rows + inputs.prefill_rows - 1] if inputs.finishes_prefill else []
            sample_rows = mx.array(list(range(rows)) + last, dtype=mx.int32)
        every = self.ranks is not None and sample_rows is not None
        tokens = tokens[0] if len(tokens) == 1 else mx.concatenate(tokens)
        hidden = final_hidden(self.loaded.model, tokens[:, None], ctx, None if every else sample_rows)
        last = hidden
        if every:
            hidden = hidden[sample_rows]
        if rows:
            outcomes.append(ctx.plan.outcome)     # after the layers: a launch that failed in one of them shows
        if inputs.prefill_table is not None:
            outcomes.append(gather_outcome(1, inputs.prefill_rows))
        for outcome in outcomes:
            log_first_launch(outcome)
        evaluated = (last,) if self.ranks is not None else ()
        return hidden, evaluated + ((ctx.stored,) if ctx.stored is not None else ()), tuple(outcomes)
