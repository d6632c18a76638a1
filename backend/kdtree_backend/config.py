"""The release's kdtree configuration: ``$KDTREE_CONFIG`` (JSON) or ``<release>/deploy/kdtree.json``.

Environment overrides (for a one-off run, e.g. from the unit's Environment=):
  KDTREE_PARITY=0|1, KDTREE_PARITY_EVERY=N, KDTREE_PARITY_BURST=N, KDTREE_PARITY_LAYERS=0,30,60,
  KDTREE_USE_KERNEL=0|1, KDTREE_ATTENTION_MODE=kdtree|prefill.
Parsing is pure (:func:`parse_config`); only :func:`load_config` touches the file system and environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

CONFIG_ENV = "KDTREE_CONFIG"
# backend/kdtree_backend/config.py -> <release or repo root>/deploy/kdtree.json
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "deploy" / "kdtree.json"
ATTENTION_MODES = ("kdtree", "prefill")  # kdtree everywhere, or prefill=kdtree with decode=triton
TREE_KINDS = ("tree", "chain", "star")
# Verify steps sampled densely after the process starts: 8 steps x 3 layers = 24 lines per rank, far more than
# the gate's consecutive_passes (3 by default), so a verdict needs only the first few steps of traffic.
DEFAULT_BURST_STEPS = 8
STANDIN_FAULTS = (
    "nan", "rel-offset", "silent-rank", "crash-at-load", "http-500", "slow", "common-mode", "split-line",
    "slow-batch",
)  # fmt: skip


class ConfigError(ValueError):
    """The configuration file or an override is malformed; the message names the field."""


@dataclass(frozen=True)
class ParityConfig:
    enabled: bool = True
    every_n_steps: int = 50
    layers: tuple[int, ...] = (0, 30, 60)
    # Every one of the first ``burst_steps`` verify steps after the process start is sampled (docs/lines.md):
    # the deploy gate's verdict then needs seconds of traffic after readiness, not every_n_steps x passes steps.
    burst_steps: int = DEFAULT_BURST_STEPS

    def sampled(self, step: int) -> bool:
        """Parity on this verify step (0-based count since the process started)?"""
        return self.enabled and (step < self.burst_steps or step % self.every_n_steps == 0)

    def wants(self, step: int, layer: int) -> bool:
        """Parity on this verify step (0-based count) and layer?"""
        return self.sampled(step) and layer in self.layers


@dataclass(frozen=True)
class StandinFault:
    """A failure the testbed's stand-in server injects (docs/testbed.md): ``kind`` one of STANDIN_FAULTS,
    ``value`` the offset of rel-offset, the rank of silent-rank or split-line, or the factor of slow and
    slow-batch."""

    kind: str
    value: float = 0.0

    @staticmethod
    def parse(raw: object, name: str = "standin.fault") -> StandinFault | None:
        if raw is None or raw == "":
            return None
        if not isinstance(raw, str):
            raise ConfigError(f"{name} must be a string or null, got {raw!r}")
        kind, _, arg = raw.partition(":")
        if kind not in STANDIN_FAULTS:
            raise ConfigError(f"{name} must be one of {', '.join(STANDIN_FAULTS)} (or null), got {raw!r}")
        # slow:F, every verify step takes F times as long; slow-batch:F, only while 2 or more requests are decoded
        if kind in ("slow", "slow-batch"):
            try:
                factor = float(arg)
            except ValueError:
                raise ConfigError(f"{name} {raw!r}: {kind} needs a factor, e.g. {kind}:1.5") from None
            if not 1.0 <= factor <= 100.0:
                raise ConfigError(f"{name} {raw!r}: the factor must be in 1..100")
            return StandinFault(kind, factor)
        if kind in ("rel-offset", "silent-rank", "split-line"):
            try:
                value = float(arg) if kind == "rel-offset" else float(int(arg))
            except ValueError:
                what = "a number, e.g. rel-offset:0.5" if kind == "rel-offset" else "a rank, e.g. silent-rank:1"
                raise ConfigError(f"{name} {raw!r}: {kind} needs {what}") from None
            if kind != "rel-offset" and value < 0:
                raise ConfigError(f"{name} {raw!r}: the rank must be >= 0")
            return StandinFault(kind, value)
        if arg:
            raise ConfigError(f"{name} {raw!r}: {kind} takes no argument")
        return StandinFault(kind)


@dataclass(frozen=True)
class StandinConfig:
    """The testbed's SGLang stand-in (kdtree_backend.serve): model-load delay and an injected failure."""

    load_delay_s: float = 3.0
    fault: StandinFault | None = None


@dataclass(frozen=True)
class ReplayConfig:
    bs: int = 2
    prefix: int = 64
    q_len: int = 9
    heads: int = 8
    layers: tuple[int, ...] = (0, 30, 60)
    interval_s: float = 1.0
    every_n_steps: int = 1
    dtype: str = "bfloat16"
    tree: str = "tree"


@dataclass(frozen=True)
class KdtreeConfig:
    parity: ParityConfig = field(default_factory=ParityConfig)
    use_kernel: bool = True
    attention_mode: str = "kdtree"
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    standin: StandinConfig = field(default_factory=StandinConfig)
    # The CUDA graphs carry capture slots for the parity layers (docs/capture.md): without conditional nodes in
    # torch, their copies run on every replay (~10-25 us per step for 3 layers on an H200); false saves that,
    # and a capture under CUDA graphs then ends at once with reason graph_capture_off.
    capture_in_graphs: bool = True
    source: str = "defaults"


def _bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{name} must be a boolean (true/false or 1/0), got {value!r}")


def _positive_int(value: object, name: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return number


def _non_negative_int(value: object, name: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}") from None
    if number < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    return number


def _layers(value: object, name: str) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(f"{name} must be a list of layer ids, got {value!r}")
    try:
        layers = tuple(int(str(item).strip()) for item in items if str(item).strip() != "")
    except ValueError:
        raise ConfigError(f"{name} must be a list of layer ids, got {value!r}") from None
    if any(layer < 0 for layer in layers):
        raise ConfigError(f"{name} must hold non-negative layer ids, got {value!r}")
    return layers


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = data.get(key, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"'{key}' must be an object, got {section!r}")
    return section


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None, source: str = "") -> KdtreeConfig:
    """Configuration from the JSON object ``data`` with the environment overrides of ``env`` applied."""
    env = env or {}
    parity_raw = dict(_section(data, "parity"))
    backend_raw = dict(_section(data, "backend"))
    replay_raw = dict(_section(data, "replay"))
    capture_raw = dict(_section(data, "capture"))
    if env.get("KDTREE_CAPTURE_IN_GRAPHS"):
        capture_raw["in_graphs"] = env["KDTREE_CAPTURE_IN_GRAPHS"]
    for env_key, key in (
        ("KDTREE_PARITY", "enabled"),
        ("KDTREE_PARITY_EVERY", "every_n_steps"),
        ("KDTREE_PARITY_BURST", "burst_steps"),
    ):
        if env.get(env_key):
            parity_raw[key] = env[env_key]
    if env.get("KDTREE_PARITY_LAYERS") is not None:
        parity_raw["layers"] = env["KDTREE_PARITY_LAYERS"]
    if env.get("KDTREE_USE_KERNEL"):
        backend_raw["use_kernel"] = env["KDTREE_USE_KERNEL"]
    if env.get("KDTREE_ATTENTION_MODE"):
        backend_raw["attention_mode"] = env["KDTREE_ATTENTION_MODE"]

    defaults = ParityConfig()
    parity = ParityConfig(
        enabled=_bool(parity_raw.get("enabled", defaults.enabled), "parity.enabled"),
        every_n_steps=_positive_int(parity_raw.get("every_n_steps", defaults.every_n_steps), "parity.every_n_steps"),
        layers=_layers(parity_raw.get("layers", list(defaults.layers)), "parity.layers"),
        burst_steps=_non_negative_int(parity_raw.get("burst_steps", defaults.burst_steps), "parity.burst_steps"),
    )
    mode = str(backend_raw.get("attention_mode", "kdtree"))
    if mode not in ATTENTION_MODES:
        raise ConfigError(f"backend.attention_mode must be one of {ATTENTION_MODES}, got {mode!r}")
    replay = _parse_replay(replay_raw)
    return KdtreeConfig(
        parity=parity,
        use_kernel=_bool(backend_raw.get("use_kernel", True), "backend.use_kernel"),
        attention_mode=mode,
        replay=replay,
        standin=_parse_standin(dict(_section(data, "standin"))),
        capture_in_graphs=_bool(capture_raw.get("in_graphs", True), "capture.in_graphs"),
        source=source or "inline",
    )


def _parse_replay(raw: Mapping[str, Any]) -> ReplayConfig:
    base = ReplayConfig()
    values: dict[str, Any] = {}
    for key in ("bs", "prefix", "q_len", "heads", "every_n_steps"):
        if key in raw:
            values[key] = _positive_int(raw[key], f"replay.{key}")
    if "layers" in raw:
        values["layers"] = _layers(raw["layers"], "replay.layers")
    if "interval_s" in raw:
        try:
            values["interval_s"] = float(raw["interval_s"])
        except (TypeError, ValueError):
            raise ConfigError(f"replay.interval_s must be a number, got {raw['interval_s']!r}") from None
    if "dtype" in raw:
        if raw["dtype"] not in ("bfloat16", "float16", "float32"):
            raise ConfigError(f"replay.dtype must be bfloat16, float16 or float32, got {raw['dtype']!r}")
        values["dtype"] = raw["dtype"]
    if "tree" in raw:
        if raw["tree"] not in TREE_KINDS:
            raise ConfigError(f"replay.tree must be one of {TREE_KINDS}, got {raw['tree']!r}")
        values["tree"] = raw["tree"]
    return replace(base, **values)


def _parse_standin(raw: Mapping[str, Any]) -> StandinConfig:
    unknown = sorted(set(raw) - {"load_delay_s", "fault"})
    if unknown:
        raise ConfigError(f"standin: unknown key(s) {', '.join(unknown)}; known: load_delay_s, fault")
    delay = raw.get("load_delay_s", StandinConfig.load_delay_s)
    try:
        load_delay_s = float(delay)
    except (TypeError, ValueError):
        raise ConfigError(f"standin.load_delay_s must be a number of seconds, got {delay!r}") from None
    if not load_delay_s >= 0:
        raise ConfigError(f"standin.load_delay_s must be >= 0, got {delay!r}")
    return StandinConfig(load_delay_s=load_delay_s, fault=StandinFault.parse(raw.get("fault")))


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get(CONFIG_ENV)
    return Path(raw) if raw else DEFAULT_CONFIG_PATH


def load_config(env: Mapping[str, str] | None = None) -> KdtreeConfig:
    """Read the configuration file (``$KDTREE_CONFIG`` or the release default) and apply env overrides.

    A missing default file yields the built-in defaults; a missing ``$KDTREE_CONFIG`` file is an error.
    """
    env = os.environ if env is None else env
    path = config_path(env)
    if not path.is_file():
        if env.get(CONFIG_ENV):
            raise ConfigError(f"{CONFIG_ENV}={path} does not exist; point it at a kdtree.json or unset it")
        return parse_config({}, env, source="defaults")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return parse_config(data, env, source=str(path))
