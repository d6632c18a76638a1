"""Fail-closed behaviour against real hosts (testbed): parity tokens never on a command line, '%' in a root read by
systemd as opsctl wrote it, and captures never armed where no managed service runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from opsctl.errors import CommandFailed
from opsctl.host import replay as replay_commands
from opsctl.host.releaseroot import Layout, new_parity_token
from opsctl.inventory import HostConfig, Inventory
from opsctl.pipeline.watch import reads_token_file
from opsctl.ssh import connect
from opsctl.testbed import reset_host
from opsctl.unit import systemctl as unit_commands
from opsctl.unit import unitfile as unit
from tests.cli.test_first_hour_cli import opsctl
from tests.pipeline import trees

REPO = Path(__file__).resolve().parents[2]


def test_the_replay_token_is_in_no_command_line_on_the_host(testbed: Inventory) -> None:
    """While the replay command runs, `ps` on the host (every process's argv, as any user sees it) does not show
    the token, its process has it in its environment, and a failing command's CommandFailed does not quote it."""
    host = testbed.host("tb1")
    token = new_parity_token()
    probe = ["sh", "-c", 'ps -eo args; echo "env=$KDTREE_PARITY_TOKEN"']
    cmd = replay_commands.in_release_command("/", token, probe)
    with connect(host) as r:
        res = r.run(cmd.command, stdin=cmd.stdin, timeout=60)
        *ps, env = res.stdout.strip().splitlines()
        assert env == f"env={token}"
        assert any("ps -eo args" in line for line in ps), ps  # the listing was taken while the command ran
        assert not [line for line in ps if token in line]
        failing = replay_commands.in_release_command(
            "/", token, ["sh", "-c", 'echo "$KDTREE_PARITY_TOKEN" >&2; exit 3']
        )
        with pytest.raises(CommandFailed) as exc:
            r.run(failing.command, stdin=failing.stdin, timeout=60)
    assert exc.value.rc == 3 and token not in exc.value.command
    # The stderr tail is the command's own output (here it prints the token on purpose): the replay's callers
    # scrub it with ReleaseCommand.redact before it reaches a message.
    assert failing.redact(exc.value.message).count(token) == 0


def test_a_percent_in_the_root_is_the_path_systemd_reads(testbed: Inventory) -> None:
    """The rendered unit of a host whose root holds '%n': systemd's WorkingDirectory and EnvironmentFiles are the
    literal paths (unescaped they were /srv/kd<unit name>...), and the restart's token check finds the token file."""
    base = testbed.host("tb1")
    name = "opsctl-percent-check"
    host = base.model_copy(update={"root": "/srv/kd%n", "unit": name})
    text = unit.render((REPO / unit.TEMPLATE_REL).read_text(), host)
    path = unit_commands.unit_file_path(name)
    with connect(base) as r:
        try:
            r.write_file(path, text.encode(), mode=0o644)
            r.run(unit_commands.daemon_reload_argv(), timeout=120)
            shown = r.run(
                f"systemctl show -p WorkingDirectory --value {name}.service; "
                f"systemctl show -p EnvironmentFiles --value {name}.service | sed 's/^/envfile=/'",
                timeout=60,
            ).stdout.splitlines()
        finally:
            r.run(f"rm -f {path}", timeout=60)
            r.run(unit_commands.daemon_reload_argv(), timeout=120)
    assert shown[0] == "/srv/kd%n/current"
    facts = unit_commands.parse_restart_output("\n".join(shown[1:]))
    assert reads_token_file(facts.envfiles, Layout("/srv/kd%n").parity_env), facts


def test_capture_is_refused_on_a_virgin_host_and_every_view_shows_a_request(testbed: Inventory) -> None:
    host = testbed.host("tb2")
    reset_host(host)
    refused = opsctl(testbed, "capture", "tb2", "--json", timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    doc = json.loads(refused.stdout)
    assert doc["kind"] == "UsageError" and "no release deployed by opsctl" in doc["error"]
    request = f"{host.root}/state/capture/request.json"
    with connect(host) as r:
        assert r.run(f"test -e {request}", check=False).rc != 0  # nothing armed

        # A request left behind (armed before this check existed, or by hand), long expired.
        now = float(r.run("date +%s").stdout)
        r.run(f"mkdir -p -m 0700 {host.root}/state/capture")
        stale = {"format": "kdtree-capture/1", "id": "c20260101T000000Z-abcdef", "expires_at": now - 3600}
        r.write_file(request, json.dumps(stale), mode=0o600)

    text = opsctl(testbed, "captures", "tb2")
    assert text.returncode == 0, text.stderr
    assert "c20260101T000000Z-abcdef is left behind, expired 60m ago" in text.stdout, text.stdout
    listed = json.loads(opsctl(testbed, "captures", "tb2", "--json").stdout)
    assert listed["request"] == {
        "id": "c20260101T000000Z-abcdef",
        "state": "expired",
        "expires_in_s": pytest.approx(-3600, abs=120),
        "removed": False,
    }
    pruned = opsctl(testbed, "captures", "tb2", "--prune")
    assert pruned.returncode == 0 and "removed the request file" in pruned.stdout, pruned.stdout + pruned.stderr
    with connect(host) as r:
        assert r.run(f"test -e {request}", check=False).rc != 0
        armed = {**stale, "id": "c20260101T000001Z-abcdef", "expires_at": time.time() + 600}
        r.write_file(request, json.dumps(armed), mode=0o600)
    kept = json.loads(opsctl(testbed, "captures", "tb2", "--prune", "--json").stdout)
    assert kept["armed"] == "c20260101T000001Z-abcdef" and kept["request"]["removed"] is False  # a live capture
    disarmed = json.loads(opsctl(testbed, "captures", "tb2", "--disarm", "--json").stdout)
    assert disarmed["request"]["removed"] is True and disarmed["armed"] is None
    with connect(host) as r:
        assert r.run(f"test -e {request}", check=False).rc != 0


def _last_record(host: HostConfig) -> dict[str, object]:
    with connect(host) as r:
        lines = r.run(f"cat {Layout(host.root).history}").stdout.strip().splitlines()
    return json.loads(lines[-1])


def test_a_unit_that_does_not_read_the_token_file_is_said_loudly(testbed: Inventory, tmp_path: Path) -> None:
    """A deploy's unit reads the token file (found by its exact path among systemd's EnvironmentFiles, the
    inventory's own environment file listed first or not): token checked. A drop-in that clears EnvironmentFile=
    (what an adopted, hand-made unit looks like) turns the check off, and the restart says so in a WARNING line
    and in its history record."""
    host = testbed.host("tb1")
    reset_host(host)
    good = trees.copy_tree(tmp_path / "good", tag="token-check")
    deployed = opsctl(testbed, "deploy", "tb1", "--src", str(good), "--yes")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "NOT checked" not in deployed.stdout + deployed.stderr
    record = _last_record(host)
    assert record["event"] == "deploy" and record["gate"]["token_checked"] is True, record  # type: ignore[index]

    dropin = f"/etc/systemd/system/{host.unit}.service.d/no-token.conf"
    with connect(host) as r:
        r.run(f"mkdir -p /etc/systemd/system/{host.unit}.service.d")
        r.write_file(dropin, "[Service]\nEnvironmentFile=\n")
        r.run(unit_commands.daemon_reload_argv(), timeout=120)
    try:
        restarted = opsctl(testbed, "restart", "tb1", "--yes")
        out = restarted.stdout + restarted.stderr
        assert f"WARNING: parity token NOT checked: the unit does not read {Layout(host.root).parity_env}" in out, out
        record = _last_record(host)
        assert record["event"] == "restart" and record["gate"]["token_checked"] is False, record  # type: ignore[index]
    finally:
        reset_host(host)  # removes the unit and its drop-ins
