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
* **Decode speed** (opsctl/comparison/decode.py). Within each concurrency level, the same prompt's times paired (per
  verify step, else per token after the first), new against old: the one-sided signed-rank test
  (opsctl/comparison/signedrank.py) that the new ones are longer; FAIL when the speed ratio (exp of minus the pairs'
  median log(new / old): below 1 is slower) is below ``1 - max_slowdown`` **and** p < ``alpha``. When the load the
  server reported (``sglang:num_running_reqs``) differs between the sides beyond ``max_load_diff`` the speed cannot be
  decided; when the server reports none the speed is judged as measured and the report says the load is unknown. Nor
  can it when the host itself was busier on one side and that contention can explain the verdict: a fixed piece of CPU
  work timed on the host around each request (``host_s``) took more than :data:`MAX_HOST_DIFF` longer on one side, and
  the decode ratio adjusted by that calibration ratio (the new side's times scaled to the old side's host) says
  otherwise than the ratio measured (a FAIL that holds even so stands, as does a PASS). A speed verdict withheld while
  the measured decode is beyond the bound (slower than ``1 - max_slowdown`` at p < ``alpha``) is UNPROVEN, never a
  PASS, as is a slowdown beyond the bound that only the noise margin (:data:`NOISE_MARGIN` x the pairs' own spread)
  keeps from a FAIL in a sample noisier than the margin is trusted for (:data:`MAX_TRUSTED_SPREAD`): the caller measures again, and when it stays so the release is not proven (a deploy rolls back
  without marking it bad).
* **Accepted drafts.** When both sides report ``spec_accept_length``: FAIL when the mean drops by more than
  ``max_accept_drop`` (relative) **and** the one-sided Mann-Whitney U test (opsctl/comparison/mannwhitney.py)
  says p < ``alpha``. Not affected by load (it is a property of the tokens, not of time), so judged whatever the
  load.
* **TTFT.** Reported (median new / old), never judged: the first token after a restart pays for cold caches.
* **A speed FAIL is measured twice.** Decode speed is the one figure that something outside the release (other
  work on a shared host, the minutes between the two sides) can move for a while; answers, accepted drafts and
  failed requests are properties of the release. So when speed is the only FAIL (:func:`only_speed_fails`) the
  caller takes a second sample of the new release and :func:`confirm` judges that one: the FAIL stands only when
  it repeats. An UNPROVEN speed is measured again the same way (:func:`needs_another_sample`).

The outcome is the worst of the parts: FAIL, then ERROR, then UNPROVEN, then UNDECIDED, else PASS. Each part is
one small judge that returns its finding (an outcome and its reason) or None; ``reasons`` name the figure
(``decode 0.71x of rfb4d975 (p=0.002, 16 prompts paired; ...)``), ``line()`` is the one line a deploy prints. The
result types: opsctl/comparison/results.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from .decode import divergence, judge_levels, load_of, request_levels, worst
from .mannwhitney import mann_whitney_greater, smallest_p
from .results import (
    MIN_PAIRS,
    MIN_SECONDS,
    NOISE_MARGIN,
    REPEAT_MARGIN,
    Answers,
    Comparison,
    Drafts,
    Failures,
    Load,
    Outcome,
    Speed,
    Thresholds,
    p_text,
)
from .sample import CompareRequest, ComparisonSample

# A request answered on both sides: its index in the workload, the baseline's answer and the candidate's.
Pair = tuple[int, CompareRequest, CompareRequest]


class Finding(NamedTuple):
    """What one of the judges found: its outcome and the reason, in words."""

    outcome: Outcome
    text: str


@dataclass(frozen=True)
class _Case:
    """What every judge of one comparison reads besides its own part: the candidate's requests (the examples of a
    failure), the workload's size, the baseline's name in the reasons, the thresholds."""

    new: Sequence[CompareRequest]
    n: int
    baseline: str
    settings: Thresholds


def min_pairs(requests: int) -> int:
    """The fewest requests answered on both sides that a comparison of ``requests`` decides on: half the workload,
    and at least :data:`MIN_PAIRS`."""
    return max(MIN_PAIRS, math.ceil(requests / 2))


def _status(r: CompareRequest) -> str:
    if r.status is not None and r.status != 200:
        return f"HTTP {r.status}" + (f": {r.error[:80]}" if r.error else "")
    return r.error[:80] if r.error else "no answer"


def _examples(requests: Sequence[CompareRequest], indices: Sequence[int]) -> str:
    return "; ".join(dict.fromkeys(_status(requests[i]) for i in indices[:8]))


# ------------------------------------------------------------------------------------------------ the parts


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


def _drafts_of(pairs: Sequence[Pair], settings: Thresholds) -> Drafts | None:
    """The accepted drafts judged where both sides report them; None when no pair does."""
    reported = [(a.spec_accept_length, b.spec_accept_length) for _, a, b in pairs]
    both = [(a, b) for a, b in reported if a is not None and b is not None]
    return judge_drafts([a for a, _ in both], [b for _, b in both], settings) if both else None


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


def judge_answers(pairs: Sequence[Pair], settings: Thresholds) -> Answers:
    """The answers' verdict: identical output ids over the first ``compare_tokens``, each prompt answered on both
    sides."""
    tokens = settings.compare_tokens
    diverged = []
    for i, a, b in pairs:
        at = divergence(a.output_ids, b.output_ids, tokens)
        if at is not None:
            diverged.append((i, at))
    identical = len(pairs) - len(diverged)
    ok = identical >= settings.min_identical * len(pairs) - 1e-9
    return Answers(Outcome.PASS if ok else Outcome.FAIL, len(pairs), identical, tokens, tuple(diverged))


def _ttft_ratio(pairs: Sequence[Pair]) -> float | None:
    """The median TTFT of the new side over the old side's (reported, never judged)."""
    ttfts = [
        (a.ttft_s, b.ttft_s)
        for _, a, b in pairs
        if a.ttft_s is not None and b.ttft_s is not None and min(a.ttft_s, b.ttft_s) >= MIN_SECONDS
    ]
    return statistics.median(b for _, b in ttfts) / statistics.median(a for a, _ in ttfts) if ttfts else None


def _settings_doc(settings: Thresholds) -> dict[str, float | int]:
    names = ("compare_tokens", "min_identical", "max_slowdown", "alpha", "max_accept_drop", "max_load_diff")
    return {name: getattr(settings, name) for name in names}


# ------------------------------------------------------------------------------------------------ the judges


def _of_requests(outcome: Outcome, indices: Sequence[int], case: _Case, text: str) -> Finding | None:
    """A finding about some of the requests, None when there are none: ``text`` names their count (``{k} of
    {n}``), what failed (``{examples}``) and ``{baseline}``."""
    if not indices:
        return None
    examples = _examples(case.new, indices)
    return Finding(outcome, text.format(k=len(indices), n=case.n, examples=examples, baseline=case.baseline))


def _refused(f: Failures, case: _Case) -> Finding | None:
    """A 4xx from the new release where the old one answered: it broke the API."""
    text = "the new release refused {k} of {n} requests that {baseline} answered ({examples}): it broke the API"
    return _of_requests(Outcome.FAIL, f.new_client_errors, case, text)


def _failed(f: Failures, case: _Case) -> Finding | None:
    """Any other failure of the new release where the old one answered."""
    other = [i for i in f.new_failed if i not in f.new_client_errors]
    return _of_requests(Outcome.FAIL, other, case, "{k} of {n} requests failed on the new release ({examples})")


def _unfit(f: Failures, case: _Case) -> Finding | None:
    """A 4xx on both sides: the workload's configuration, no verdict on the release."""
    text = (
        "{k} of {n} requests refused by both releases ({examples}): the workload does not fit this server "
        "(gate.compare)"
    )
    return _of_requests(Outcome.ERROR, f.both_client_errors, case, text)


def _too_few(pairs: int, case: _Case) -> Finding | None:
    """Too few requests answered on both sides: nothing else is judged."""
    need = min_pairs(case.n)
    if pairs >= need:
        return None
    return Finding(
        Outcome.UNDECIDED, f"too few requests answered on both sides to decide ({pairs} of {case.n}; need {need})"
    )


def _answers(answers: Answers | None, case: _Case) -> Finding | None:
    """Fewer prompts answered alike than ``min_identical`` of them."""
    if answers is None or answers.outcome is not Outcome.FAIL:
        return None
    over = f"over the first {answers.compare_tokens} tokens (need {case.settings.min_identical:.0%})"
    return Finding(
        Outcome.FAIL, f"answers: {answers.identical}/{answers.judged} identical {over}; {answers.diverged()}"
    )


def _speed(speed: Speed, case: _Case) -> Finding | None:
    """The reason one level's speed gives (none on PASS): ``decode 0.85x of r1 at concurrency 8 (p=0.0003, 16
    prompts paired; fails below 0.94x at p < 0.01)``."""
    undecided = Finding(Outcome.UNDECIDED, f"decode speed{speed.at}: cannot decide: {speed.why}")
    if speed.outcome is Outcome.UNDECIDED:
        return undecided
    if speed.ratio is None or speed.outcome is Outcome.PASS:
        return None
    settings = case.settings
    left = f", {speed.left_out} left out: answers differ" if speed.left_out else ""
    head = (
        f"decode {speed.ratio:.2f}x of {case.baseline}{speed.at} (p={p_text(speed.p)}, {speed.n_old} prompts "
        f"paired{left}; "
    )
    # An UNPROVEN speed is beyond the bound itself, not always beyond the bound less the noise margin.
    floor = speed.floor if speed.floor is not None and speed.outcome is Outcome.FAIL else 1 - settings.max_slowdown
    bound = f"{floor:.2f}x at p < {settings.alpha:g}"
    if speed.outcome is Outcome.FAIL:
        return Finding(Outcome.FAIL, head + f"fails below {bound})" + (f"; {speed.note}" if speed.note else ""))
    if speed.outcome is Outcome.UNPROVEN:
        text = head + f"beyond {bound}) but the speed cannot be decided: {speed.why}: not proven, never a PASS"
        return Finding(Outcome.UNPROVEN, text)
    return undecided


def _drafts(drafts: Drafts | None, case: _Case) -> Finding | None:
    """Accepted drafts dropped beyond ``max_accept_drop``, and not by chance."""
    if drafts is None or drafts.outcome is not Outcome.FAIL:
        return None
    drop = f"-{1 - drafts.new_mean / drafts.old_mean:.0%}, p={p_text(drafts.p)}"
    means = f"{drafts.old_mean:.2f} -> {drafts.new_mean:.2f}"
    bound = f"fails beyond -{case.settings.max_accept_drop:.0%}"
    return Finding(Outcome.FAIL, f"accepted drafts {means} of {case.baseline} ({drop}; {bound})")


def _findings(
    case: _Case, failures: Failures, pairs: int, answers: Answers | None, levels: Sequence[Speed], drafts: Drafts | None
) -> list[Finding]:
    """Every judge's finding, in the order the reasons list those of one outcome. With too few pairs only the
    failed requests are judged."""
    found = [_refused(failures, case), _failed(failures, case), _unfit(failures, case)]
    too_few = _too_few(pairs, case)
    if too_few is not None:
        found.append(too_few)
    else:
        found.append(_answers(answers, case))
        found.extend(_speed(level, case) for level in sorted(levels, key=lambda s: -s.outcome.rank))
        found.append(_drafts(drafts, case))
    return [f for f in found if f is not None]


def _incomparable(old: Sequence[CompareRequest], new: Sequence[CompareRequest]) -> str | None:
    """Why two samples are not of the same workload (nothing is judged), or None."""
    if len(old) != len(new):
        return f"not the same workload: {len(old)} requests against {len(new)}"
    if not old:
        return "the samples hold no request"
    if request_levels(old, new) is None:
        return "not the same workload: the requests were sent at other concurrency levels"
    return None


def compare(
    old: ComparisonSample, new: ComparisonSample, settings: Thresholds, *, baseline: str = "the baseline"
) -> Comparison:
    """Judge the candidate ``new`` against the baseline ``old`` (the same workload, request for request).
    ``baseline`` names the baseline in the reasons (a release id, or "its deploy" for the drift check)."""
    load = load_of(old.requests, new.requests, settings)
    n = max(len(old.requests), len(new.requests))
    why = _incomparable(old.requests, new.requests)
    if why is not None:
        return _undecided(why, baseline, n, load, _settings_doc(settings))
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(old.requests, new.requests, strict=True)) if a.ok and b.ok]
    failures = _failures(old.requests, new.requests)
    levels = judge_levels(old.requests, new.requests, settings, request_levels(old.requests, new.requests))
    answers = judge_answers(pairs, settings) if pairs else None
    drafts = _drafts_of(pairs, settings)
    found = _findings(_Case(new.requests, n, baseline, settings), failures, len(pairs), answers, levels, drafts)
    return Comparison(
        outcome=max((f.outcome for f in found), key=lambda o: o.rank, default=Outcome.PASS),
        reasons=tuple(f.text for f in sorted(found, key=lambda f: -f.outcome.rank)),
        baseline=baseline,
        requests=n,
        pairs=len(pairs),
        failures=failures,
        answers=answers,
        speed=worst(levels),
        drafts=drafts,
        load=load,
        ttft_ratio=_ttft_ratio(pairs),
        settings=_settings_doc(settings),
        levels=levels,
    )


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
    every time, a busy minute on the host is not; a withheld slowdown that repeats stays UNPROVEN. "Repeats" is
    the bound less ``REPEAT_MARGIN`` x the spread, at p < alpha, on the same level: the whole margin for the pairs'
    spread (``NOISE_MARGIN``) forgives one sample only."""
    ordinal = _ORDINALS[min(earlier, len(_ORDINALS)) - 1]
    figure = first.speed.figure() if first.speed.ratio is not None else "a FAIL"
    if first.speed.outcome is Outcome.UNPROVEN:
        figure += " withheld"
    slowed = first.speed.outcome in (Outcome.FAIL, Outcome.UNPROVEN)
    outcome, text, again = second.outcome, "", second.speed.outcome in (Outcome.FAIL, Outcome.UNPROVEN)
    if slowed and second.outcome.rank < Outcome.UNPROVEN.rank:
        outcome, text, beyond = _after_a_slowdown(first, second, figure, ordinal)
        again = again or beyond
    note = f"a {ordinal} sample too: {figure}" if again else f"a {ordinal} sample's {figure} not repeated"
    if first.first_sample:
        note = f"{first.first_sample}; {note}"
    reasons = (text, *second.reasons) if text else second.reasons
    return replace(second, outcome=outcome, reasons=reasons, first_sample=note)


def _after_a_slowdown(first: Comparison, second: Comparison, figure: str, ordinal: str) -> tuple[Outcome, str, bool]:
    """``second``'s outcome (below UNPROVEN) after ``first`` measured a slowdown, the reason when it changes, and
    whether ``second`` repeats that slowdown (:func:`_repeated_slowdown`)."""
    withheld = [lv for lv in second.levels or (second.speed,) if lv.why and lv.ratio is not None]
    undecided = [lv for lv in withheld if lv.outcome is Outcome.UNDECIDED]
    if undecided:
        # A slowdown measured, then a sample whose speed verdict the load or the host withheld: nothing says the
        # slowdown went away, so no PASS (measured again while samples are left, else not proven).
        level = min(undecided, key=lambda lv: lv.ratio or 0.0)
        why = f"{level.figure()} withheld ({level.why}) after a slowdown measured on an earlier sample"
        return Outcome.UNPROVEN, why + ": not proven, never a PASS", False
    bound = 1 - float(second.settings.get("max_slowdown", 0.0))
    repeated = _repeated_slowdown(first, second, bound)
    if repeated is None:
        return second.outcome, "", False
    # A testbed slow:1.25 release passed so: 0.73x, then 0.87x at p=5e-05, within that sample's margin.
    if first.speed.outcome is Outcome.FAIL:
        return (
            Outcome.FAIL,
            f"{repeated.figure()}: slower than {bound:.2f}x again, after {figure} on the {ordinal} sample",
            True,
        )
    return Outcome.UNPROVEN, f"{repeated.figure()} beyond {bound:.2f}x after {figure}: not proven, never a PASS", True


def _repeated_slowdown(first: Comparison, second: Comparison, bound: float) -> Speed | None:
    """The level of ``second`` slower than ``bound`` (1 - max_slowdown) less :data:`REPEAT_MARGIN` x its spread, at
    p < alpha (a PASS only by the rest of the margin), at a concurrency where ``first`` measured a slowdown (FAIL or
    withheld); None if none is."""
    slowed_at = {
        lv.concurrency for lv in first.levels or (first.speed,) if lv.outcome in (Outcome.FAIL, Outcome.UNPROVEN)
    }
    alpha = float(second.settings.get("alpha", 0.0))
    beyond = [
        lv
        for lv in second.levels or (second.speed,)
        if lv.concurrency in slowed_at and not lv.withheld and lv.ratio is not None and lv.p is not None
        and lv.ratio < bound * math.exp(-REPEAT_MARGIN * (lv.spread or 0.0)) and lv.p < alpha
    ]  # fmt: skip
    return min(beyond, key=lambda lv: lv.ratio or 0.0, default=None)


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
