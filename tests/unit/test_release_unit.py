"""The unit a rollback or a deploy's undo installs for an earlier release (issue 36: a rollback dropped the API key).

A release's unit is its own template rendered with today's inventory; release zero keeps its hand-made unit. A
unit that would lose a setting the running unit has from the inventory is refused, naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.errors import DeployFailed
from opsctl.hostdata.layout import Layout
from opsctl.inventory import HostConfig
from opsctl.unit.unitfile import TEMPLATE_REL, UnitSettingsLost, release_unit_text, render, unit_for_release
from tests import builders
from tests.pipeline.localremote import LocalRemote

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = (REPO / TEMPLATE_REL).read_text()
ENV_FILE = "/etc/kdtree-engine/sglang.env"
ENV_LINE = f"EnvironmentFile={ENV_FILE}"  # no '-': the file is not optional (issue 47)
OLD = "r00000000000b"


def host(root: str = "/srv/kdtree-engine", **service: object) -> HostConfig:
    svc = {"mode": "standin", "python": "/usr/bin/python3", **service}
    return builders.host("tb1", gpu_arch=None, root=root, service=svc)


def test_an_old_release_gets_todays_environment_file() -> None:
    """The issue's case: the old release was deployed before the inventory had an environment_file; its stored unit
    has none. Its template rendered with today's inventory keeps the key's EnvironmentFile."""
    then, today = host(), host(environment_file=ENV_FILE)
    stored = render(TEMPLATE, then)
    running = render(TEMPLATE, today)
    assert ENV_LINE not in stored and ENV_LINE in running
    text = release_unit_text(today, OLD, TEMPLATE, stored, running)
    assert f"{ENV_LINE}\n" in text and text == running


def test_a_template_without_a_setting_placeholder_is_refused() -> None:
    old_template = TEMPLATE.replace("@@ENVIRONMENT_FILE@@", "# (an older template)")
    today = host(environment_file=ENV_FILE)
    with pytest.raises(UnitSettingsLost) as e:
        release_unit_text(today, OLD, old_template, None, render(TEMPLATE, today))
    assert "EnvironmentFile=" in e.value.message and OLD in e.value.message and "tb1" in e.value.message
    # Any setting placeholder counts, whatever the inventory holds.
    with pytest.raises(UnitSettingsLost, match="User="):
        release_unit_text(host(), OLD, TEMPLATE.replace("User=@@USER@@", "User=nobody"), None, None)


def test_a_template_with_an_unknown_placeholder_names_the_file() -> None:
    with pytest.raises(DeployFailed, match=rf"{OLD}'s {TEMPLATE_REL}: .*@@NEW_THING@@"):
        release_unit_text(host(), OLD, TEMPLATE + "@@NEW_THING@@\n", None, None)


HAND_MADE = "[Unit]\nDescription=hand-made\n[Service]\nExecStart=/usr/bin/python3 -m x\n"


def test_release_zero_keeps_its_hand_made_unit_unless_it_loses_the_environment_file() -> None:
    today = host(environment_file=ENV_FILE)
    running = render(TEMPLATE, today)
    with pytest.raises(UnitSettingsLost) as e:
        release_unit_text(today, "r0-000000000000", None, HAND_MADE, running)
    assert ENV_LINE in e.value.message and "hand-made unit.service" in e.value.message
    with_env = HAND_MADE + f"{ENV_LINE}\n"
    assert release_unit_text(today, "r0-000000000000", None, with_env, running) == with_env
    # A hand-made unit that reads it with systemd's '-' keeps it too.
    optional = HAND_MADE + f"EnvironmentFile=-{ENV_FILE}\n"
    assert release_unit_text(today, "r0-000000000000", None, optional, running) == optional
    # The running unit without it (the inventory's file not in the unit yet): nothing is lost.
    assert release_unit_text(today, "r0-000000000000", None, HAND_MADE, HAND_MADE) == HAND_MADE
    # Today's inventory without an environment_file: dropping it is the operator's own change.
    assert release_unit_text(host(), "r0-000000000000", None, HAND_MADE, running) == HAND_MADE
    with pytest.raises(DeployFailed, match="neither"):
        release_unit_text(today, "r0-000000000000", None, None, running)


def test_unit_for_release_reads_the_releases_own_template(tmp_path: Path) -> None:
    """On a host (a local shell): the template under the release wins over its stored unit.service; release zero,
    which has no template, gives its unit.service."""
    root = tmp_path / "root"
    layout = Layout(str(root))
    release = root / "releases" / OLD
    (release / "systemd").mkdir(parents=True)
    (release / TEMPLATE_REL).write_text(TEMPLATE.replace("Restart=on-failure", "Restart=always"))
    (release / "unit.service").write_text("stale\n")
    zero = root / "releases" / "r0-000000000000"
    zero.mkdir(parents=True)
    (zero / "unit.service").write_text(HAND_MADE)
    today = host(root=str(root), environment_file=ENV_FILE)
    text = unit_for_release(LocalRemote(), today, layout, OLD)
    assert "Restart=always\n" in text and f"{ENV_LINE}\n" in text and "stale" not in text
    assert unit_for_release(LocalRemote(), today, layout, "r0-000000000000") == HAND_MADE
