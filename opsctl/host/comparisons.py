"""The comparisons a host's history records (opsctl/pipeline/comparison.py writes them into deploy and restart
records, under ``comparison``), read back for ``status`` (the running release's figures), ``releases`` (each
release's decode speed relative to the one it replaced) and ``health --probe`` (the sample recorded when the running
release was deployed, for the drift check). Pure: history records in, figures out; a record whose comparison is
not readable (an older opsctl, a hand edit) is passed over, never an error."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..comparison.sample import ComparisonSample, SampleError
from .history import DeployVerdict, HistoryEvent, HistoryRecord

_EVENTS = (HistoryEvent.DEPLOY, HistoryEvent.RESTART)


@dataclass(frozen=True)
class ReleaseFigures:
    """One release's figures from the comparison of the record that deployed (or restarted) it."""

    release: str
    event: HistoryEvent
    at: str | None
    verdict: DeployVerdict | None
    stage: str | None  # where the record's verdict came from when not the gate ("comparison")
    outcome: str | None  # the comparison's: PASS, FAIL, UNDECIDED, ERROR
    line: str | None  # its one line
    baseline_release: str | None  # what it was compared with (None: not compared, the sample only recorded)
    decode_ratio: float | None  # its decode speed relative to the baseline's (below 1: slower)
    sample: ComparisonSample  # the release's own sample (the candidate side)
    baseline_sample: ComparisonSample | None

    @property
    def decode_ms_per_token(self) -> float | None:
        return median_ms_per_token(self.sample)

    @property
    def accept_length(self) -> float | None:
        return mean_accept_length(self.sample)

    def to_json(self, *, samples: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "event": str(self.event),
            "at": self.at,
            "verdict": str(self.verdict) if self.verdict is not None else None,
            "stage": self.stage,
            "outcome": self.outcome,
            "line": self.line,
            "baseline_release": self.baseline_release,
            "decode_ratio": self.decode_ratio,
            "decode_ms_per_token": self.decode_ms_per_token,
            "accept_length": self.accept_length,
        }
        if samples:
            doc["sample"] = self.sample.to_json()
            doc["baseline_sample"] = self.baseline_sample.to_json() if self.baseline_sample is not None else None
        return doc


def median_ms_per_token(sample: ComparisonSample) -> float | None:
    times = [r.decode_s_per_token for r in sample.answered if r.decode_s_per_token]
    return statistics.median(times) * 1000 if times else None


def mean_accept_length(sample: ComparisonSample) -> float | None:
    lengths = [r.spec_accept_length for r in sample.answered if r.spec_accept_length is not None]
    return statistics.fmean(lengths) if lengths else None


def _sample(doc: Any) -> ComparisonSample | None:
    if not isinstance(doc, dict):
        return None
    try:
        return ComparisonSample.from_json(doc)
    except SampleError:
        return None


def _ratio(comparison: dict[str, Any]) -> float | None:
    result = comparison.get("result")
    speed = result.get("speed") if isinstance(result, dict) else None
    ratio = speed.get("ratio") if isinstance(speed, dict) else None
    return float(ratio) if isinstance(ratio, int | float) and not isinstance(ratio, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def figures_of(record: HistoryRecord) -> ReleaseFigures | None:
    """The figures a deploy or restart record holds for its release; None when it has no readable sample."""
    c = record.comparison
    if record.event not in _EVENTS or not record.release or not isinstance(c, dict):
        return None
    sample = _sample(c.get("candidate"))
    if sample is None:
        return None
    return ReleaseFigures(
        release=record.release,
        event=record.event,
        at=record.at,
        verdict=record.verdict,
        stage=record.stage,
        outcome=_text(c.get("outcome")),
        line=_text(c.get("line")),
        baseline_release=_text(c.get("baseline_release")),
        decode_ratio=_ratio(c),
        sample=sample,
        baseline_sample=_sample(c.get("baseline")),
    )


def release_figures(history: list[HistoryRecord]) -> dict[str, ReleaseFigures]:
    """Each release's figures from the newest deploy that recorded a sample of it (a restart's when no deploy
    did: an adopted release, or one deployed before comparisons)."""
    out: dict[str, ReleaseFigures] = {}
    for record in history:
        figures = figures_of(record)
        if figures is None:
            continue
        known = out.get(figures.release)
        if known is None or figures.event is HistoryEvent.DEPLOY or known.event is not HistoryEvent.DEPLOY:
            out[figures.release] = figures
    return out


def deploy_sample(history: list[HistoryRecord], release: str) -> ReleaseFigures | None:
    """The sample recorded when ``release`` was deployed and passed (the drift check's reference): the newest
    passing deploy's, else the newest passing restart's."""
    passed = [
        f
        for f in (figures_of(r) for r in history if r.release == release and r.verdict is DeployVerdict.PASS)
        if f is not None
    ]
    deploys = [f for f in passed if f.event is HistoryEvent.DEPLOY]
    chosen = deploys or passed
    return chosen[-1] if chosen else None
