"""The comparison's figures and its verdict as data: the outcomes, the thresholds the judge reads, and one result
type a part (``Answers``, ``Speed`` per concurrency level, ``Drafts``, ``Load``, ``Failures``) with the whole
``Comparison`` that holds them: each says itself in words (``describe``, ``line``) and as JSON (``to_json``, the
field names the history and ``--json`` keep). The judge that fills them: opsctl/comparison/compare.py."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

MIN_PAIRS = 5  # the fewest requests answered on both sides that can decide: at 5 vs 5 the exact test reaches 1/252
MIN_SECONDS = 1e-9  # a time below a nanosecond per token is not a measurement (and would make ratios infinite)
# The host's own figure: when the mean time of the calibration work (host_s) differs between the sides by more
# than this fraction, other work on the host took the CPU on one side and the speed cannot be decided. Without
# contention the two means agree within a few percent; a host busy enough to slow the calibration by 15% slows
# a CPU-bound server about as much.
MAX_HOST_DIFF = 0.15
# The decode bound is 1 - max_slowdown less this many of the pairs' own spread (pair_spread, in log): pairing removes
# the prompts' spread, not a shift of a whole side (the host's state in the minutes between the sides), which no
# single sample shows; where the pairs are noisy the whole side moves more too (testbed: spread 0.075 with sides
# moving 0.048 at concurrency 1, 0.19 with 0.076 at 8; the GPU model: 0.02 with 0.02). docs/gate.md "The statistics".
NOISE_MARGIN = 1.5
# A repeat's share of that margin: a second sample slower than the bound less REPEAT_MARGIN x its spread, at p <
# alpha, where the first FAILed confirms the FAIL (compare.confirm). Not the whole margin again: both samples are
# judged against one baseline, so a baseline that ran fast makes both look slow. Not none: the GPU model's A/A
# confirmed FAIL per level was then 0.54% (0.27% at 0.75, 0.22% at 1.0, 0.13% with the whole margin; a deploy
# judges two levels, docs/bench/compare-judge.md).
REPEAT_MARGIN = 1.0
# The largest pairs' spread (log) the margin is trusted for: the most the testbed measured, A/A on a loaded machine,
# was 0.124 (a GPU host: about 0.02). A sample noisier than that says nothing about a slowdown the margin would hide:
# beyond the bound, it is UNPROVEN, not a PASS (a 1.5x slower release measured 0.65x at p=3e-5 with a spread above
# 0.26 beside two other test workers on 2 cores, and passed).
MAX_TRUSTED_SPREAD = 0.125


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNDECIDED = "UNDECIDED"  # cannot decide: too few answered requests, or the load differed (speed only)
    # The speed verdict withheld (load or host contention) while the measured decode is beyond the bound: no PASS.
    UNPROVEN = "UNPROVEN"
    ERROR = "ERROR"  # 4xx on both sides: the workload does not fit the server; no verdict on the release

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Outcome.PASS: 0, Outcome.UNDECIDED: 1, Outcome.UNPROVEN: 2, Outcome.ERROR: 3, Outcome.FAIL: 4}


class Thresholds(Protocol):
    """What the judge reads from the inventory's ``gate.compare`` (``CompareSettings``) or the CLI's flags."""

    @property
    def compare_tokens(self) -> int: ...
    @property
    def min_identical(self) -> float: ...
    @property
    def max_slowdown(self) -> float: ...
    @property
    def alpha(self) -> float: ...
    @property
    def max_accept_drop(self) -> float: ...
    @property
    def max_load_diff(self) -> float: ...


def load_differs(old: float, new: float, bound: float) -> bool:
    """Whether two loads (running requests, the comparison's own included) differ beyond ``bound``: the busier
    side's (1 + load) over the quieter side's is above 1 + bound. The 1 stands for the comparison's own request,
    so that 0 against 0.4 running requests on an idle host is no difference, and 20 against 5 is."""
    hi, lo = max(old, new), min(old, new)
    return (1 + hi) / (1 + lo) > 1 + bound + 1e-12


# ------------------------------------------------------------------------------------------------ the parts


@dataclass(frozen=True)
class Answers:
    outcome: Outcome
    judged: int  # prompts answered on both sides
    identical: int
    compare_tokens: int
    divergences: tuple[tuple[int, int], ...]  # (request index, first differing token) of each prompt that differs

    @property
    def first(self) -> int | None:
        return min((t for _, t in self.divergences), default=None)

    @property
    def median(self) -> float | None:
        return statistics.median(t for _, t in self.divergences) if self.divergences else None

    def diverged(self) -> str:
        """``2 diverge from token 27 (median 29)``: how many differ, and how early (empty when none does)."""
        k = len(self.divergences)
        if not k:
            return ""
        if k == 1:
            return f"1 diverges at token {self.first}"
        return f"{k} diverge from token {self.first} (median {self.median:g})"

    def describe(self) -> str:
        text = f"{self.identical}/{self.judged} answers identical"
        if self.divergences:
            text += f" over {self.compare_tokens} tokens; {self.diverged()}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": str(self.outcome),
            "judged": self.judged,
            "identical": self.identical,
            "compare_tokens": self.compare_tokens,
            "divergences": [{"request": r, "token": t} for r, t in self.divergences],
            "first_divergence": self.first,
        }


@dataclass(frozen=True)
class Speed:
    """The decode-speed verdict of one concurrency level, over the prompts paired (the same prompt on both sides,
    identical answers): ``ratio`` is exp(-median of the pairs' log(new time / old time)), the new release's decode
    speed with the old one's as 1; ``p`` the one-sided signed-rank test's that the new times are longer."""

    outcome: Outcome
    ratio: float | None  # exp(-median log(new / old)) over the pairs: the new release's decode speed, old = 1
    p: float | None
    n_old: int  # the pairs judged (each side's count: the same prompts on both)
    n_new: int
    old_s_per_token: float | None  # medians of each side's time per verify step (per token where none is reported)
    new_s_per_token: float | None
    why: str = ""  # why it could not decide
    # The ratio with the new side's times scaled by the host's calibration ratio (None: the host did not differ).
    adjusted_ratio: float | None = None
    note: str = (
        ""  # a FAIL that stands though the host was busier on the new side: why the contention cannot explain it
    )
    concurrency: int | None = None  # the level these requests were sent at (None: a sample that does not say)
    left_out: int = 0  # prompts answered on both sides whose answers differ: not paired, reported
    per: str = "token"  # what was timed: "verify step" (decode time / spec_verify_ct on both sides) or "token"
    spread: float | None = None  # the pairs' spread (pair_spread, log)
    floor: float | None = None  # the speed ratio below which it FAILs (with p < alpha): the bound less the spread

    @property
    def withheld(self) -> bool:
        return self.outcome in (Outcome.UNDECIDED, Outcome.UNPROVEN)

    @property
    def at(self) -> str:
        """`` at concurrency 8`` (empty for a sample that does not say its level)."""
        return f" at concurrency {self.concurrency}" if self.concurrency is not None else ""

    def figure(self) -> str:
        """``decode 0.85x at concurrency 8 (p=0.0003)``."""
        text = f"decode {self.ratio:.2f}x{self.at}" if self.ratio is not None else f"decode{self.at}"
        return text + (f" (p={p_text(self.p)})" if self.p is not None else "")

    def describe(self) -> str:
        left = f", {self.left_out} left out (answers differ)" if self.left_out else ""
        if self.ratio is None:
            return f"decode{self.at}: cannot decide ({self.why})"
        text = self.figure()
        if self.outcome is Outcome.UNPROVEN:
            return text + f", not proven: {self.why}" + left
        return text + (f", cannot decide: {self.why}" if self.outcome is Outcome.UNDECIDED else "") + left

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": str(self.outcome),
            "ratio": self.ratio,
            "p": self.p,
            "n_baseline": self.n_old,
            "n_candidate": self.n_new,
            "baseline_s_per_token": self.old_s_per_token,
            "candidate_s_per_token": self.new_s_per_token,
            "why": self.why or None,
            "adjusted_ratio": self.adjusted_ratio,
            "note": self.note or None,
            "concurrency": self.concurrency,
            "paired": True,
            "left_out": self.left_out,
            "per": self.per,
            "spread": self.spread,
            "floor": self.floor,
        }


@dataclass(frozen=True)
class Drafts:
    outcome: Outcome
    old_mean: float
    new_mean: float
    p: float | None
    n: int
    why: str = ""

    @property
    def ratio(self) -> float | None:
        return self.new_mean / self.old_mean if self.old_mean > 0 else None

    def describe(self) -> str:
        text = f"accepted drafts {self.old_mean:.1f} -> {self.new_mean:.1f}"
        if self.outcome is Outcome.FAIL and self.p is not None:
            text += f" (p={p_text(self.p)})"
        return text + (f" (cannot decide: {self.why})" if self.outcome is Outcome.UNDECIDED else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": str(self.outcome),
            "baseline_mean": self.old_mean,
            "candidate_mean": self.new_mean,
            "p": self.p,
            "n": self.n,
            "why": self.why or None,
        }


@dataclass(frozen=True)
class Load:
    """Mean running requests around each side's requests; None where the server exposed none."""

    old: float | None
    new: float | None
    bound: float
    host_old: float | None = None  # mean seconds of the host's calibration work (host_s), each side
    host_new: float | None = None

    @property
    def known(self) -> bool:
        return self.old is not None and self.new is not None

    @property
    def differs(self) -> bool:
        return self.old is not None and self.new is not None and load_differs(self.old, self.new, self.bound)

    @property
    def host_ratio(self) -> float | None:
        """How much longer the host's calibration work took on the new side (above 1: the host was busier)."""
        if self.host_old is None or self.host_new is None or min(self.host_old, self.host_new) < MIN_SECONDS:
            return None
        return self.host_new / self.host_old

    @property
    def host_differs(self) -> bool:
        ratio = self.host_ratio
        return ratio is not None and max(ratio, 1 / ratio) > 1 + MAX_HOST_DIFF + 1e-12

    def describe(self) -> str:
        if not self.known:
            return "load unknown (the server exposes no sglang:num_running_reqs: enable --enable-metrics)"
        return f"load {self.old:.3g} vs {self.new:.3g} running requests"

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.old,
            "candidate": self.new,
            "max_load_diff": self.bound,
            "differs": self.differs,
            "host_ratio": self.host_ratio,
            "host_differs": self.host_differs,
        }


@dataclass(frozen=True)
class Failures:
    """Requests that did not answer, by side (indices into the workload)."""

    new_failed: tuple[int, ...]  # the candidate failed where the baseline answered (4xx included)
    new_client_errors: tuple[int, ...]  # of those, HTTP 4xx: the release broke the API
    both_client_errors: tuple[int, ...]  # 4xx on both sides: configuration
    old_failed: tuple[int, ...]  # the baseline did not answer: left out of the comparison

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate_failed": list(self.new_failed),
            "candidate_client_errors": list(self.new_client_errors),
            "both_client_errors": list(self.both_client_errors),
            "baseline_failed": list(self.old_failed),
        }


@dataclass(frozen=True)
class Comparison:
    outcome: Outcome
    reasons: tuple[str, ...]  # why the outcome is not PASS, most severe first (empty on PASS)
    baseline: str  # what the candidate was compared with: a release id, "its deploy", ...
    requests: int  # the workload's requests on each side
    pairs: int  # answered on both sides
    failures: Failures
    answers: Answers | None
    speed: Speed
    drafts: Drafts | None
    load: Load
    ttft_ratio: float | None  # median new TTFT / median old TTFT (below 1 is faster)
    settings: dict[str, float | int]
    # Set by confirm(): what a first sample of the new release showed before this one was judged.
    first_sample: str | None = None
    # Each concurrency level's speed verdict, in the workload's order (``speed`` is the worst of them).
    levels: tuple[Speed, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def line(self) -> str:
        """``compared with rfb4d975 on 16 requests: 16/16 answers identical; decode 1.03x (p=0.41); accepted drafts
        3.2 -> 3.3; TTFT 0.98x``."""
        parts: list[str] = []
        f = self.failures
        if f.new_failed:
            parts.append(f"{len(f.new_failed)} failed on the new release")
        if f.both_client_errors:
            parts.append(f"{len(f.both_client_errors)} refused (4xx) by both")
        if f.old_failed:
            parts.append(f"{len(f.old_failed)} unanswered by the baseline")
        if self.answers is not None:
            parts.append(self.answers.describe())
        if self.pairs or self.speed.ratio is not None:
            parts.extend(level.describe() for level in self.levels or (self.speed,))
        if self.drafts is not None:
            parts.append(self.drafts.describe())
        if self.ttft_ratio is not None:
            parts.append(f"TTFT {self.ttft_ratio:.2f}x")
        if not self.load.known and self.pairs:
            parts.append("load unknown")
        if self.outcome is Outcome.UNDECIDED and not self.pairs:
            parts.append(f"cannot decide: {self.reason}")
        if self.first_sample is not None:
            parts.append(self.first_sample)
        return f"compared with {self.baseline} on {self.requests} requests: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": str(self.outcome),
            "reasons": list(self.reasons),
            "line": self.line(),
            "baseline": self.baseline,
            "requests": self.requests,
            "pairs": self.pairs,
            "failures": self.failures.to_json(),
            "answers": self.answers.to_json() if self.answers is not None else None,
            "speed": self.speed.to_json(),
            "levels": [level.to_json() for level in self.levels or (self.speed,)],
            "drafts": self.drafts.to_json() if self.drafts is not None else None,
            "load": self.load.to_json(),
            "ttft_ratio": self.ttft_ratio,
            "settings": dict(self.settings),
            "first_sample": self.first_sample,
        }


def p_text(p: float | None) -> str:
    """A p-value as the reasons write it: two significant digits, ``1.2e-05`` below 0.001, ``-`` for none."""
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"
