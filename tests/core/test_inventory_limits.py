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


def test_an_alias_bomb_is_refused_in_well_under_a_second() -> None:
    # Before aliases were refused, depth 7 took 38 s and 2.4 GB (validation walked every expanded value).
    text = alias_bomb(9)
    assert len(text.encode()) < 600
    t = time.monotonic()
    msg = refused(text)
    assert time.monotonic() - t < 0.5
    assert msg.startswith("inv.yaml:3: an anchor (&name)") and "defaults:" in msg


def test_a_lone_alias_or_anchor_is_refused_with_its_line() -> None:
    assert refused("hosts:\n  a: &base {address: x}\n").startswith("inv.yaml:2: an anchor")
    assert refused("hosts:\n  a: {address: x}\n  b: *nothing\n").startswith("inv.yaml:3: an alias (*name)")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('hosts:\n  "tb\\nfake: line": {address: x}\n', "inv.yaml:2: hosts: the host name 'tb\\nfake: line' is not"),
        ('hosts:\n  a: {address: x}\ngroups:\n  "g\\u2028h": [a]\n', "inv.yaml:4: groups: the group name 'g\\u2028h'"),
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
