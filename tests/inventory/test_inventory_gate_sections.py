"""`gate.probe` and `gate.compare` (issue 36 item 7, issue 37): values that reach the host program are refused at
load, naming file:line and field, when out of range, non-finite, huge, of the wrong type or coerced (``"4"``,
``4.0``, ``true`` are not the integer 4); ``ready_path`` is a plain absolute path; the documented defaults."""

from __future__ import annotations

import json
import textwrap

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory import CompareSettings, HostConfig, parse
from opsctl.inventory.settings import DEFAULT_COMPARE_PROMPTS, MAX_PROMPT_CHARS, MAX_TOKEN_ID


def inventory(section: str, body: str) -> str:
    return textwrap.dedent(
        """\
        hosts:
          a:
            address: 10.0.0.1
            gpu_arch: null
            gate:
              {section}:
        {body}
        """
    ).format(section=section, body=textwrap.indent(body, " " * 8))


def refused(section: str, body: str) -> str:
    with pytest.raises(InventoryError) as exc:
        parse(inventory(section, body), "inv.yaml")
    return exc.value.message


COERCED = [
    ("requests", '"4"'),
    ("requests", "4.0"),
    ("requests", "true"),
    ("concurrency", '"2"'),
    ("max_new_tokens", "8.0"),
    ("timeout_s", '"60"'),
    ("timeout_s", "true"),
    ("enabled", '"yes"'),
    ("input_ids", "[[true]]"),
    ("input_ids", '[["1"]]'),
    ("input_ids", "[[1.0]]"),
    ("prompts", "[1]"),
]


@pytest.mark.parametrize(("field", "value"), COERCED)
def test_probe_values_are_not_coerced(field: str, value: str) -> None:
    msg = refused("probe", f"{field}: {value}")
    assert msg.startswith("inv.yaml:7: hosts.a.gate.probe.") and f"probe.{field}" in msg, msg


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("requests: 257", "requests", "less than or equal to 256"),
        ("concurrency: 65", "concurrency", "64"),
        ("max_new_tokens: 5000", "max_new_tokens", "4096"),
        ("timeout_s: 3601", "timeout_s", "3600"),
        ("timeout_s: .nan", "timeout_s", "finite"),
        ("parity_grace_s: 3601", "parity_grace_s", "3600"),
        (f"prompts: [{json.dumps('x' * (MAX_PROMPT_CHARS + 1))}]", "prompts", "at most 262,144"),
        ("prompts: " + json.dumps(["y" * 200_000] * 6), "prompts", "together; at most 1,048,576"),
        (f"input_ids: [[{MAX_TOKEN_ID + 1}]]", "input_ids", "token ids must be integers in"),
        ("input_ids: [[-1]]", "input_ids", "token ids must be integers in"),
        ("input_ids: [" + ",".join(["[" + ",".join(["1"] * 30_000) + "]"] * 3) + "]", "input_ids", "65,536"),
        ("input_ids: [[" + ",".join(["1"] * 32_769) + "]]", "input_ids", "at most 32,768"),
        ("input_ids: [[]]", "input_ids", "empty"),
    ],
)
def test_probe_values_over_the_documented_limits_are_refused(body: str, field: str, words: str) -> None:
    msg = refused("probe", body)
    assert f"hosts.a.gate.probe.{field}" in msg and words in msg and msg.startswith("inv.yaml:7:"), msg


@pytest.mark.parametrize(
    "path", ["/a/../b", "/..", "/a/./b", "/%2e%2e/x", "/h;x", "/h\\u0001", "/h%00", "health", "/h?x", "/ok//x"]
)
def test_ready_path_is_a_plain_absolute_path(path: str) -> None:
    msg = refused("probe", f"ready_path: {json.dumps(path)}")
    assert "hosts.a.gate.probe.ready_path" in msg and ("plain absolute URL path" in msg or "control" in msg), msg


def test_plain_ready_paths_are_accepted() -> None:
    for path in ("/health", "/ready", "/v1/health_generate", "/a.b/c~d-e_f"):
        host = parse(inventory("probe", f"ready_path: {path}"), "inv.yaml").host("a")
        assert host.gate.probe.ready_path == path


# ------------------------------------------------------------------------------------------------ gate.compare


def test_compare_defaults_are_the_documented_ones() -> None:
    c = HostConfig(name="a", address="x").gate.compare
    assert isinstance(c, CompareSettings)
    assert (c.enabled, c.max_new_tokens, c.concurrency, c.warmup, c.compare_tokens, c.enforce) == (
        True, 32, [1, 8], 2, 32, True
    )  # fmt: skip
    assert (c.min_identical, c.max_slowdown, c.alpha, c.max_accept_drop, c.max_load_diff, c.timeout_s) == (
        0.5, 0.04, 0.01, 0.10, 1.0, 60.0
    )  # fmt: skip
    assert c.prompts == list(DEFAULT_COMPARE_PROMPTS) and len(c.prompts) == 16 and c.input_ids is None
    lengths = sorted(len(p) for p in c.prompts)
    assert lengths[0] < 30 and lengths[-1] > 150  # of varied length
    assert c.workload_size == 16
    assert HostConfig(name="a", address="x").health.max_drift == 0.2


def test_compare_tokens_default_to_all_new_tokens_and_never_exceed_them() -> None:
    assert CompareSettings(max_new_tokens=8).compare_tokens == 8
    assert CompareSettings(max_new_tokens=64, compare_tokens=16).compare_tokens == 16
    msg = refused("compare", "max_new_tokens: 8\ncompare_tokens: 16")
    assert "hosts.a.gate.compare" in msg and "compare_tokens (16) must be <= max_new_tokens (8)" in msg


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("min_identical: 1.5", "min_identical"),
        ("min_identical: -0.1", "min_identical"),
        ("max_slowdown: 1", "max_slowdown"),
        ("max_slowdown: .inf", "max_slowdown"),
        ("alpha: 0", "alpha"),
        ("alpha: .nan", "alpha"),
        ("alpha: 0.6", "alpha"),
        ("max_accept_drop: -1", "max_accept_drop"),
        ("max_load_diff: -1", "max_load_diff"),
        ("max_load_diff: 1001", "max_load_diff"),
        ("warmup: 65", "warmup"),
        ("warmup: -1", "warmup"),
        ("max_new_tokens: 1", "max_new_tokens"),
        ("max_new_tokens: 4097", "max_new_tokens"),
        ("concurrency: 0", "concurrency"),
        ("timeout_s: 0", "timeout_s"),
        ("timeout_s: 1.0e+6", "timeout_s"),
        ("enforce: 1", "enforce"),
        ('enabled: "true"', "enabled"),
        ("warmup: 2.0", "warmup"),
        ("compare_tokens: true", "compare_tokens"),
        ('input_ids: [["1"]]', "input_ids"),
        (f"prompts: [{json.dumps('x' * (MAX_PROMPT_CHARS + 1))}]", "prompts"),
        ("prompts: []", "prompts"),
        ('prompts: [""]', "prompts"),
        ("typo: 1", "typo"),
    ],
)
def test_compare_values_out_of_range_of_the_wrong_type_or_huge_are_refused(body: str, field: str) -> None:
    msg = refused("compare", body)
    assert msg.startswith("inv.yaml:") and f"hosts.a.gate.compare.{field}" in msg, msg


def test_compare_settings_are_frozen() -> None:
    c = CompareSettings()
    with pytest.raises(Exception, match="frozen"):
        c.alpha = 0.5  # type: ignore[misc]


@pytest.mark.parametrize("value", ["0", "1", "-0.1", ".nan", '"0.2"'])
def test_health_max_drift_is_a_fraction(value: str) -> None:
    text = "hosts:\n  a:\n    address: x\n    health:\n      max_drift: " + value + "\n"
    with pytest.raises(InventoryError, match=r"inv.yaml:5: hosts.a.health.max_drift"):
        parse(text, "inv.yaml")
