"""Prometheus textfile, JSON, the table, atomic writes and the local history."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rich.console import Console

from opsctl.cli.render import details, render_prometheus, render_table, to_json
from opsctl.health.checks import check_hosts, evaluate
from opsctl.health.findings import HostFacts, UnitFacts
from opsctl.health.levels import HostHealth, Level
from opsctl.health.localstate import HealthHistory, write_atomic
from tests.builders import inventory
from tests.health.test_health_eval import REPLAY, healthy

# One sample line of the text exposition format: name{labels} value
_SAMPLE_RE = re.compile(r'^[a-z_]+\{(?:[a-z]+="(?:[^"\\]|\\.)*",?)+\} (?:-?[0-9.e+-]+|NaN|[+-]Inf)$')


def results() -> list[HostHealth]:
    inv = inventory({"tb1": REPLAY, "tb2": REPLAY})
    return [
        evaluate(inv.hosts["tb1"], healthy(host="tb1")),
        evaluate(inv.hosts["tb2"], healthy(host="tb2", disk_free_mb=1.0)),
    ]


def test_prometheus_textfile_is_well_formed() -> None:
    text = render_prometheus(results())
    assert text.endswith("\n")
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            names.add(line.split()[2])
        elif not line.startswith("# HELP"):
            assert _SAMPLE_RE.match(line), line
    assert {"opsctl_health_status", "opsctl_health_check_status", "opsctl_health_disk_free_bytes"} <= names
    assert 'opsctl_health_status{host="tb1"} 0' in text
    assert 'opsctl_health_status{host="tb2"} 2' in text
    assert 'opsctl_health_check_status{host="tb2",check="disk"} 2' in text
    # skipped checks (no GPU on a replay host) leave no sample
    assert 'check="gpu"' not in text


def test_prometheus_escapes_label_values() -> None:
    r = evaluate(inventory({"h1": REPLAY}).hosts["h1"], healthy(host="h1"))
    odd = HostHealth('we"ird\\host', r.checks, r.checked_at, r.elapsed_s)
    text = render_prometheus([odd])
    assert 'host="we\\"ird\\\\host"' in text


def test_json_round_trips_and_carries_levels() -> None:
    doc = json.loads(json.dumps(to_json(results())))
    assert doc["status"] == "crit"
    tb2 = next(h for h in doc["hosts"] if h["host"] == "tb2")
    assert tb2["checks"]["disk"]["status"] == "crit"
    assert tb2["checks"]["http"]["status"] == "skip"


def test_table_and_details_name_failures() -> None:
    console = Console(width=250, record=True)
    console.print(render_table(results()))
    out = console.export_text()
    assert "tb1" in out and "tb2" in out and "CRIT" in out
    assert any(line.startswith("tb2 disk CRIT") for line in details(results()))


def test_write_atomic_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "opsctl.prom"
    write_atomic(target, "a 1\n")
    write_atomic(target, "b 2\n")
    assert target.read_text() == "b 2\n"
    assert [p.name for p in target.parent.iterdir()] == ["opsctl.prom"]  # no temp files left
    assert target.stat().st_mode & 0o777 == 0o644


def test_history_gives_restart_baseline_between_runs(tmp_path: Path) -> None:
    inv = inventory({"tb1": REPLAY})
    hist = HealthHistory(tmp_path / "h.jsonl")
    counts = iter([2, 2, 5])

    def probe(h):  # type: ignore[no-untyped-def]
        return healthy(host=h.name, unit=UnitFacts("loaded", "active", "running", next(counts), "i"))

    first = check_hosts(list(inv.hosts.values()), probe, hist)
    second = check_hosts(list(inv.hosts.values()), probe, hist)
    third = check_hosts(list(inv.hosts.values()), probe, hist)
    # first run: no baseline, the raw counter (2) is above restarts_warn=1
    assert first.results[0].check("unit").level is Level.WARN  # type: ignore[union-attr]
    assert second.results[0].check("unit").level is Level.OK  # type: ignore[union-attr]
    assert third.results[0].check("unit").level is Level.CRIT  # 3 > gate.max_restarts=2  # type: ignore[union-attr]
    lines = (tmp_path / "h.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["n_restarts"] == 5


def test_history_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"host": "tb1", "n_restarts": 4}\n{"host": "tb1", "n_res')
    assert HealthHistory(path).previous("tb1").n_restarts == 4  # type: ignore[union-attr]


def test_unreachable_probe_in_a_group_does_not_hide_other_hosts(tmp_path: Path) -> None:
    inv = inventory({"tb1": REPLAY, "tb2": REPLAY})

    def probe(h):  # type: ignore[no-untyped-def]
        if h.name == "tb2":
            return HostFacts("tb2", reachable=False, error="tb2: unreachable")
        return healthy(host=h.name)

    run = check_hosts(list(inv.hosts.values()), probe, HealthHistory(tmp_path / "h.jsonl"))
    assert [r.level for r in run.results] == [Level.OK, Level.CRIT]
    assert run.exit_code == 2
