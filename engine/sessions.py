"""Built-in client sessions: N clients behind one system prompt that keep asking
short questions, so the engine always has shared-prompt traffic to show."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from .corpus import TRAINING_CORPUS
from .engine import Engine, EngineClosed
from .sequence import SamplingParams, Sequence


def chat_prompt(tokenizer, system_prompt: str, question: str) -> list[int]:
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def synthetic_system_prompt(tokenizer, num_tokens: int, source: str, start: int = 0) -> str:
    """A system prompt of about num_tokens tokens, cut from repeated source text from token ``start`` on."""
    if num_tokens < 1:
        raise ValueError("a synthetic system prompt needs at least one token")
    base = tokenizer.encode(source)
    ids = list(itertools.islice(itertools.cycle(base), start, start + num_tokens))
    return tokenizer.decode(ids)


def tenant_system_prompts(tokenizer, common: str, tenants: int, sub_prefix_tokens: int | None) -> list[str]:
    """One system prompt per tenant. With ``sub_prefix_tokens`` each is the
    common prompt followed by a tenant's own sub-prefix of about that many
    tokens (sharing nested two deep); else the tenants' prompts differ from
    their first words (disjoint sharing groups)."""
    if tenants < 1:
        raise ValueError("sessions need at least one tenant")
    if sub_prefix_tokens:
        return [f"{common}\n\nTeam {t + 1} handbook: "
                + synthetic_system_prompt(tokenizer, sub_prefix_tokens, TRAINING_CORPUS, start=t * sub_prefix_tokens)
                for t in range(tenants)]
    return [common] if tenants == 1 else [f"You serve team {t + 1}. {common}" for t in range(tenants)]


MAX_SESSIONS = 1024


class TooManySessions(ValueError):
    """Adding sessions would pass MAX_SESSIONS."""


@dataclass
class Session:
    id: int
    label: str
    turns: int = 0
    current: Sequence | None = None
    completions: list[list[int]] = field(default_factory=list)
    active: bool = True
    last_question: str = ""
    last_answer: str = ""  # the latest completed turn's text, end-of-turn token left out

    def as_dict(self) -> dict:
        """What the control API and the dashboard show of a session."""
        return {"id": self.id, "label": self.label, "turns": self.turns, "question": self.last_question,
                "answer": self.last_answer}


class SessionManager:
    """Sessions asking questions in turn; with several system prompts
    (tenants), session i is tenant (i - 1) mod K's."""

    def __init__(self, engine: Engine, system_prompt: str | list[str], questions: list[str], *,
                 max_tokens: int = 64, turns: int | None = None, temperature: float = 0.0) -> None:
        if not questions:
            raise ValueError("sessions need at least one question")
        self.engine = engine
        self.system_prompts = [system_prompt] if isinstance(system_prompt, str) else list(system_prompt)
        if not self.system_prompts:
            raise ValueError("sessions need at least one system prompt")
        self.questions = questions
        self.params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        self.turns = turns  # None: loop forever
        self.sessions: list[Session] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, count: int = 1) -> list[Session]:
        """Start `count` sessions; refuses (adding none) past MAX_SESSIONS."""
        if len(self.sessions) + count > MAX_SESSIONS:
            raise TooManySessions(f"{len(self.sessions)} sessions run; adding {count} would pass "
                                  f"the limit of {MAX_SESSIONS}")
        added = []
        for _ in range(count):
            sid = next(self._ids)
            session = Session(sid, f"session-{sid}")
            with self._lock:
                self.sessions.append(session)
            self._ask(session)
            added.append(session)
        return added

    def remove(self, count: int = 1) -> int:
        """Stop the newest sessions; their in-flight requests are cancelled."""
        with self._lock:
            victims = [s for s in self.sessions if s.active][-count:] if count > 0 else []
            for s in victims:
                s.active = False
                self.sessions.remove(s)
        for s in victims:
            if s.current is not None:
                self.engine.cancel(s.current)
        return len(victims)

    def question_for(self, session: Session) -> str:
        return self.questions[(session.id - 1 + session.turns) % len(self.questions)]

    def answer_text(self, tokens: list[int]) -> str:
        eos = self.engine.tokenizer.eos_token_ids
        return self.engine.tokenizer.decode([t for t in tokens if t not in eos])

    def _ask(self, session: Session) -> None:
        system = self.system_prompts[(session.id - 1) % len(self.system_prompts)]
        prompt = chat_prompt(self.engine.tokenizer, system, self.question_for(session))
        # Under the lock, so a fast finish event cannot look for session.current before it is set.
        with self._lock:
            try:
                session.current = self.engine.submit(prompt, self.params, self._on_event, label=session.label)
            except EngineClosed:  # shutting down: this session asks no more
                session.active = False

    def _on_event(self, seq: Sequence, token: int | None, reason: str | None) -> None:
        if reason is None:
            return
        with self._lock:
            session = next((s for s in self.sessions if s.current is seq), None)
            if session is None:
                return
            session.last_question = self.question_for(session)
            session.last_answer = self.answer_text(seq.completion_token_ids)
            session.turns += 1
            session.completions.append(seq.completion_token_ids)
            session.current = None
            again = session.active and reason in ("stop", "length") and (
                self.turns is None or session.turns < self.turns)
        if again:
            self._ask(session)
