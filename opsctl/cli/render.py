"""Rendering at the edge: what `opsctl health` and the roll-outs print (rich tables, detail lines, the JSON
document, Prometheus textfile text). opsctl.health.levels and opsctl.fleet.rollout return data; this module is the only one that
turns it into text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from ..fleet.rollout import Outcome, RolloutReport
from ..health.levels import CHECK_NAMES, HostHealth, Level, exit_code
from ..terminal import escaped

# ----------------------------------------------------------------------------------------------------------------
# Health

_STYLE = {Level.OK: "green", Level.WARN: "yellow", Level.CRIT: "bold red", Level.SKIP: "dim"}


def render_table(results: Sequence[HostHealth]) -> Table:
    table = Table(title="opsctl health", show_lines=False)
    table.add_column("host", style="bold")
    table.add_column("status")
    for name in CHECK_NAMES[1:]:
        table.add_column(name)
    table.add_column("time", justify="right")
    for r in results:
        row: list[Text | str] = [r.host, Text(r.level.value.upper(), style=_STYLE[r.level])]
        ssh = r.check("ssh")
        unreachable = ssh is not None and ssh.level is Level.CRIT
        for name in CHECK_NAMES[1:]:
            c = r.check(name)
            if c is None:
                row.append("")
            elif unreachable and name == "unit":
                row.append(Text(escaped(ssh.detail) if ssh else "", style=_STYLE[Level.CRIT]))
            else:
                # A check's detail quotes the host (a unit state, a journal line): escaped.
                detail = escaped(c.detail)
                short = detail if len(detail) <= 40 else detail[:39] + "…"
                label = c.level.value if c.level in (Level.OK, Level.SKIP) else f"{c.level.value}: {short}"
                row.append(Text(label if c.level is not Level.SKIP else "n/a", style=_STYLE[c.level]))
        row.append(f"{r.elapsed_s:.2f}s")
        table.add_row(*row)
    return table


def details(results: Sequence[HostHealth]) -> list[str]:
    """One line per check that is not OK, for people reading below the table."""
    lines = []
    for r in results:
        for c in r.checks:
            if c.level in (Level.WARN, Level.CRIT):
                lines.append(f"{r.host} {c.name} {c.level.value.upper()}: {escaped(c.detail)}")
    return lines


def to_json(results: Sequence[HostHealth]) -> dict[str, Any]:
    return {"status": ["ok", "warn", "crit"][exit_code(results)], "hosts": [r.to_dict() for r in results]}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(results: Sequence[HostHealth]) -> str:
    """node_exporter textfile-collector format. Skipped checks are left out (no sample means n/a)."""
    metrics: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
        ("opsctl_health_status", "Overall host health: 0 OK, 1 WARN, 2 CRIT.", []),
        ("opsctl_health_check_status", "One check on one host: 0 OK, 1 WARN, 2 CRIT.", []),
        ("opsctl_health_check_duration_seconds", "Wall time of the health probe of a host.", []),
        ("opsctl_health_last_run_timestamp_seconds", "When the host was last checked (epoch seconds).", []),
        ("opsctl_health_unit_restarts", "Automatic restarts of the service unit since the last check.", []),
        ("opsctl_health_parity_rel", "Relative error of the parity line the parity check judged.", []),
        ("opsctl_health_disk_free_bytes", "Free bytes on the release root's filesystem.", []),
        (
            "opsctl_health_decode_ratio",
            "Decode speed relative to the sample recorded at the deploy (health --probe).",
            [],
        ),
        (
            "opsctl_health_decode_seconds_per_token",
            "Median decode seconds per token of the comparison workload (health --probe).",
            [],
        ),
        (
            "opsctl_health_accepted_drafts",
            "Mean accepted draft length of the comparison workload (health --probe).",
            [],
        ),
    ]
    by_name = {m[0]: m[2] for m in metrics}
    for r in results:
        host = {"host": r.host}
        by_name["opsctl_health_status"].append((host, float(r.level.severity)))
        for c in r.checks:
            if c.level is not Level.SKIP:
                by_name["opsctl_health_check_status"].append(({**host, "check": c.name}, float(c.level.severity)))
        by_name["opsctl_health_check_duration_seconds"].append((host, r.elapsed_s))
        by_name["opsctl_health_last_run_timestamp_seconds"].append((host, r.checked_at))
        for check, metric, scale in (
            ("unit", "opsctl_health_unit_restarts", 1.0),
            ("parity", "opsctl_health_parity_rel", 1.0),
            ("disk", "opsctl_health_disk_free_bytes", 1024.0 * 1024.0),
            ("speed", "opsctl_health_decode_ratio", 1.0),
        ):
            c = r.check(check)
            if c is not None and c.value is not None and c.level is not Level.SKIP:
                by_name[metric].append((host, c.value * scale))
        for metric, value in r.gauges:
            if metric in by_name:
                by_name[metric].append((host, value))
    out: list[str] = []
    for name, help_text, samples in metrics:
        if not samples:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} {_number(value)}")
    return "\n".join(out) + "\n"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


# ----------------------------------------------------------------------------------------------------------------
# Roll-outs

_OUTCOME_STYLE = {
    Outcome.OK: "green",
    Outcome.FAILED: "bold red",
    Outcome.ERROR: "bold red",
    Outcome.SKIPPED: "dim",
    Outcome.UNPROVEN: "yellow",
}


def render_report(report: RolloutReport, title: str = "roll-out") -> Table:
    table = Table(title=title)
    table.add_column("host", style="bold")
    table.add_column("result")
    table.add_column("release")
    table.add_column("verdict")
    table.add_column("time", justify="right")
    table.add_column("detail", overflow="fold")
    for o in report.outcomes:
        table.add_row(
            o.host,
            Text(o.outcome.value, style=_OUTCOME_STYLE[o.outcome]),
            o.release or "-",
            o.verdict or "-",
            f"{o.elapsed_s:.1f}s" if o.outcome is not Outcome.SKIPPED else "-",
            o.detail,
        )
    return table


def summary_line(report: RolloutReport) -> str:
    counts = {k: sum(1 for o in report.outcomes if o.outcome is k) for k in Outcome}
    text = ", ".join(f"{n} {k.value}" for k, n in counts.items() if n)
    head = (
        "roll-out complete"
        if report.ok
        else f"roll-out stopped: {report.stopped}"
        if report.stopped
        else "roll-out finished with failures"
    )
    return f"{head} ({text}) in {report.elapsed_s:.1f}s"
