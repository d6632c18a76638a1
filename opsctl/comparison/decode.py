"""The comparison's decode-speed judge (docs/gate.md "The comparison", "The statistics"): the same prompt on both
sides paired, within each concurrency level, its times judged by the one-sided signed-rank test
(opsctl/comparison/signedrank.py), the load and the host's calibration compared within the level. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .results import (
    MAX_HOST_DIFF,
    MAX_TRUSTED_SPREAD,
    MIN_PAIRS,
    MIN_SECONDS,
    NOISE_MARGIN,
    Load,
    Outcome,
    Speed,
    Thresholds,
)
from .sample import CompareRequest
from .signedrank import signed_rank_greater


def divergence(old: Sequence[int], new: Sequence[int], tokens: int) -> int | None:
    """The first token index (< ``tokens``) where two outputs differ, None when identical over the first
    ``tokens``; an output that ends earlier than the other (EOS) diverges where it ends."""
    a, b = old[:tokens], new[:tokens]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _mean_load(requests: Sequence[CompareRequest]) -> float | None:
    loads = [r.load for r in requests if r.load is not None]
    return statistics.fmean(loads) if loads else None


def _host_mean(requests: Sequence[CompareRequest]) -> float | None:
    # The mean, not the median: on a shared host the calibration is bimodal (the CPU free, or taken), and the
    # mean follows the share of requests that ran while it was taken, where the median jumps between the modes.
    times = [r.host_s for r in requests if r.host_s is not None]
    return statistics.fmean(times) if times else None


def load_of(old: Sequence[CompareRequest], new: Sequence[CompareRequest], settings: Thresholds) -> Load:
    """The load the server reported and the host's calibration around each side's requests."""
    return Load(_mean_load(old), _mean_load(new), settings.max_load_diff, _host_mean(old), _host_mean(new))


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


@dataclass(frozen=True)
class _Measured:
    """One level's pairs, measured: the figures every verdict of :func:`judge_speed` reports."""

    diffs: list[float]  # log(new / old), each pair
    ratio: float  # exp(-median of diffs): the new release's decode speed, old = 1
    p: float
    old_median: float
    new_median: float
    spread: float
    bound: float  # 1 - max_slowdown
    floor: float  # the bound less the noise margin: below it (with p < alpha) a FAIL
    beyond: bool  # a slowdown beyond the bound, measured
    slow: bool  # ... and beyond the pairs' own noise: a FAIL
    concurrency: int | None
    left_out: int
    per: str

    @property
    def withheld(self) -> Outcome:
        """A verdict the load or the host withholds: UNPROVEN when the measured decode is beyond the bound."""
        return Outcome.UNPROVEN if self.beyond else Outcome.UNDECIDED

    @property
    def untrusted(self) -> bool:
        """Noisier than the margin is trusted for (:data:`MAX_TRUSTED_SPREAD`)."""
        return self.spread > MAX_TRUSTED_SPREAD

    @property
    def noisy(self) -> str:
        return (
            f"the pairs' own spread ({self.spread:.2f} in log, trusted up to {MAX_TRUSTED_SPREAD:g}) puts the FAIL "
            f"bound at {self.floor:.2f}x: too noisy a sample to tell {self.ratio:.2f}x from its noise"
        )

    def speed(self, outcome: Outcome, why: str = "", *, adjusted_ratio: float | None = None, note: str = "") -> Speed:
        n = len(self.diffs)
        measured = (self.ratio, self.p, n, n, self.old_median, self.new_median)
        level = (self.concurrency, self.left_out, self.per, self.spread, self.floor)
        return Speed(outcome, *measured, why, adjusted_ratio, note, *level)


def _measure(
    pairs: Sequence[tuple[float, float]], settings: Thresholds, concurrency: int | None, left_out: int, per: str
) -> _Measured:
    diffs = [math.log(b / a) for a, b in pairs]
    middle = statistics.median(diffs)
    ratio = math.exp(-middle)
    p = signed_rank_greater(diffs).p
    spread = pair_spread(diffs, middle)
    bound = 1 - settings.max_slowdown
    floor = bound * math.exp(-NOISE_MARGIN * spread)
    return _Measured(
        diffs=diffs,
        ratio=ratio,
        p=p,
        old_median=statistics.median(a for a, _ in pairs),
        new_median=statistics.median(b for _, b in pairs),
        spread=spread,
        bound=bound,
        floor=floor,
        beyond=ratio < bound and p < settings.alpha,
        slow=ratio < floor and p < settings.alpha,
        concurrency=concurrency,
        left_out=left_out,
        per=per,
    )


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
    if n < MIN_PAIRS or 0.5**n >= settings.alpha:
        why = f"too few paired prompts ({n})"
        return Speed(
            Outcome.UNDECIDED, None, None, n, n, None, None, why, concurrency=concurrency, left_out=left_out, per=per
        )
    m = _measure(pairs, settings, concurrency, left_out, per)
    if load is not None and load.differs:
        why = f"the load differed ({load.old:.3g} vs {load.new:.3g} running requests, bound {1 + load.bound:g}x)"
        return m.speed(m.withheld, why)
    host = load.host_ratio if load is not None and load.host_differs else None
    if host is not None:
        return _judge_on_a_busier_host(m, host, settings)
    # The noise margin keeps a noisy A/A sample from FAILing; past MAX_TRUSTED_SPREAD it must not turn a measured
    # slowdown into a PASS: such a sample proves nothing.
    if m.beyond and not m.slow and m.untrusted:
        return m.speed(Outcome.UNPROVEN, m.noisy)
    return m.speed(Outcome.FAIL if m.slow else Outcome.PASS)


def _judge_on_a_busier_host(m: _Measured, host: float, settings: Thresholds) -> Speed:
    """The host's contention withholds only the verdict it can explain. The new side's times as they would have
    been on the old side's host (scaled by the calibration ratio ``host``) give the adjusted ratio and its test: a
    slowdown that holds even so stands (a 1.16x busier host does not make 0.63x), one that vanishes is withheld; a
    PASS is withheld when the adjusted figures show a slowdown (a busier old side can hide one), else it stands."""
    adjusted = m.ratio * host
    adjusted_p = signed_rank_greater([d - math.log(host) for d in m.diffs]).p
    adjusted_slow = adjusted < m.floor and adjusted_p < settings.alpha
    if m.untrusted and m.beyond and not m.slow and not adjusted_slow:
        # Too noisy a sample to trust its margin, whatever the calibration says of it: an A/A testbed deploy
        # measured 0.69x (p=1.5e-05, spread 0.19) with the host 1.28x busier on the new side and passed on the
        # adjusted 1.0x, which a slower release measured so would have too.
        return m.speed(Outcome.UNPROVEN, m.noisy, adjusted_ratio=adjusted)
    text = (
        f"a fixed CPU calibration took {host:.2f}x as long on the new side; bound {1 + MAX_HOST_DIFF:g}x; "
        f"decode {adjusted:.2f}x allowing for it"
    )
    if m.slow == adjusted_slow:
        explains = m.slow and host > 1
        note = f"the host was busier on the new side ({text}): it cannot explain the slowdown" if explains else ""
        return m.speed(Outcome.FAIL if m.slow else Outcome.PASS, adjusted_ratio=adjusted, note=note)
    return m.speed(m.withheld, f"the host itself was busier on one side ({text})", adjusted_ratio=adjusted)


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


def _level_speed(
    olds: Sequence[CompareRequest], news: Sequence[CompareRequest], settings: Thresholds, level: int | None
) -> Speed:
    """One level's verdict: its requests answered on both sides with identical answers paired by prompt."""
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
    load = load_of(olds, news, settings)
    return judge_speed(a_times, b_times, settings, load, concurrency=level, left_out=left_out, per=per)


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
    return tuple(
        _level_speed([old[i] for i in indices], [new[i] for i in indices], settings, level)
        for level, indices in levels.items()
    )


def worst(levels: Sequence[Speed]) -> Speed:
    """The level whose verdict is the most severe (then the slowest): the comparison's ``speed``."""
    return max(levels, key=lambda s: (s.outcome.rank, -(s.ratio if s.ratio is not None else math.inf)))
