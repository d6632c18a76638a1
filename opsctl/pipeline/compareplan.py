"""Whether a deploy or restart can take the comparison's baseline on a host as it stands, and the comparison's plan
in words for ``deploy --dry-run`` (docs/gate.md "The comparison"). Pure: data in, text out."""

from __future__ import annotations

from ..comparison.compare import rules_line
from ..comparison.workload import plan_lines
from ..host.releaseroot import HostSnapshot
from ..inventory import HostConfig
from ..probe.traffic import serves_http


def skip_reason(host: HostConfig, snap: HostSnapshot | None, *, no_restart: bool) -> str | None:
    """Why no baseline can be taken now (None: it can, if the running server answers ready)."""
    if not host.gate.compare.enabled:
        return "the comparison is disabled (gate.compare.enabled: false)"
    if not serves_http(host):
        return "the replay service serves no requests (service.mode: replay)"
    if no_restart:
        return "--no-restart: nothing runs the new release to compare"
    if snap is None or not snap.current:
        return "no release is running to compare with"
    if snap.unit.active_state != "active":
        return f"the unit is {snap.unit.active_state}: no running release to compare with"
    return None


def comparison_plan(host: HostConfig, snap: HostSnapshot, *, no_restart: bool) -> list[str]:
    """The workload, the judge's rules, and whether the baseline would be skipped as the host stands now."""
    if no_restart:
        return []
    lines = plan_lines(host)
    if not host.gate.compare.enabled:
        return lines
    if not serves_http(host):
        return ["comparison: none (the replay service serves no requests)"]
    lines.append(rules_line(host.gate.compare, enforce=host.gate.compare.enforce))
    why = skip_reason(host, snap, no_restart=no_restart)
    lines.append(
        f"comparison: the baseline would be skipped as the host stands now ({why}); the new release's sample is "
        "still recorded"
        if why
        else f"comparison: baseline {snap.current}, sampled before the switch if its server answers ready"
    )
    return lines
