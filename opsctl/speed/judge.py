"""The pre-restart speed check's judge: the timed pairs of the host program (``kdtree_backend.speed_ab``) in, the
verdict and its figures out. Pure.

Each call was timed on both releases once a round, back to back, the order flipped every round: a pair is
``log(new / old)`` of one call in one round. The slowdown is the geometric mean over the calls of each call's
median pair (so that every shape weighs the same, and one busy round moves nothing), the evidence a one-sided Wilcoxon signed-rank test
over all the pairs (:mod:`opsctl.comparison.signedrank`). FAIL when the slowdown is beyond ``max_slowdown`` **and**
``p < alpha``; both numbers come from the measured noise (docs/gate.md "The pre-restart speed check")."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..comparison.signedrank import signed_rank_greater


class SpeedVerdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"  # the check could not run (first deploy, no old build, no GPU free): never a FAIL


@dataclass(frozen=True)
class TimedCall:
    """One call's times on both releases, one pair a round (microseconds)."""

    bs: int
    prefix: int
    q_len: int
    heads: int
    new_us: tuple[float, ...]
    old_us: tuple[float, ...]

    @property
    def label(self) -> str:
        prefix = f"{self.prefix // 1024}k" if self.prefix >= 1024 and self.prefix % 1024 == 0 else str(self.prefix)
        return f"bs {self.bs} x {prefix}"

    def log_ratios(self) -> list[float]:
        return [math.log(n / o) for n, o in zip(self.new_us, self.old_us, strict=True) if n > 0 and o > 0]

    def mean_log_ratio(self) -> float:
        """The call's typical log ratio: the median of its pairs (a round that met a busy moment of the host
        moves the mean, not the median)."""
        ratios = self.log_ratios()
        return statistics.median(ratios) if ratios else 0.0


@dataclass(frozen=True)
class SpeedJudgement:
    verdict: SpeedVerdict
    reason: str
    against: str = ""  # the release timed against
    speed: float | None = None  # old / new time, geometric mean over the calls (< 1: the new one is slower)
    p: float | None = None
    calls: int = 0
    pairs: int = 0
    worst: str = ""  # the slowest shape's label
    worst_speed: float | None = None
    device: str = ""
    elapsed_s: float | None = None

    def line(self) -> str:
        """``speed 0.94x of r3c1 on 24 calls (p=1e-05; worst bs 8 x 32k: 0.91x)``, or why it did not run."""
        if self.verdict is SpeedVerdict.SKIPPED or self.speed is None:
            return f"speed check skipped: {self.reason}"
        return (
            f"speed {self.speed:.3g}x of {self.against} on {self.calls} calls (p={self.p:.2g}; worst {self.worst}: "
            f"{self.worst_speed:.3g}x)"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict), "reason": self.reason, "against": self.against, "speed": self.speed,
            "p": self.p, "calls": self.calls, "pairs": self.pairs, "worst": self.worst,
            "worst_speed": self.worst_speed, "device": self.device, "elapsed_s": self.elapsed_s,
        }  # fmt: skip


def timed_calls(doc: Mapping[str, Any]) -> list[TimedCall]:
    """The host program's document -> its calls (a malformed one raises ValueError, naming what is wrong)."""
    calls = doc.get("calls")
    if not isinstance(calls, list) or not calls:
        raise ValueError("no timed calls in the speed check's output")
    out = []
    for i, c in enumerate(calls):
        try:
            new, old = tuple(float(x) for x in c["new_us"]), tuple(float(x) for x in c["old_us"])
            call = TimedCall(int(c["bs"]), int(c["prefix"]), int(c["q_len"]), int(c["heads"]), new, old)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"call {i} of the speed check's output is malformed ({e})") from None
        if len(new) != len(old) or not new or not all(math.isfinite(x) and x > 0 for x in (*new, *old)):
            raise ValueError(f"call {i} of the speed check's output has unpaired or non-positive times")
        out.append(call)
    return out


def judge_speed(
    calls: Sequence[TimedCall], *, max_slowdown: float, alpha: float, against: str, device: str = "",
    elapsed_s: float | None = None,
) -> SpeedJudgement:  # fmt: skip
    """PASS or FAIL over the pairs of ``calls`` (see the module's docstring)."""
    means = [c.mean_log_ratio() for c in calls]
    pairs = [r for c in calls for r in c.log_ratios()]
    slowdown = math.exp(sum(means) / len(means))  # new / old
    test = signed_rank_greater(pairs)
    worst_i = max(range(len(calls)), key=means.__getitem__)
    common = {
        "against": against, "speed": 1 / slowdown, "p": test.p, "calls": len(calls), "pairs": len(pairs),
        "worst": calls[worst_i].label, "worst_speed": math.exp(-means[worst_i]), "device": device,
        "elapsed_s": elapsed_s,
    }  # fmt: skip
    beyond = slowdown > 1 + max_slowdown
    if beyond and test.p < alpha:
        return SpeedJudgement(
            SpeedVerdict.FAIL,
            f"the new verify path is {slowdown:.3g}x as slow as {against}'s on the same calls (beyond "
            f"{1 + max_slowdown:.4g}x, p={test.p:.2g} < {alpha:g})",
            **common,  # type: ignore[arg-type]
        )
    why = f"within {1 + max_slowdown:.4g}x" if not beyond else f"beyond {1 + max_slowdown:.4g}x but p={test.p:.2g}"
    return SpeedJudgement(SpeedVerdict.PASS, f"{slowdown:.3g}x the time of {against}'s ({why})", **common)  # type: ignore[arg-type]
