"""Tensor-parallel ranks over MLX's own distributed backends (``mx.distributed``).

The processes are started by ``mlx.launch`` (by ``mlxcel-tui serve
--tensor-parallel N`` on one machine, or by a user with ``--hostfile``).
Every rank loads its shard of the model (mlx-lm's ``shard()``) and a pool of
its own KV heads; all pools have the same blocks, so there is one block-id
space. Rank 0 runs the engine: it schedules, allocates and plans, and before
each step's graph it broadcasts the step's inputs (``StepInputs.pack``) as an
``all_sum`` to which the other ranks add zeros. The other ranks ``follow``:
receive, build the same graph, repeat. The decode rows' input tokens come
from rank 0 inside each step's graph (one more ``all_sum``), so no rank ever
feeds a token of its own.

A message is a fixed-size ``all_sum`` of int32 words: [kind, payload words,
each rank's memory in KiB (active, peak), the payload's first words], and a
second ``all_sum`` for the rest of a long payload. Kinds: STEP, HEARTBEAT
(rank 0 idle, about every second: a rank 0 that stays silent is gone), STOP.

Faults: each blocking collective runs under a watchdog. No answer within the
timeout, or a collective that fails (a peer's connection closed), ends the
process with one error line; rank 0 first ends every request with finish
reason ``error``. Under ``mlx.launch`` on one machine the launcher then ends
the other ranks.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import mlx.core as mx
import numpy as np

from . import buffer_cache
from .pool import KV_DTYPES
from .step_inputs import StepInputs

log = logging.getLogger("mlxcel.tensor_parallel")

# Set in each rank's environment by the CLI's launcher: the size it started.
RANKS_ENV = "MLXCEL_TENSOR_PARALLEL"
BACKEND_ENV = "MLXCEL_TP_BACKEND"
TIMEOUT_ENV = "MLXCEL_RANK_TIMEOUT"
DEFAULT_TIMEOUT = 15.0
STARTUP_TIMEOUT = 600.0   # seconds the ranks wait for each other to load the model and start serving
HEARTBEAT_SECONDS = 1.0
FAULT_EXIT = 3         # the status a rank ends with on a fault
FAULT_GRACE = 0.2      # seconds for a fault's last bytes to leave, once its callbacks returned
STOPPING_TIMEOUT = 2.0  # seconds the ranks get to answer once rank 0 is stopping (see Ranks.hurry)

STEP, HEARTBEAT, STOP = 1, 2, 3
FIRST_WORDS = 2048     # one all_sum carries a step of this many words; a longer one takes a second
POOL_DTYPES = KV_DTYPES   # a pool's page format travels as its index here
NO_POOL, CALLED_OFF = -1, -2   # the pool word of a rank other than 0, and of a rank 0 that refused its pool
START_MARK = 0x6D6C7863   # leads each rank's row of the start's gather ("mlxc")


class RankError(RuntimeError):
    """The ranks cannot work together (they loaded different models, say)."""


def launched() -> bool:
    """Whether this process was started by mlx.launch (or MPI) as one of several ranks."""
    return "MLX_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def default_backend() -> str:
    """mlx.launch's own choice: NCCL where CUDA is the device, else the ring over TCP."""
    return "nccl" if mx.cuda.is_available() else "ring"


def rank_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        raise RankError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise RankError(f"{TIMEOUT_ENV} must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class PoolFacts:
    """What every rank's pool must agree on; rank 0 decides it."""

    num_blocks: int
    block_size: int
    dtype: str


def model_facts(loaded) -> tuple[int, ...]:
    """A rank's model shape: every rank must have loaded the same (its own heads, the same count)."""
    return (loaded.num_layers, loaded.num_heads, loaded.num_kv_heads, loaded.head_dim, loaded.vocab_size)


class Ranks:
    """This process's place among the ranks and the messages between them."""

    def __init__(self, group: mx.distributed.Group, backend: str, timeout: float) -> None:
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        self.backend = backend
        self.timeout = timeout
        # Called once on a fault, in order, before the process ends: the engine ends its requests, the server
        # waits for their responses to end.
        self.on_fault: list[Callable[[str], None]] = []
        self._memory = [(0, 0)] * self.size     # bytes (active, peak) per rank, as of a recent message
        self._sent: deque[mx.array] = deque()   # rank 0's recent first messages, read once surely done
        self._last_message = time.monotonic()
        self._waiting: tuple[str, float, float] | None = None   # what this rank waits for, until when, how long
        self._hurried: float | None = None      # the timeout once this process is stopping
        self._started = False
        self._faulted = threading.Lock()
        self._launcher = os.getppid()           # mlx.launch (or what started this rank)
        threading.Thread(target=self._watch, name="mlxcel-rank-watchdog", daemon=True).start()

    @classmethod
    def join(cls, backend: str | None = None) -> "Ranks":
        """The group mlx.launch started this process in (strict: no silent single rank)."""
        backend = backend or os.environ.get(BACKEND_ENV) or "any"
        timeout = rank_timeout()
        try:
            group = mx.distributed.init(strict=True, backend=backend)
        except RuntimeError as err:
            raise RankError(f"cannot join the ranks over the '{backend}' backend: {err}") from None
        return cls(group, backend if backend != "any" else _backend_in_env(), timeout)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # -- start ----------------------------------------------------------------

    def share_pool(self, model_facts: tuple[int, ...], pool: PoolFacts | None) -> PoolFacts | None:
        """Rank 0 gives its pool's facts (None elsewhere); every rank checks that
        all loaded the same shape of model. Returns rank 0's pool facts, or None
        where rank 0 called the start off (``call_off``)."""
        words = [pool.num_blocks, pool.block_size, POOL_DTYPES.index(pool.dtype)] if pool else [0, 0, NO_POOL]
        table = self._gather_start(model_facts, words)
        num_blocks, block_size, dtype = table[0][len(model_facts):].tolist()
        self._last_message = time.monotonic()
        self._started = False   # until the first message after this: rank 0 still sets its server up
        return None if dtype == CALLED_OFF else PoolFacts(num_blocks, block_size, POOL_DTYPES[dtype])

    def call_off(self, model_facts: tuple[int, ...]) -> None:
        """Rank 0 refused its pool: the other ranks, waiting for its facts in
        ``share_pool``, stop with no error of their own (rank 0 says why)."""
        self._gather_start(model_facts, [0, 0, CALLED_OFF])

    def _gather_start(self, model_facts: tuple[int, ...], words: list[int]) -> np.ndarray:
        """Every rank's [model facts, pool words], after a mark and its rank: a
        ring gather whose peer closed its connection can return unwritten rows
        instead of failing (MLX 0.32), read as that peer's end, not its model."""
        mine = mx.array([START_MARK, self.rank, *model_facts, *words], dtype=mx.int32)[None]
        with self.watch("every rank to load the model", STARTUP_TIMEOUT):
            table = np.array(mx.distributed.all_gather(mine, group=self.group))
        for rank, row in enumerate(table):
            if row[0] != START_MARK or row[1] != rank:
                self.fault(f"rank {self.rank} of {self.size}: rank {rank} ended before every rank loaded the model")
        table = table[:, 2:]
        for rank, row in enumerate(table):
            if tuple(row[:len(model_facts)]) != tuple(table[0][:len(model_facts)]):
                raise RankError(f"rank {rank} loaded a model of another shape than rank 0's "
                                f"({row[:len(model_facts)].tolist()} against {table[0][:len(model_facts)].tolist()})")
        return table

    # -- rank 0 ---------------------------------------------------------------

    def send_step(self, inputs: StepInputs) -> None:
        """Enqueue a step's inputs for the other ranks (the caller watches)."""
        first = self._send(STEP, inputs.pack())
        self._sent.append(first)
        if len(self._sent) > 2:   # two steps back: it ran before the step whose tokens were read since
            self._note_memory(self._sent.popleft())

    def heartbeat(self) -> None:
        """Rank 0 idle: tell the other ranks it lives, about once a second."""
        if time.monotonic() - self._last_message >= HEARTBEAT_SECONDS:
            with self.watch("a heartbeat to reach every rank"):
                self._note_memory(self._send(HEARTBEAT, np.zeros(0, np.int32)))

    def stop(self) -> None:
        """Rank 0 done: the other ranks leave their loops."""
        with self.watch("the stop message to reach every rank"):
            mx.eval(self._send(STOP, np.zeros(0, np.int32)))

    def share_tokens(self, tokens: mx.array | None, rows: int, vocab_size: int) -> mx.array:
        """Rank 0's decode input tokens on every rank, inside the step's graph.
        Clipped to the vocabulary: a ring collective that loses its peer mid-step
        can leave its output unwritten instead of failing (MLX 0.32), and an
        embedding lookup at such an id read past the table (a segfault, where the
        fault would have told the clients)."""
        mine = tokens if self.is_leader else mx.zeros((rows,), mx.int32)
        return mx.clip(mx.distributed.all_sum(mine, group=self.group), 0, vocab_size - 1)

    def _send(self, kind: int, payload: np.ndarray) -> mx.array:
        first = self._first_message(kind, payload)
        mx.async_eval(first)
        if len(payload) > self._first_room:
            mx.async_eval(mx.distributed.all_sum(mx.array(payload[self._first_room:]), group=self.group))
        self._last_message = time.monotonic()
        return first

    # -- the other ranks --------------------------------------------------------

    def receive(self) -> tuple[int, StepInputs | None]:
        """The next message from rank 0: (kind, the step's inputs for a STEP)."""
        with self.watch("rank 0's next message", None if self._started else STARTUP_TIMEOUT):
            first = self._first_message(0, np.zeros(0, np.int32))
            words = np.array(first)
            self._note_memory(first)
            kind, length = int(words[0]), int(words[1])
            payload = words[self._header_words:self._header_words + min(length, self._first_room)]
            if length > self._first_room:
                rest = mx.distributed.all_sum(mx.zeros((length - self._first_room,), mx.int32), group=self.group)
                payload = np.concatenate([payload, np.array(rest)])
        self._last_message = time.monotonic()
        self._started = True
        return kind, StepInputs.unpack(payload) if kind == STEP else None

    # -- both -----------------------------------------------------------------

    @property
    def _header_words(self) -> int:
        return 2 + 2 * self.size

    @property
    def _first_room(self) -> int:
        return FIRST_WORDS - self._header_words

    def _first_message(self, kind: int, payload: np.ndarray) -> mx.array:
        words = np.zeros(FIRST_WORDS, np.int32)
        if self.is_leader:
            words[0], words[1] = kind, len(payload)
            room = payload[:self._first_room]
            words[self._header_words:self._header_words + len(room)] = room
        at = 2 + 2 * self.rank
        words[at], words[at + 1] = mx.get_active_memory() >> 10, mx.get_peak_memory() >> 10
        return mx.distributed.all_sum(mx.array(words), group=self.group)

    def _note_memory(self, first: mx.array) -> None:
        kib = np.array(first[2:self._header_words]).reshape(self.size, 2).astype(np.int64)
        self._memory = [(int(a) << 10, int(p) << 10) for a, p in kib]

    def memory(self) -> list[tuple[int, int]]:
        """Each rank's MLX memory in bytes (active, peak), as of a recent message."""
        return list(self._memory)

    # -- faults -----------------------------------------------------------------

    @contextmanager
    def watch(self, what: str, timeout: float | None = None) -> Iterator[None]:
        """Wait for the other ranks under the watchdog: a fault if it takes
        longer than the timeout (the rank timeout unless given) or the collective fails."""
        timeout = min(timeout or self.timeout, self._hurried or math.inf)
        self._waiting = (what, time.monotonic() + timeout, timeout)
        try:
            yield
        except RuntimeError as err:   # MLX's backends raise RuntimeError when a peer is lost
            self.fault(f"rank {self.rank} of {self.size}: a collective failed while waiting for {what}: {err}")
        finally:
            self._waiting = None

    def hurry(self) -> None:
        """This process is stopping: the wait under way and every later one end
        as a fault after STOPPING_TIMEOUT (or the rank timeout, if shorter), so a
        stop never waits out a long rank timeout on a rank that is gone (mlx.launch
        stops rank 0 so when another rank died; the error must reach its clients
        before the server's own shutdown gives up on their streams)."""
        self._hurried = min(self.timeout, STOPPING_TIMEOUT)
        waiting = self._waiting
        if waiting is not None:
            self._waiting = (waiting[0], min(waiting[1], time.monotonic() + self._hurried),
                             min(waiting[2], self._hurried))

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            waiting = self._waiting
            if waiting is not None and time.monotonic() > waiting[1]:
                self.fault(f"rank {self.rank} of {self.size}: no answer from the other ranks for "
                           f"{waiting[2]:g} s while waiting for {waiting[0]}: a rank has hung or died")
            if os.getppid() != self._launcher:
                self.fault(f"rank {self.rank} of {self.size}: the process that launched it is gone")

    def fault(self, message: str) -> None:
        """End this process with one error line (once, whichever thread sees it first)."""
        if not self._faulted.acquire(blocking=False):
            while True:
                time.sleep(1)   # the first thread to fault ends the process
        try:
            log.error("%s; this rank stops", message)
            for callback in self.on_fault:
                try:
                    callback(message)
                except Exception:
                    log.exception("a fault callback failed")
            time.sleep(FAULT_GRACE)
            print(f"Error: {message}; the tensor-parallel {'server' if self.is_leader else 'rank'} stops",
                  file=sys.stderr, flush=True)
            logging.shutdown()
        except OSError:   # stderr went with the launcher: the exit matters, not the line
            pass
        finally:
            os._exit(FAULT_EXIT)


def follow(runner, ranks: Ranks) -> None:
    """A rank other than 0: run every step rank 0 sends until it says stop."""
    while True:
        kind, inputs = ranks.receive()
        if kind == STOP:
            return
        if kind == STEP:
            with ranks.watch("this rank's step to be built"):
                runner.follow(inputs)
            buffer_cache.trim()     # as rank 0's engine does between its steps


def _backend_in_env() -> str:
    """The backend mlx.launch set this process up for (what ``any`` picks)."""
    if "NCCL_HOST_IP" in os.environ:
        return "nccl"
    if "MLX_JACCL_COORDINATOR" in os.environ:
        return "jaccl"
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return "mpi"
    return "ring"
