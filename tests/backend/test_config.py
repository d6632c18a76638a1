"""Configuration: the shipped deploy/kdtree.json, env overrides, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kdtree_backend.config import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    ParityConfig,
    StandinConfig,
    StandinFault,
    load_config,
    parse_config,
)


def test_shipped_config_parses_with_parity_on() -> None:
    assert DEFAULT_CONFIG_PATH.is_file(), "deploy/kdtree.json ships in every release"
    config = load_config(env={})
    assert config.source == str(DEFAULT_CONFIG_PATH)
    assert config.parity.enabled and config.parity.every_n_steps >= 1 and config.parity.layers
    assert config.attention_mode in ("kdtree", "prefill")


def test_env_overrides_take_precedence() -> None:
    data = {"parity": {"enabled": True, "every_n_steps": 50, "layers": [0, 30, 60]}}
    env = {"KDTREE_PARITY": "0", "KDTREE_PARITY_EVERY": "7", "KDTREE_PARITY_LAYERS": "1, 2", "KDTREE_USE_KERNEL": "no"}
    config = parse_config(data, env)
    assert config.parity == ParityConfig(enabled=False, every_n_steps=7, layers=(1, 2))
    assert config.use_kernel is False


def test_capture_in_graphs_defaults_on_and_is_switched_by_file_or_env() -> None:
    assert parse_config({}).capture_in_graphs is True
    assert parse_config({"capture": {"in_graphs": False}}).capture_in_graphs is False
    assert parse_config({"capture": {"in_graphs": True}}, {"KDTREE_CAPTURE_IN_GRAPHS": "0"}).capture_in_graphs is False


def test_kdtree_config_env_points_at_a_file(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"parity": {"every_n_steps": 3}, "replay": {"bs": 5, "tree": "chain"}}))
    config = load_config(env={"KDTREE_CONFIG": str(path)})
    assert config.parity.every_n_steps == 3 and config.replay.bs == 5 and config.replay.tree == "chain"


def test_missing_explicit_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KDTREE_CONFIG"):
        load_config(env={"KDTREE_CONFIG": str(tmp_path / "absent.json")})


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"parity": {"every_n_steps": 0}}, "parity.every_n_steps"),
        ({"parity": {"enabled": "maybe"}}, "parity.enabled"),
        ({"parity": {"layers": "a,b"}}, "parity.layers"),
        ({"backend": {"attention_mode": "decode"}}, "backend.attention_mode"),
        ({"replay": {"dtype": "int8"}}, "replay.dtype"),
        ({"parity": []}, "'parity'"),
        ({"capture": {"in_graphs": "sometimes"}}, "capture.in_graphs"),
    ],
)
def test_bad_values_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(data)


def test_parity_sampling() -> None:
    parity = ParityConfig(enabled=True, every_n_steps=50, layers=(0, 30), burst_steps=0)
    assert parity.wants(0, 0) and parity.wants(100, 30)
    assert not parity.wants(1, 0) and not parity.wants(50, 1)
    assert not ParityConfig(enabled=False).wants(0, 0)


def test_parity_burst_samples_every_step_after_start() -> None:
    parity = ParityConfig(enabled=True, every_n_steps=50, layers=(0,), burst_steps=8)
    assert [step for step in range(120) if parity.sampled(step)] == [0, 1, 2, 3, 4, 5, 6, 7, 50, 100]
    assert not ParityConfig(enabled=False, burst_steps=8).sampled(0)
    assert parse_config({}).parity.burst_steps == 8  # 8 steps x 3 layers: consecutive_passes many times over
    assert parse_config({"parity": {"burst_steps": 0}}).parity.burst_steps == 0
    assert parse_config({}, {"KDTREE_PARITY_BURST": "2"}).parity.burst_steps == 2
    with pytest.raises(ConfigError, match=r"parity\.burst_steps"):
        parse_config({"parity": {"burst_steps": -1}})


def test_standin_section() -> None:
    config = parse_config({"standin": {"load_delay_s": 5, "fault": "rel-offset:0.25"}})
    assert config.standin == StandinConfig(5.0, StandinFault("rel-offset", 0.25))
    assert parse_config({}).standin == StandinConfig(3.0, None)
    assert parse_config({"standin": {"fault": "silent-rank:1"}}).standin.fault == StandinFault("silent-rank", 1)
    for fault in ("nan", "crash-at-load", "http-500"):
        assert parse_config({"standin": {"fault": fault}}).standin.fault == StandinFault(fault)
    for bad, message in [
        ({"fault": "meltdown"}, "must be one of"),
        ({"fault": "rel-offset"}, "needs a number"),
        ({"fault": "silent-rank:x"}, "needs a rank"),
        ({"fault": "nan:1"}, "takes no argument"),
        ({"fault": 3}, "string or null"),
        ({"load_delay_s": -1}, "load_delay_s"),
        ({"delay": 1}, "unknown key"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"standin": bad})
