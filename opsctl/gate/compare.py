"""The comparison's judge (docs/gate.md "The comparison"): two samples of the same workload, the release being
replaced (the baseline) and the new one (the candidate), in; a verdict with its figures out. Pure: no I/O, no
clock; the deploy, ``opsctl restart``, ``opsctl health --probe`` and ``opsctl compare`` all ask it.

What it judges, request by request in workload order (request i is the same prompt on both sides):

* **Requests.** A request the candidate fails where the baseline answered is a FAIL (HTTP 4xx there: the release
  broke the API). A 4xx on both sides is ERROR: the workload does not fit the server (configuration), no verdict
  on the release. Requests the baseline did not answer are left out; fewer than :func:`min_pairs` answered on
  both sides and the comparison cannot decide (UNDECIDED, never a FAIL).
* **Answers.** Identical output ids over the first ``compare_tokens``, else the index where they first diverge;
  FAIL when fewer than ``min_identical`` (a fraction) of the prompts agree. The agreement is always reported.
* **Decode speed.** Seconds per token after the first, new against old: the one-sided Mann-Whitney U test
  (opsctl/gate/mannwhitney.py) that the new ones are larger; FAIL when the ratio of the medians (old / new, the
  speed ratio: below 1 is slower) is below ``1 - max_slowdown`` **and** p < ``alpha``. When the load the server
  reported (``sglang:num_running_reqs``) differs between the sides beyond ``max_load_diff`` the speed cannot be
  decided; when the server reports none the speed is judged as measured and the report says the load is unknown.
  Nor can it when the host itself was busier on one side and that contention can explain the verdict: a fixed
  piece of CPU work timed on the host around each request (``host_s``) took more than :data:`MAX_HOST_DIFF`
  longer on one side, and the decode ratio adjusted by that calibration ratio (the new side's times scaled to the
  old side's host) says otherwise than the ratio measured (a FAIL that holds even so stands, as does a PASS).
  A speed verdict withheld while the measured decode is beyond the bound (slower than ``1 - max_slowdown`` at
  p < ``alpha``) is UNPROVEN, never a PASS, as is a slowdown beyond the bound that only the noise margin
  (:data:`NOISE_MARGIN` x the pairs' own spread) keeps from a FAIL in a sample noisier than the margin is trusted for
  (:data:`MAX_TRUSTED_SPREAD`): the caller measures again, and when it stays so the release is not
  proven (a deploy rolls back without marking it bad).
* **Accepted drafts.** When both sides report ``spec_accept_length``: FAIL when the mean drops by more than
  ``max_accept_drop`` (relative) **and** the same test says p < ``alpha``. Not affected by load (it is a property
  of the tokens, not of time), so judged whatever the load.
* **TTFT.** Reported (median new / old), never judged: the first token after a restart pays for cold caches.
* **A speed FAIL is measured twice.** Decode speed is the one figure that something outside the release (other
  work on a shared host, the minutes between the two sides) can move for a while; answers, accepted drafts and
  failed requests are properties of the release. So when speed is the only FAIL (:func:`only_speed_fails`) the
  caller takes a second sample of the new release and :func:`confirm` judges that one: the FAIL stands only when
  it repeats. An UNPROVEN speed is measured again the same way (:func:`needs_another_sample`).

The outcome is the worst of the parts: FAIL, then ERROR, then UNPROVEN, then UNDECIDED, else PASS; ``reasons`` name the figure
(``decode 0.71x of rfb4d975 (p=0.002, 16 vs 16 requests)``), ``line()`` is the one line a deploy prints.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from .mannwhitney import mann_whitney_greater, smallest_p
from .sample import CompareRequest, ComparisonSample
from .signedrank import signed_rank_greater

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


def min_pairs(requests: int) -> int:
    """The fewest requests answered on both sides that a comparison of ``requests`` decides on: half the workload,
    and at least :data:`MIN_PAIRS`."""
    return max(MIN_PAIRS, math.ceil(requests / 2))


def load_differs(old: float, new: float, bound: float) -> bool:
    """Whether two loads (running requests, the comparison's own included) differ beyond ``bound``: the busier
    side's (1 + load) over the quieter side's is above 1 + bound. The 1 stands for the comparison's own request,
    so that 0 against 0.4 running requests on an idle host is no difference, and 20 against 5 is."""
    hi, lo = max(old, new), min(old, new)
    return (1 + hi) / (1 + lo) > 1 + bound + 1e-12


def divergence(old: Sequence[int], new: Sequence[int], tokens: int) -> int | None:
    """The first token index (< ``tokens``) where two outputs differ, None when identical over the first
    ``tokens``; an output that ends earlier than the other (EOS) diverges where it ends."""
    a, b = old[:tokens], new[:tokens]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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
        return text + (f" (p={_p(self.p)})" if self.p is not None else "")

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
            text += f" (p={_p(self.p)})"
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


# ------------------------------------------------------------------------------------------------ the judge


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def _status(r: CompareRequest) -> str:
    if r.status is not None and r.status != 200:
        return f"HTTP {r.status}" + (f": {r.error[:80]}" if r.error else "")
    return r.error[:80] if r.error else "no answer"


def _examples(requests: Sequence[CompareRequest], indices: Sequence[int]) -> str:
    return "; ".join(dict.fromkeys(_status(requests[i]) for i in indices[:8]))


def _mean_load(requests: Sequence[CompareRequest]) -> float | None:
    loads = [r.load for r in requests if r.load is not None]
    return statistics.fmean(loads) if loads else None


def _host_mean(requests: Sequence[CompareRequest]) -> float | None:
    # The mean, not the median: on a shared host the calibration is bimodal (the CPU free, or taken), and the
    # mean follows the share of requests that ran while it was taken, where the median jumps between the modes.
    times = [r.host_s for r in requests if r.host_s is not None]
    return statistics.fmean(times) if times else None


def per_step(a: CompareRequest, b: CompareRequest) -> tuple[float, float, str] | None:
    """The two times of one prompt to pair: decode seconds per verify step (decode time / ``spec_verify_ct``) when
    both sides report both, else seconds per token; None when a side has no decode time."""
    if (
        a.decode_s is not None
        and b.decode_s is not None
        and a.spec_verify_ct is not None
        and b.spec_verify_ct is not None
        and min(a.spec_verify_ct, b.spec_verify_ct) > 0
    ):
        return a.decode_s / a.spec_verify_ct, b.decode_s / b.spec_verify_ct, "verify step"
    if a.decode_s_per_token is None or b.decode_s_per_token is None:
        return None
    return a.decode_s_per_token, b.decode_s_per_token, "token"


def pair_spread(diffs: Sequence[float], middle: float | None = None) -> float:
    """The pairs' own spread: 1.4826 x the median absolute deviation of their log ratios (the standard deviation
    for normal noise, and unmoved by a few outliers: a GC pause on one side widens nothing)."""
    middle = statistics.median(diffs) if middle is None else middle
    return 1.4826 * statistics.median(abs(d - middle) for d in diffs)


def judge_speed(
    old: Sequence[float],
    new: Sequence[float],
    settings: Thresholds,
    load: Load | None = None,
    *,
    concurrency: int | None = None,
    left_out: int = 0,
    per: str = "token",
) -> Speed:
    """The decode-speed verdict over paired times (``old[i]`` and ``new[i]``: the same prompt on each side; a pair
    with a value below :data:`MIN_SECONDS` is not a measurement and is left out). The pairs' log(new / old) are
    judged by the one-sided signed-rank test (the new times longer) and their median: FAIL when the speed ratio
    exp(-median) is below ``1 - max_slowdown`` and p < ``alpha``. Withheld (UNDECIDED) when the load differed, or
    when the host's contention on one side can explain the verdict (the pairs adjusted by the host's calibration
    ratio say otherwise); UNPROVEN instead of UNDECIDED when the measured decode is beyond the bound: a withheld
    slowdown is never a PASS. UNPROVEN too when the slowdown is beyond the bound and within the noise margin of a
    sample noisier than :data:`MAX_TRUSTED_SPREAD`: a sample too noisy to judge is measured again, never passed."""
    pairs = [(a, b) for a, b in zip(old, new, strict=True) if a >= MIN_SECONDS and b >= MIN_SECONDS]
    n = len(pairs)
    c = concurrency
    if n < MIN_PAIRS or 0.5**n >= settings.alpha:
        why = f"too few paired prompts ({n})"
        return Speed(Outcome.UNDECIDED, None, None, n, n, None, None, why, concurrency=c, left_out=left_out, per=per)
    diffs = [math.log(b / a) for a, b in pairs]
    old_median, new_median = statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)
    middle = statistics.median(diffs)
    ratio = math.exp(-middle)
    p = signed_rank_greater(diffs).p
    spread = pair_spread(diffs, middle)
    bound = 1 - settings.max_slowdown
    floor = bound * math.exp(-NOISE_MARGIN * spread)
    beyond = ratio < bound and p < settings.alpha  # a slowdown beyond the bound, measured
    slow = ratio < floor and p < settings.alpha  # ... and beyond the pairs' own noise: a FAIL
    withheld = Outcome.UNPROVEN if beyond else Outcome.UNDECIDED
    figures = {"concurrency": c, "left_out": left_out, "per": per, "spread": spread, "floor": floor}
    # The noise margin keeps a noisy A/A sample from FAILing; past MAX_TRUSTED_SPREAD it must not turn a measured
    # slowdown into a PASS: such a sample proves nothing.
    untrusted = spread > MAX_TRUSTED_SPREAD
    noisy = (
        f"the pairs' own spread ({spread:.2f} in log, trusted up to {MAX_TRUSTED_SPREAD:g}) puts the FAIL bound at "
        f"{floor:.2f}x: too noisy a sample to tell {ratio:.2f}x from its noise"
    )
    if load is not None and load.differs:
        why = f"the load differed ({load.old:.3g} vs {load.new:.3g} running requests, bound {1 + load.bound:g}x)"
        return Speed(withheld, ratio, p, n, n, old_median, new_median, why, **figures)  # type: ignore[arg-type]
    host = load.host_ratio if load is not None and load.host_differs else None
    if host is None:
        if beyond and not slow and untrusted:
            return Speed(Outcome.UNPROVEN, ratio, p, n, n, old_median, new_median, noisy, **figures)  # type: ignore[arg-type]
        verdict = Outcome.FAIL if slow else Outcome.PASS
        return Speed(verdict, ratio, p, n, n, old_median, new_median, **figures)  # type: ignore[arg-type]
    # The host's contention withholds only the verdict it can explain. The new side's times as they would have been
    # on the old side's host (scaled by the calibration ratio) give the adjusted ratio and its test: a slowdown that
    # holds even so stands (a 1.16x busier host does not make 0.63x), one that vanishes is withheld; a PASS is
    # withheld when the adjusted figures show a slowdown (a busier old side can hide one), else it stands.
    adjusted = ratio * host
    adjusted_p = signed_rank_greater([d - math.log(host) for d in diffs]).p
    adjusted_slow = adjusted < floor and adjusted_p < settings.alpha
    if untrusted and not slow and not adjusted_slow and beyond and adjusted < bound and adjusted_p < settings.alpha:
        return Speed(
            Outcome.UNPROVEN, ratio, p, n, n, old_median, new_median, noisy, adjusted_ratio=adjusted, **figures
        )  # type: ignore[arg-type]
    text = (
        f"a fixed CPU calibration took {host:.2f}x as long on the new side; bound {1 + MAX_HOST_DIFF:g}x; "
        f"decode {adjusted:.2f}x allowing for it"
    )
    if slow == adjusted_slow:
        explains = slow and host > 1
        note = f"the host was busier on the new side ({text}): it cannot explain the slowdown" if explains else ""
        verdict = Outcome.FAIL if slow else Outcome.PASS
        return Speed(
            verdict,
            ratio,
            p,
            n,
            n,
            old_median,
            new_median,
            adjusted_ratio=adjusted,
            note=note,
            **figures,  # type: ignore[arg-type]
        )
    why = f"the host itself was busier on one side ({text})"
    return Speed(withheld, ratio, p, n, n, old_median, new_median, why, adjusted_ratio=adjusted, **figures)  # type: ignore[arg-type]


def request_levels(old: Sequence[CompareRequest], new: Sequence[CompareRequest]) -> list[int | None] | None:
    """The concurrency level of each request pair; None when the two sides sent them at other levels. A side
    written before levels were recorded (every ``concurrency`` null) takes the other side's: its requests were
    sent one at a time (``health --probe`` against a deploy's older sample), as the new one's first level is."""
    a, b = [r.concurrency for r in old], [r.concurrency for r in new]
    if all(v is None for v in a):
        a = b
    if all(v is None for v in b):
        b = a
    return a if a == b else None


def judge_levels(
    old: Sequence[CompareRequest],
    new: Sequence[CompareRequest],
    settings: Thresholds,
    sent_at: Sequence[int | None] | None = None,
) -> tuple[Speed, ...]:
    """Each concurrency level's speed verdict, in the order the levels first appear: its requests answered on both
    sides with identical answers (over ``compare_tokens``) paired by prompt; those whose answers differ are left
    out (and counted); the load and the host's calibration compared within the level."""
    levels: dict[int | None, list[int]] = {}
    for i, r in enumerate(old):
        levels.setdefault(sent_at[i] if sent_at is not None else r.concurrency, []).append(i)
    out = []
    for level, indices in levels.items():
        olds, news = [old[i] for i in indices], [new[i] for i in indices]
        load = Load(_mean_load(olds), _mean_load(news), settings.max_load_diff, _host_mean(olds), _host_mean(news))
        a_times: list[float] = []
        b_times: list[float] = []
        kinds = set()
        left_out = 0
        answered = [(a, b) for a, b in zip(olds, news, strict=True) if a.ok and b.ok]
        # Per verify step only when every pair can be so: one measure for the whole level.
        step = all(per_step(a, b) is None or per_step(a, b)[2] == "verify step" for a, b in answered)  # type: ignore[index]
        for a, b in answered:
            if divergence(a.output_ids, b.output_ids, settings.compare_tokens) is not None:
                left_out += 1
                continue
            times = per_step(a, b) if step else per_step(replace(a, decode_s=None), replace(b, decode_s=None))
            if times is None:
                continue
            a_times.append(times[0])
            b_times.append(times[1])
            kinds.add(times[2])
        per = "verify step" if kinds == {"verify step"} else "token"
        out.append(judge_speed(a_times, b_times, settings, load, concurrency=level, left_out=left_out, per=per))
    return tuple(out)


def worst(levels: Sequence[Speed]) -> Speed:
    """The level whose verdict is the most severe (then the slowest): the comparison's ``speed``."""
    return max(levels, key=lambda s: (s.outcome.rank, -(s.ratio if s.ratio is not None else math.inf)))


def judge_drafts(old: Sequence[float], new: Sequence[float], settings: Thresholds) -> Drafts:
    """The accepted-drafts verdict over per-request ``spec_accept_length``."""
    old_mean = statistics.fmean(old) if old else 0.0
    new_mean = statistics.fmean(new) if new else 0.0
    n = min(len(old), len(new))
    if n < MIN_PAIRS or smallest_p(len(old), len(new)) >= settings.alpha:
        return Drafts(Outcome.UNDECIDED, old_mean, new_mean, None, n, f"too few requests report it ({n})")
    p = mann_whitney_greater(old, new).p
    dropped = new_mean < old_mean * (1 - settings.max_accept_drop) and p < settings.alpha
    return Drafts(Outcome.FAIL if dropped else Outcome.PASS, old_mean, new_mean, p, n)


def _failures(old: Sequence[CompareRequest], new: Sequence[CompareRequest]) -> Failures:
    new_failed, new_4xx, both_4xx, old_failed = [], [], [], []
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a.client_error and b.client_error:
            both_4xx.append(i)
        elif not a.ok:
            old_failed.append(i)
        elif not b.ok:
            new_failed.append(i)
            if b.client_error:
                new_4xx.append(i)
    return Failures(tuple(new_failed), tuple(new_4xx), tuple(both_4xx), tuple(old_failed))


def _answers(pairs: Sequence[tuple[int, CompareRequest, CompareRequest]], settings: Thresholds) -> Answers:
    tokens = settings.compare_tokens
    diverged = []
    for i, a, b in pairs:
        at = divergence(a.output_ids, b.output_ids, tokens)
        if at is not None:
            diverged.append((i, at))
    identical = len(pairs) - len(diverged)
    ok = identical >= settings.min_identical * len(pairs) - 1e-9
    return Answers(Outcome.PASS if ok else Outcome.FAIL, len(pairs), identical, tokens, tuple(diverged))


def _settings_doc(settings: Thresholds) -> dict[str, float | int]:
    names = ("compare_tokens", "min_identical", "max_slowdown", "alpha", "max_accept_drop", "max_load_diff")
    return {name: getattr(settings, name) for name in names}


def compare(
    old: ComparisonSample, new: ComparisonSample, settings: Thresholds, *, baseline: str = "the baseline"
) -> Comparison:
    """Judge the candidate ``new`` against the baseline ``old`` (the same workload, request for request).
    ``baseline`` names the baseline in the reasons (a release id, or "its deploy" for the drift check)."""
    load = Load(
        _mean_load(old.requests),
        _mean_load(new.requests),
        settings.max_load_diff,
        _host_mean(old.requests),
        _host_mean(new.requests),
    )
    n = max(len(old.requests), len(new.requests))
    doc = _settings_doc(settings)
    if len(old.requests) != len(new.requests):
        why = f"not the same workload: {len(old.requests)} requests against {len(new.requests)}"
        return _undecided(why, baseline, n, load, doc)
    if not old.requests:
        return _undecided("the samples hold no request", baseline, 0, load, doc)
    failures = _failures(old.requests, new.requests)
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(old.requests, new.requests, strict=True)) if a.ok and b.ok]
    sent_at = request_levels(old.requests, new.requests)
    if sent_at is None:
        why = "not the same workload: the requests were sent at other concurrency levels"
        return _undecided(why, baseline, n, load, doc)
    levels = judge_levels(old.requests, new.requests, settings, sent_at)
    speed = worst(levels)
    reported = [(a.spec_accept_length, b.spec_accept_length) for _, a, b in pairs]
    reported = [(a, b) for a, b in reported if a is not None and b is not None]
    drafts = judge_drafts([a for a, _ in reported], [b for _, b in reported], settings) if reported else None
    ttfts = [
        (a.ttft_s, b.ttft_s)
        for _, a, b in pairs
        if a.ttft_s is not None and b.ttft_s is not None and min(a.ttft_s, b.ttft_s) >= MIN_SECONDS
    ]
    ttft_ratio = statistics.median(b for _, b in ttfts) / statistics.median(a for a, _ in ttfts) if ttfts else None
    answers = _answers(pairs, settings) if pairs else None
    enough = len(pairs) >= min_pairs(n)

    found: list[tuple[Outcome, str]] = []
    if failures.new_client_errors:
        k = len(failures.new_client_errors)
        found.append(
            (
                Outcome.FAIL,
                f"the new release refused {k} of {n} requests that {baseline} answered "
                f"({_examples(new.requests, failures.new_client_errors)}): it broke the API",
            )
        )
    other = [i for i in failures.new_failed if i not in failures.new_client_errors]
    if other:
        found.append(
            (Outcome.FAIL, f"{len(other)} of {n} requests failed on the new release ({_examples(new.requests, other)})")
        )
    if failures.both_client_errors:
        k = len(failures.both_client_errors)
        found.append(
            (
                Outcome.ERROR,
                f"{k} of {n} requests refused by both releases ({_examples(new.requests, failures.both_client_errors)}):"
                " the workload does not fit this server (gate.compare)",
            )
        )
    if not enough:
        found.append(
            (
                Outcome.UNDECIDED,
                f"too few requests answered on both sides to decide ({len(pairs)} of {n}; need {min_pairs(n)})",
            )
        )
    else:
        if answers is not None and answers.outcome is Outcome.FAIL:
            found.append(
                (
                    Outcome.FAIL,
                    f"answers: {answers.identical}/{answers.judged} identical over the first {answers.compare_tokens} "
                    f"tokens (need {settings.min_identical:.0%}); {answers.diverged()}",
                )
            )
        for level in sorted(levels, key=lambda s: -s.outcome.rank):
            found.extend(_speed_reason(level, baseline, settings))
        if drafts is not None and drafts.outcome is Outcome.FAIL:
            found.append(
                (
                    Outcome.FAIL,
                    f"accepted drafts {drafts.old_mean:.2f} -> {drafts.new_mean:.2f} of {baseline} "
                    f"(-{1 - drafts.new_mean / drafts.old_mean:.0%}, p={_p(drafts.p)}; fails beyond "
                    f"-{settings.max_accept_drop:.0%})",
                )
            )
    outcome = max((o for o, _ in found), key=lambda o: o.rank, default=Outcome.PASS)
    reasons = tuple(text for o, text in sorted(found, key=lambda f: -f[0].rank))
    return Comparison(
        outcome=outcome,
        reasons=reasons,
        baseline=baseline,
        requests=n,
        pairs=len(pairs),
        failures=failures,
        answers=answers,
        speed=speed,
        drafts=drafts,
        load=load,
        ttft_ratio=ttft_ratio,
        settings=doc,
        levels=levels,
    )


def _speed_reason(speed: Speed, baseline: str, settings: Thresholds) -> list[tuple[Outcome, str]]:
    """The reason one level's speed gives (none on PASS): ``decode 0.85x of r1 at concurrency 8 (p=0.0003, 16
    prompts paired; fails below 0.94x at p < 0.01)``."""
    if speed.ratio is None or speed.outcome is Outcome.PASS:
        if speed.outcome is Outcome.UNDECIDED:
            return [(Outcome.UNDECIDED, f"decode speed{speed.at}: cannot decide: {speed.why}")]
        return []
    left = f", {speed.left_out} left out: answers differ" if speed.left_out else ""
    head = f"decode {speed.ratio:.2f}x of {baseline}{speed.at} (p={_p(speed.p)}, {speed.n_old} prompts paired{left}; "
    # An UNPROVEN speed is beyond the bound itself, not always beyond the bound less the noise margin.
    floor = speed.floor if speed.floor is not None and speed.outcome is Outcome.FAIL else 1 - settings.max_slowdown
    bound = f"{floor:.2f}x at p < {settings.alpha:g}"
    if speed.outcome is Outcome.FAIL:
        return [(Outcome.FAIL, head + f"fails below {bound})" + (f"; {speed.note}" if speed.note else ""))]
    if speed.outcome is Outcome.UNPROVEN:
        text = head + f"beyond {bound}) but the speed cannot be decided: {speed.why}: not proven, never a PASS"
        return [(Outcome.UNPROVEN, text)]
    return [(Outcome.UNDECIDED, f"decode speed{speed.at}: cannot decide: {speed.why}")]


def only_speed_fails(result: Comparison) -> bool:
    """Whether ``result`` FAILs on decode speed and on nothing else: no failed request, the answers and the
    accepted drafts not failing. Such a FAIL is confirmed on a second sample before it stands (:func:`confirm`)."""
    return (
        result.outcome is Outcome.FAIL
        and result.speed.outcome is Outcome.FAIL
        and not result.failures.new_failed
        and (result.answers is None or result.answers.outcome is not Outcome.FAIL)
        and (result.drafts is None or result.drafts.outcome is not Outcome.FAIL)
    )


def needs_another_sample(result: Comparison) -> bool:
    """Whether the caller measures the new release again before ``result`` stands: a FAIL on decode speed alone
    (:func:`only_speed_fails`), or a slowdown beyond the bound whose verdict was withheld (UNPROVEN)."""
    return only_speed_fails(result) or result.outcome is Outcome.UNPROVEN


_ORDINALS = ("first", "second", "third", "fourth")


def confirm(first: Comparison, second: Comparison, *, earlier: int = 1) -> Comparison:
    """The verdict after a speed-only FAIL or an UNPROVEN speed (``first``): the comparison of another sample of the
    new release with the same baseline (``second``), which names what the earlier one showed (``earlier``: how
    many samples were judged before ``second``). The FAIL stands only when it repeats: a slower release is slower
    every time, a busy minute on the host is not; a withheld slowdown that repeats stays UNPROVEN."""
    ordinal = _ORDINALS[min(earlier, len(_ORDINALS)) - 1]
    figure = first.speed.figure() if first.speed.ratio is not None else "a FAIL"
    if first.speed.outcome is Outcome.UNPROVEN:
        figure += " withheld"
    if second.speed.outcome in (Outcome.FAIL, Outcome.UNPROVEN):
        note = f"a {ordinal} sample too: {figure}"
    else:
        note = f"a {ordinal} sample's {figure} not repeated"
    if first.first_sample:
        note = f"{first.first_sample}; {note}"
    withheld = [level for level in second.levels or (second.speed,) if level.why and level.ratio is not None]
    slowed = first.speed.outcome in (Outcome.FAIL, Outcome.UNPROVEN)
    if (
        slowed
        and second.outcome.rank < Outcome.UNPROVEN.rank
        and any(lv.outcome is Outcome.UNDECIDED for lv in withheld)
    ):
        # A slowdown measured, then a sample whose speed verdict the load or the host withheld: nothing says the
        # slowdown went away, so no PASS (measured again while samples are left, else not proven).
        level = min((lv for lv in withheld if lv.outcome is Outcome.UNDECIDED), key=lambda lv: lv.ratio or 0.0)
        text = (
            f"{level.figure()} withheld ({level.why}) after a slowdown measured on an earlier sample: "
            "not proven, never a PASS"
        )
        return replace(second, outcome=Outcome.UNPROVEN, reasons=(text, *second.reasons), first_sample=note)
    return replace(second, first_sample=note)


def judge_alone(sample: ComparisonSample) -> tuple[Outcome, str]:
    """A new release's sample with nothing to compare it with (the baseline was skipped): its requests must still
    be answered. A request failing is a FAIL; when every failure is an HTTP 4xx it cannot be told from a workload
    that does not fit the server (no baseline answered it), so that is ERROR, never marking the release bad."""
    n = len(sample.requests)
    failed = [i for i, r in enumerate(sample.requests) if not r.ok]
    if not failed:
        return Outcome.PASS, ""
    text = f"{len(failed)} of {n} requests failed on the new release ({_examples(sample.requests, failed)})"
    if all(sample.requests[i].client_error for i in failed):
        return Outcome.ERROR, text + ": with no baseline, a 4xx may be the workload's (gate.compare)"
    return Outcome.FAIL, text


def rules_line(settings: Thresholds, *, enforce: bool) -> str:
    """The judge's rules in words, for ``deploy --dry-run``."""
    return (
        f"comparison: FAIL when a request fails on the new release, fewer than {settings.min_identical:.0%} of the "
        f"answers are identical over {settings.compare_tokens} tokens, decode is below "
        f"{1 - settings.max_slowdown:.2f}x of the old release (less {NOISE_MARGIN:g}x the pairs' spread) at p < "
        f"{settings.alpha:g} at any concurrency level (the same prompt on both sides paired, a one-sided Wilcoxon "
        "signed-rank test over the pairs; "
        f"cannot decide when the load differs beyond {1 + settings.max_load_diff:g}x), or accepted drafts drop by "
        f"more than {settings.max_accept_drop:.0%} at p < {settings.alpha:g}; "
        + ("a FAIL rolls back (enforce: true)" if enforce else "reported only (enforce: false)")
    )


def _undecided(why: str, baseline: str, n: int, load: Load, doc: dict[str, float | int]) -> Comparison:
    return Comparison(
        outcome=Outcome.UNDECIDED,
        reasons=(why,),
        baseline=baseline,
        requests=n,
        pairs=0,
        failures=Failures((), (), (), ()),
        answers=None,
        speed=Speed(Outcome.UNDECIDED, None, None, 0, 0, None, None, why),
        drafts=None,
        load=load,
        ttft_ratio=None,
        settings=doc,
    )
