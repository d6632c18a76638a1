"""Hostile inventory structure: YAML alias bombs, names with control characters, non-finite thresholds, and
threshold options from the command line (one line naming the option, never pydantic's dump)."""

from __future__ import annotations

import time

import pytest

from opsctl.errors import InventoryError, UsageError
from opsctl.inventory import GateSettings, parse, with_options


def alias_bomb(depth: int) -> str:
    """Nine aliases of nine aliases ...: ``depth`` 7 is 431 bytes and expands to 9**7 (4.8 million) strings."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth)]
    body = "".join(f"    {line}\n" for line in lines)
    return f"defaults:\n  extra:\n{body}hosts:\n  h1: {{address: 127.0.0.1, service: {{extra_args: *a{depth - 1}}}}}\n"


def refused(text: str) -> str:
    with pytest.raises(InventoryError) as exc:
        parse(text, "inv.yaml")
    return exc.value.message


@pytest.mark.parametrize("depth", [6, 9, 12])
def test_an_alias_bomb_is_refused_in_well_under_a_second(depth: int) -> None:
    # Before aliases were bounded, depth 7 (431 bytes) took 38 s and 2.4 GB (validation walked every value).
    text = alias_bomb(depth)
    assert len(text.encode()) < 700
    t = time.monotonic()
    msg = refused(text)
    assert time.monotonic() - t < 0.5
    assert msg.startswith("inv.yaml: YAML aliases expand the inventory to ") and "`defaults:`" in msg


def test_anchors_shared_by_a_few_hosts_are_fine_and_fast() -> None:
    """What yaml.safe_dump writes for a settings dict shared by several hosts: anchors and aliases, bounded."""
    args = "[" + ",".join(['"--x"'] * 99) + "]"
    hosts = "".join(f"  h{i}: {{address: x, service: {{extra_args: *args}}}}\n" for i in range(100))
    t = time.thread_time()  # CPU time: three test workers share two cores in CI
    inv = parse(f"defaults:\n  service:\n    extra_args: &args {args}\nhosts:\n{hosts}", "inv.yaml")
    assert time.thread_time() - t < 1.0
    assert len(inv.hosts) == 100 and inv.hosts["h99"].service.extra_args == ["--x"] * 99


def test_self_referencing_aliases_and_deep_nesting_are_refused() -> None:
    assert refused("hosts:\n  a: &r {address: x, self: *r}\n") == "inv.yaml:2: a YAML alias refers to itself"
    t = time.thread_time()
    deep = refused("hosts:\n  a: {address: x, extra: " + "[" * 5000 + "]" * 5000 + "}\n")
    assert deep == "inv.yaml:2: nested more than 64 levels deep" and time.thread_time() - t < 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'hosts:\n  "tb\\nfake: line": {address: x}\n',
            "inv.yaml:2: hosts.'tb\\nfake: line': 'tb\\nfake: line' is not a safe host",
        ),
        (
            'hosts:\n  a: {address: x}\ngroups:\n  "g\\u2028h": [a]\n',
            "inv.yaml:4: groups.'g\\u2028h': 'g\\u2028h' is not a safe group",
        ),
        (
            'hosts:\n  a: {address: x}\ngroups:\n  g: ["a\\x1b[31m"]\n',
            "inv.yaml:4: groups.g: member 'a\\x1b[31m' is not",
        ),
        ('hosts:\n  a: {address: x, "k\\ry": 1}\n', "inv.yaml:2: hosts.a.'k\\ry': unknown key"),
    ],
)
def test_control_characters_in_names_are_refused_on_one_line_escaped(text: str, expected: str) -> None:
    msg = refused(text)
    assert msg.startswith(expected), msg
    assert msg.isprintable(), repr(msg)  # one line: no newline, CR, escape or separator character left raw


@pytest.mark.parametrize("field", ["pass_rel", "fail_rel", "deadline_s", "poll_interval_s"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_thresholds_must_be_finite(field: str, value: str) -> None:
    msg = refused(f"hosts:\n  a:\n    address: x\n    gate: {{{field}: {value}}}\n")
    assert f"hosts.a.gate.{field}:" in msg and "\n" not in msg


def test_threshold_options_are_one_line_naming_the_option() -> None:
    base = GateSettings()
    names = {"pass_rel": "--pass-rel", "fail_rel": "--fail-rel", "consecutive_passes": "--passes"}

    def err(**values: object) -> str:
        with pytest.raises(UsageError) as exc:
            with_options(base, {k: (names[k], v) for k, v in values.items()})
        return exc.value.message

    assert err(pass_rel=float("inf"), fail_rel=float("inf")) == "--pass-rel: Input should be a finite number"
    assert err(fail_rel=float("nan")) == "--fail-rel: Input should be a finite number"
    assert err(pass_rel=0.5, fail_rel=0.1) == "--fail-rel (0.1) must be >= --pass-rel (0.5)"
    assert err(consecutive_passes=0) == "--passes: Input should be greater than or equal to 1"
    ok = with_options(base, {"pass_rel": ("--pass-rel", 0.02), "fail_rel": ("--fail-rel", None)})
    assert (ok.pass_rel, ok.fail_rel) == (0.02, base.fail_rel)
