"""Did the arms generate the same text for the same greedy requests?

Timing differences mean nothing until this holds: a harness bug (requests
cut short, a prompt not sent, a cache answering for the wrong prompt) looks
exactly like a speedup. Arms are compared request by request against the
first arm, rep by rep: by generated token ids where both arms report them,
else by text. Arms whose numerics differ by design (another KV page format)
are reported, not required, to agree: how many requests match and how much of
each output comes before its first difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from .level_result import LevelResult


@dataclass(frozen=True)
class Agreement:
    arm: str
    reference: str
    identical: int
    compared: int
    by: str                     # "token ids" or "text"
    first_mismatch: str | None  # "rep R, client C, token/char K: ours vs theirs"
    matched: int = 0            # tokens (chars) of the reference's outputs before each one's first difference
    total: int = 0              # tokens (chars) of the reference's outputs

    @property
    def all_identical(self) -> bool:
        return self.identical == self.compared

    def describe(self) -> str:
        text = f"{self.arm} vs {self.reference}: {self.identical}/{self.compared} identical by {self.by}"
        if self.first_mismatch is None:
            return text
        unit = "tokens" if self.by == "token ids" else "chars"
        share = f"{self.matched}/{self.total} {unit} ({self.matched / self.total:.0%}) before the first difference"
        return f"{text}; {share}; first difference at {self.first_mismatch}"


def first_difference(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def describe_difference(rep: int, client: int, ours, theirs) -> str:
    at = first_difference(ours, theirs)
    unit = "char" if isinstance(ours, str) else "token"
    return f"rep {rep}, client {client}, {unit} {at}: {ours[at:at + 8]!r} vs {theirs[at:at + 8]!r}"


def compare_arms(level: LevelResult) -> list[Agreement]:
    arms = level.arms
    if len(arms) < 2:
        return []
    reference = arms[0]
    out = []
    for arm in arms[1:]:
        pairs = list(zip(level.runs[reference], level.runs[arm]))
        by_ids = all(a.has_token_ids and b.has_token_ids for a, b in pairs)
        identical = compared = matched = total = 0
        mismatch = None
        for ref_run, run in pairs:
            for client, (ours, theirs) in enumerate(zip(ref_run.outputs(by_ids), run.outputs(by_ids))):
                compared += 1
                matched += first_difference(ours, theirs)
                total += len(ours)
                if ours == theirs:
                    identical += 1
                elif mismatch is None:
                    mismatch = describe_difference(run.rep, client, ours, theirs)
        out.append(Agreement(arm, reference, identical, compared, "token ids" if by_ids else "text", mismatch,
                             matched, total))
    return out
