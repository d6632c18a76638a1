"""inventory.yaml validation: every error names file, line and field; unsafe values are refused."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory import ENV_VAR, load, parse

GOOD = textwrap.dedent(
    """\
    defaults:
      user: root
      connect_timeout_s: 7
      gate:
        pass_rel: 0.02
        fail_rel: 0.1
    hosts:
      a:
        address: 10.0.0.1
      b:
        address: 10.0.0.2
        port: 2222
        gate:
          consecutive_passes: 5
    groups:
      fleet: [a, b]
    """
)


def _err(text: str) -> str:
    with pytest.raises(InventoryError) as exc:
        parse(text, "inv.yaml")
    return exc.value.message


def test_good_inventory_merges_defaults_into_hosts() -> None:
    inv = parse(GOOD, "inv.yaml")
    a, b = inv.hosts["a"], inv.hosts["b"]
    assert a.connect_timeout_s == 7 and b.connect_timeout_s == 7
    assert b.port == 2222 and a.port == 22
    # Nested maps merge: b keeps the default thresholds and adds its own consecutive_passes.
    assert b.gate.pass_rel == 0.02 and b.gate.fail_rel == 0.1 and b.gate.consecutive_passes == 5
    assert a.gate.consecutive_passes == 3


def test_resolve_host_group_and_all() -> None:
    inv = parse(GOOD, "inv.yaml")
    assert [h.name for h in inv.resolve("a")] == ["a"]
    assert [h.name for h in inv.resolve("fleet")] == ["a", "b"]
    assert [h.name for h in inv.resolve("all")] == ["a", "b"]
    with pytest.raises(InventoryError, match="no host or group named 'zz'"):
        inv.resolve("zz")
    with pytest.raises(InventoryError, match="is a group"):
        inv.host("fleet")


def test_bad_yaml_names_file_and_line() -> None:
    msg = _err("hosts:\n  a:\n    address: [unclosed\n")
    assert msg.startswith("inv.yaml:") and "invalid YAML" in msg


def test_not_a_mapping() -> None:
    assert "must be a mapping" in _err("- just\n- a list\n")


def test_missing_hosts_section() -> None:
    msg = _err("defaults:\n  user: root\n")
    assert "hosts" in msg and "required field is missing" in msg


def test_host_without_address_or_alias() -> None:
    msg = _err("hosts:\n  a:\n    port: 22\n")
    assert msg.startswith("inv.yaml:2: hosts.a") and "address" in msg


def test_unknown_key_names_line_and_field() -> None:
    msg = _err("hosts:\n  a:\n    address: 10.0.0.1\n    adress_typo: x\n")
    assert msg == "inv.yaml:4: hosts.a.adress_typo: unknown key"


def test_unknown_nested_key() -> None:
    msg = _err("hosts:\n  a:\n    address: h\n    gate:\n      pass_rell: 0.1\n")
    assert msg.startswith("inv.yaml:5: hosts.a.gate.pass_rell") and "unknown key" in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("unit", "'sglang; rm -rf /'"),
        ("unit", "'my unit'"),
        ("unit", "'a..b'"),
        ("unit", "'x$(id)'"),
        ("root", "/root/../etc"),
        ("root", "'/root/kd tree'"),
        ("root", "'/root/$(id)'"),
        ("root", "relative/path"),
        ("root", "/etc"),
        ("address", "'h;reboot'"),
        ("identity_file", "'~/.ssh/id; rm'"),
        ("user", "'ro ot'"),
        ("gpu_arch", "'sm_120'"),
    ],
)
def test_hostile_values_are_refused(field: str, value: str) -> None:
    text = f"hosts:\n  a:\n    address: 10.0.0.1\n    {field}: {value}\n"
    if field == "address":
        text = f"hosts:\n  a:\n    {field}: {value}\n"
    msg = _err(text)
    line = 3 if field == "address" else 4
    assert msg.startswith(f"inv.yaml:{line}: hosts.a.{field}: "), msg


def test_hostile_extra_args() -> None:
    msg = _err("hosts:\n  a:\n    address: h\n    service:\n      extra_args: ['--x', '$(reboot)']\n")
    assert "hosts.a.service.extra_args" in msg and "shell syntax" in msg


def test_bad_default_is_reported_where_it_is_written() -> None:
    msg = _err("defaults:\n  port: 0\nhosts:\n  a:\n    address: h\n")
    assert msg.startswith("inv.yaml:2: defaults.port"), msg


def test_gate_thresholds_ordered() -> None:
    msg = _err("hosts:\n  a:\n    address: h\n    gate:\n      pass_rel: 0.5\n      fail_rel: 0.1\n")
    assert "fail_rel" in msg and "hosts.a.gate" in msg


def test_group_with_unknown_host() -> None:
    msg = _err("hosts:\n  a:\n    address: h\ngroups:\n  g: [a, nope]\n")
    assert msg == "inv.yaml:5: groups.g: unknown host(s) nope"


def test_group_named_like_a_host() -> None:
    assert "cannot share its name" in _err("hosts:\n  a:\n    address: h\ngroups:\n  a: [a]\n")


def test_load_honours_explicit_path_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("hosts:\n  one:\n    address: h1\n")
    two.write_text("hosts:\n  two:\n    address: h2\n")
    monkeypatch.setenv(ENV_VAR, str(two))
    assert list(load().hosts) == ["two"]
    assert list(load(one).hosts) == ["one"]
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load()


def test_repository_inventory_is_valid() -> None:
    inv = load(Path(__file__).parents[2] / "inventory.yaml")
    assert "ct200" in inv.hosts and inv.groups["prod"] == ("ct200",)
