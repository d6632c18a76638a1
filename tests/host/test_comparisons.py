"""The comparisons the history records, read back (opsctl/host/comparisons.py): each release's figures for
`releases` and `status`, and the deploy's sample the drift check compares with. Pure, over built records."""

from __future__ import annotations

from opsctl.comparison.compare import compare
from opsctl.host.comparisons import deploy_sample, figures_of, release_figures
from opsctl.host.history import DeployVerdict, HistoryEvent, HistoryRecord
from opsctl.inventory import CompareSettings
from tests.comparison.test_compare import side


def record(
    release: str, baseline: str | None, *, scale: float = 1.0, event: HistoryEvent = HistoryEvent.DEPLOY, **kw: object
) -> HistoryRecord:
    old, new = side(), side(scale=scale)
    doc: dict[str, object] = {"baseline_release": baseline, "candidate": new.to_json(), "outcome": "PASS"}
    if baseline is not None:
        result = compare(old, new, CompareSettings(), baseline=baseline)
        doc |= {"baseline": old.to_json(), "result": result.to_json(), "line": result.line()}
    fields: dict[str, object] = {"verdict": DeployVerdict.PASS, "at": "t"} | kw
    return HistoryRecord(event=event, release=release, comparison=doc, **fields)  # type: ignore[arg-type]


def test_each_release_has_its_speed_relative_to_the_one_it_replaced() -> None:
    history = [record("r1", None), record("r2", "r1", scale=0.5), record("r3", "r2", scale=1.5)]
    figures = release_figures(history)
    assert figures["r1"].decode_ratio is None and figures["r1"].baseline_release is None
    assert figures["r2"].decode_ratio is not None and abs(figures["r2"].decode_ratio - 2.0) < 1e-9
    assert figures["r3"].baseline_release == "r2" and figures["r3"].line is not None
    assert figures["r3"].line.startswith("compared with r2 on 16 requests: 16/16 answers identical; decode 0.67x")
    assert figures["r2"].decode_ms_per_token is not None and abs(figures["r2"].decode_ms_per_token - 11.5) < 1e-6
    assert figures["r2"].to_json(samples=True)["sample"]["requests"][0]["output_ids"][:3] == [0, 3, 6]


def test_a_deploy_is_preferred_to_a_later_restart_and_unreadable_records_are_passed_over() -> None:
    history = [
        record("r1", None),
        record("r1", "r1", scale=2.0, event=HistoryEvent.RESTART),
        HistoryRecord(event=HistoryEvent.DEPLOY, release="r2", comparison={"candidate": {"requests": "no"}}),
        HistoryRecord(event=HistoryEvent.DEPLOY, release="r3", comparison={"skipped": "the unit is inactive"}),
    ]
    figures = release_figures(history)
    assert figures["r1"].event is HistoryEvent.DEPLOY and set(figures) == {"r1"}
    assert figures_of(history[2]) is None


def test_the_drift_reference_is_the_newest_passing_deploy_of_the_release() -> None:
    history = [
        record("r1", None, scale=1.0),
        record("r1", "r1", scale=3.0, verdict=DeployVerdict.FAIL),
        record("r1", "r1", scale=1.2),
        record("r1", "r1", scale=4.0, event=HistoryEvent.RESTART),
        record("r2", "r1"),
    ]
    found = deploy_sample(history, "r1")
    assert found is not None and found.sample == side(scale=1.2)
    assert deploy_sample(history, "r9") is None
    only_restart = [record("r0", "r0", event=HistoryEvent.RESTART)]
    assert (ref := deploy_sample(only_restart, "r0")) is not None and ref.event is HistoryEvent.RESTART
