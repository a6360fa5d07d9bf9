"""A deterministic DataSource for the dashboard's snapshot tests and for
working on the dashboard without running a model.

It plays a small scripted engine: sessions behind one of two system prompts
(whose full pages are shared blocks), one session entering its first page
mid-page (a window, dropped from cascade subgroups), one prefill per step for
a new turn, otherwise a decode step that grows every sequence by a token.
Every snapshot() is one engine step unless paused; the counters, page tables,
plan and step timings follow from the step number alone, so two sources built
with the same arguments and driven the same way give the same data.
Thresholds go through the real CascadeConfig, so bad values are refused the
same way the engine refuses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlxcel.engine.config import CascadeConfig, ConfigError
from mlxcel.engine.snapshot import EngineSnapshot, PlanView, PoolView, SequenceView, StepRecord

from .frame import CASCADE_FAILURES, CASCADE_MEMBERS, CASCADE_SHARED_TOKENS, launch_key
from .source import SourceError

EPOCH = 1_700_000_000.0  # snapshot timestamps: EPOCH + step * STEP_SECONDS
STEP_SECONDS = 0.05
LAYERS = 2  # paged attention launches per step
RECENT_STEPS = 240
WINDOW_OFFSET = 8  # tokens the window session skips in its first page
BYTES_PER_TOKEN = 2 * LAYERS * 2 * 64 * 2  # K and V, layers, KV heads, head dim, float16


@dataclass
class FakeSession:
    id: int
    group: int  # 0 or 1: which system prompt
    window: bool  # enters its first page mid-page
    seq_id: int = 0
    turn: int = 0
    generated: int = 0
    prefilled: bool = False
    private: list[int] | None = None


class FakeSource:
    def __init__(self, sessions: int = 6, *, prompt_tokens: int = 300, block_size: int = 32,
                 max_new_tokens: int = 40, num_blocks: int = 1024, enabled: bool = False,
                 min_shared_pages: int = 4, min_members: int = 2, can_control: bool = True,
                 model: str = "fake-tiny-model") -> None:
        self.block_size = block_size
        self.max_new_tokens = max_new_tokens
        self.num_blocks = num_blocks
        self.model = model
        self.can_control = can_control
        self.description = f"fake · {model}"
        self.config = CascadeConfig(enabled, min_shared_pages, min_members)
        self.paused = False
        self.step = 0
        self.prompt_tokens = (prompt_tokens, max(block_size, prompt_tokens // 2))
        shared = [t // block_size for t in self.prompt_tokens]
        self.shared_blocks = (list(range(shared[0])), list(range(shared[0], shared[0] + shared[1])))
        self.free = list(range(shared[0] + shared[1], num_blocks))
        self.sessions: list[FakeSession] = []
        self._next_session = 1
        self._next_seq = 1
        self.counters: dict[str, float] = {}
        self.recent: list[StepRecord] = []
        self.switches: list[tuple[int, float, bool]] = [(0, EPOCH, enabled)]
        self.cache = {"queries": 0, "hits": 0, "misses": 0, "prefix_tokens_reused": 0, "evictions": 0}
        self.last_plan: PlanView | None = None
        self.last_reason: str | None = None
        self.last_path = ""
        self.change_sessions(add=sessions)

    # -- DataSource ---------------------------------------------------------

    def snapshot(self) -> dict:
        if not self.paused:
            self.advance()
        return self.build().to_dict()

    def metrics(self) -> dict[str, float]:
        pool = self.pool_view()
        gauges = {
            "mlxcel_cache_pool_paged_blocks_allocated": pool.live + pool.reusable,
            "mlxcel_cache_pool_paged_blocks_live": pool.live,
            "mlxcel_cache_pool_paged_blocks_free": pool.free,
            "mlxcel_cache_pool_paged_blocks_shared": pool.shared,
            "mlxcel_cache_pool_paged_blocks_reusable": pool.reusable,
            "mlxcel_queue_depth": sum(1 for s in self.sessions if not s.prefilled),
            "mlxcel_running_sequences": sum(1 for s in self.sessions if s.prefilled),
        }
        counters = {launch_key(p): 0.0 for p in ("fused_v2", "gather", "cascade")}
        counters |= {CASCADE_SHARED_TOKENS: 0.0, CASCADE_MEMBERS: 0.0, CASCADE_FAILURES: 0.0}
        counters |= {f"mlxcel_prompt_cache_{k}_total": float(v) for k, v in self.cache.items()}
        return counters | self.counters | gauges

    def set_cascade(self, **changes) -> dict:
        if not self.can_control:
            raise SourceError("this source is read-only")
        try:
            self.config.update(**changes)
        except ConfigError as err:
            raise SourceError(str(err)) from None
        if self.config.enabled != self.switches[-1][2]:
            self.switches.append((self.step, self.now(), self.config.enabled))
        return self.config.as_dict()

    def change_sessions(self, add: int = 0, remove: int = 0) -> None:
        for _ in range(add):
            sid = self._next_session
            self._next_session += 1
            # Every third session uses the second system prompt; session 4 is a window.
            session = FakeSession(sid, group=1 if sid % 3 == 0 else 0, window=sid == 4)
            self.sessions.append(session)
            self._start_turn(session)
        for session in self.sessions[len(self.sessions) - remove:] if remove > 0 else []:
            self._release(session)
            self.sessions.remove(session)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    # -- the scripted engine ------------------------------------------------

    def now(self) -> float:
        return EPOCH + self.step * STEP_SECONDS

    def advance(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._step()

    def _count(self, key: str, amount: float) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + amount

    def _start_turn(self, session: FakeSession) -> None:
        session.seq_id = self._next_seq
        self._next_seq += 1
        session.generated = 0
        session.prefilled = False
        session.private = []

    def _release(self, session: FakeSession) -> None:
        self.free = sorted(self.free + (session.private or []))
        session.private = []

    def prompt_len(self, s: FakeSession) -> int:
        return self.prompt_tokens[s.group] + 12 + (7 * s.id + 5 * s.turn) % 23

    def tokens(self, s: FakeSession) -> int:
        return self.prompt_len(s) + s.generated

    def _grow(self, s: FakeSession) -> None:
        pages = math.ceil(self.tokens(s) / self.block_size)
        while len(self.shared_blocks[s.group]) + len(s.private) < pages:
            if not self.free:
                raise SourceError("fake pool exhausted")
            s.private.append(self.free.pop(0))

    def live(self) -> list[FakeSession]:
        return [s for s in self.sessions if s.prefilled]

    def pages(self, s: FakeSession) -> list[int]:
        return self.shared_blocks[s.group] + s.private

    def _step(self) -> None:
        self.step += 1
        waiting = next((s for s in self.sessions if not s.prefilled), None)
        if waiting is not None:
            self._prefill(waiting)
            return
        running = self.live()
        if not running:
            self.step -= 1  # nothing to do: an idle engine does not step
            return
        for s in running:
            s.generated += 1
            self._grow(s)
        self._plan(running)
        self._count(launch_key("fused_v2"), LAYERS)
        if self.last_plan is not None:
            self._count(launch_key("cascade"), LAYERS)
            self._count(CASCADE_SHARED_TOKENS, LAYERS * self.last_plan.shared_tokens)
            self._count(CASCADE_MEMBERS, LAYERS * len(self.last_plan.members))
        self.last_path = "cascade" if self.last_plan else "fused_v2"
        seconds = (4.0 + 0.6 * len(running) + 0.8 * (self.step * 7 % 5)) / 1e3
        if self.last_plan is not None:
            seconds *= 0.7
        self._record("decode", seconds, len(running), len(running))
        self._count("mlxcel_completion_tokens_total", len(running))
        for s in running:
            if s.generated >= self.max_new_tokens:
                self._count('mlxcel_requests_total{finish_reason="length"}', 1)
                self._release(s)
                s.turn += 1
                self._start_turn(s)

    def _prefill(self, s: FakeSession) -> None:
        shared = len(self.shared_blocks[s.group]) * self.block_size
        group_started = any(o.prefilled and o.group == s.group for o in self.sessions)
        self.cache["queries"] += 1
        if group_started:
            self.cache["hits"] += 1
            self.cache["prefix_tokens_reused"] += shared
        else:
            self.cache["misses"] += 1
        computed = self.prompt_len(s) - (shared if group_started else 0)
        s.prefilled = True
        self._grow(s)
        self._count(launch_key("gather"), LAYERS)
        self._count("mlxcel_prompt_tokens_total", self.prompt_len(s))
        self.last_path = "gather"
        self._record("prefill", (2.0 + computed * 0.05) / 1e3, 1, computed)

    def _record(self, kind: str, seconds: float, batch: int, tokens: int) -> None:
        path = self.last_path
        self.recent.append(StepRecord(self.step, kind, seconds, batch, tokens, path, self.config.enabled,
                                      self.now()))
        del self.recent[:-RECENT_STEPS]

    def _plan(self, running: list[FakeSession]) -> None:
        """The planner's rule on the fake page tables: per prompt group, members
        not entering mid-page, span capped below every member's last page."""
        self.last_plan = None
        if not self.config.enabled:
            self.last_reason = "cascade off"
            return
        candidates = []
        for group in (0, 1):
            members = [s for s in running if s.group == group and not s.window]
            if len(members) >= 2:
                span = min(len(self.shared_blocks[group]), *(len(self.pages(s)) - 1 for s in members))
                candidates.append((span * (len(members) - 1), span, members))
        windows = [str(i) for i, s in enumerate(running) if s.window]
        note = f"; rows entering mid-page dropped: {', '.join(windows)}" if windows else ""
        passing = [c for c in candidates
                   if c[1] >= self.config.min_shared_pages and len(c[2]) >= self.config.min_members]
        if passing:
            _, span, members = max(passing, key=lambda c: (c[0], c[1]))
            blocks = tuple(self.shared_blocks[members[0].group][:span])
            self.last_plan = PlanView(tuple(s.seq_id for s in members), span, span * self.block_size, blocks)
            self.last_reason = f"{len(members)} rows share {span} pages ({span * self.block_size} tokens){note}"
        elif not candidates:
            self.last_reason = f"no two rows share a first page{note}"
        elif any(len(c[2]) >= self.config.min_members for c in candidates):
            span = max(c[1] for c in candidates if len(c[2]) >= self.config.min_members)
            self.last_reason = (f"best subgroup shares {span} pages < min_shared_pages "
                                f"{self.config.min_shared_pages}{note}")
        else:
            most = max(len(c[2]) for c in candidates)
            self.last_reason = f"{most} members < min_members {self.config.min_members}{note}"

    # -- snapshot -----------------------------------------------------------

    def refcounts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for s in self.live():
            for block in self.pages(s):
                counts[block] = counts.get(block, 0) + 1
        return counts

    def pool_view(self) -> PoolView:
        counts = self.refcounts()
        reusable = sum(1 for g in self.shared_blocks for b in g if b not in counts)
        live = len(counts)
        return PoolView(self.num_blocks, self.block_size, live, self.num_blocks - live - reusable,
                        sum(1 for c in counts.values() if c > 1), reusable, BYTES_PER_TOKEN * self.block_size)

    def build(self) -> EngineSnapshot:
        counts = self.refcounts()
        bs = self.block_size
        views = tuple(
            SequenceView(s.seq_id, f"session-{s.id}", "running", self.tokens(s), self.prompt_len(s),
                         self.tokens(s) - 1, tuple(self.pages(s)), tuple(counts[b] for b in self.pages(s)),
                         WINDOW_OFFSET if s.window else 0, (self.tokens(s) - 1) % bs + 1)
            for s in self.live()
        )
        cached = sum(len(g) for g in self.shared_blocks)
        return EngineSnapshot(
            step=self.step, timestamp=self.now(), model=self.model, device="Device(cpu, 0)",
            sequences=views, plan=self.last_plan, decline_reason=self.last_reason, last_path=self.last_path,
            recent_steps=tuple(self.recent), pool=self.pool_view(),
            prefix_cache=self.cache | {"cached_blocks": cached}, cascade=self.config.as_dict(),
            cascade_switches=tuple(self.switches),
            waiting=sum(1 for s in self.sessions if not s.prefilled), running=len(views),
            preemptions=0, paused=self.paused,
        )


def demo_source(can_control: bool = True, **kwargs) -> FakeSource:
    """The scripted history the snapshot tests show: 60 steps with cascade off,
    then on (so the latency plot has a switch to mark)."""
    source = FakeSource(**kwargs)
    source.advance(60)
    source.set_cascade(enabled=True)
    source.advance(60)
    source.can_control = can_control
    return source
