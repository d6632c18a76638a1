"""The inventory's settings: one host (``HostConfig``, defaults already merged in) and its sections (gate, probe,
service, health), validated strictly; ``with_options`` overrides a section from command-line options under the same
rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import UsageError
from .fields import (
    Address,
    AlertCommand,
    EnvName,
    GpuArch,
    HttpPath,
    LocalPath,
    RemotePath,
    SafeName,
    ShellArg,
    UnitName,
    Webhook,
    no_control_characters,
)


class Strict(BaseModel):
    """Every section of the inventory: unknown keys refused, frozen, finite numbers, plain text in every string."""

    # No inf or NaN in any number: `pass_rel: .inf` would let rel=1e300 pass, and JSON has no Infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return no_control_characters(value)


class ProbeSettings(Strict):
    """The gate's own verify traffic (docs/gate.md "The probe"): after the restart opsctl waits until
    ``ready_path`` answers 200 on the host's loopback, then sends waves of greedy requests to ``endpoint`` from the
    host itself until the gate decides. The API key, if the server wants one, is read on the host from
    ``service.environment_file`` (variable ``api_key_env``): it is never in the inventory, argv or output."""

    enabled: bool = True
    endpoint: Literal["/generate", "/v1/completions"] = "/generate"
    ready_path: HttpPath = "/health"
    prompts: list[str] = Field(
        default_factory=lambda: ["The capital of France is", "def fibonacci(n):", "Once upon a time"],
        min_length=1,
        max_length=64,
    )
    input_ids: list[list[int]] | None = Field(None, min_length=1, max_length=64)
    requests: int = Field(4, ge=1, le=256)
    concurrency: int = Field(4, ge=1, le=64)
    max_new_tokens: int = Field(8, ge=1, le=4096)
    timeout_s: float = Field(60.0, gt=0, le=3600)
    parity_grace_s: float = Field(30.0, gt=0)
    api_key_env: EnvName = "SGLANG_API_KEY"
    model: SafeName = "default"

    @field_validator("input_ids")
    @classmethod
    def _token_ids(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        for ids in value or ():
            if not ids or any(i < 0 for i in ids):
                raise ValueError("each entry must be a non-empty list of token ids (integers >= 0)")
        return value

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: list[str]) -> list[str]:
        if any(not p for p in value):
            raise ValueError("a prompt must not be empty")
        return value


class GateSettings(Strict):
    """Thresholds of the parity gate (docs/gate.md)."""

    pass_rel: float = Field(1e-2, gt=0)
    fail_rel: float = Field(5e-2, gt=0)
    consecutive_passes: int = Field(3, ge=1, le=1000)
    deadline_s: float = Field(1800.0, gt=0)
    poll_interval_s: float = Field(2.0, gt=0, le=300)
    max_restarts: int = Field(2, ge=0)
    ssh_retries: int = Field(5, ge=0, le=100)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)

    @model_validator(mode="after")
    def _ordered(self) -> GateSettings:
        if self.fail_rel < self.pass_rel:
            raise ValueError(f"fail_rel ({self.fail_rel}) must be >= pass_rel ({self.pass_rel})")
        return self


class ServiceSettings(Strict):
    """What the unit runs: SGLang with the kdtree backend on GPU hosts; on testbeds the CPU stand-in for SGLang
    (``standin``: kdtree_backend.serve, which serves requests and verifies on each decode step) or the timer
    replay service (``replay``)."""

    mode: Literal["sglang", "standin", "replay"] = "sglang"
    python: RemotePath = "/usr/bin/python3"
    model_path: LocalPath = "/models/Kimi-K2.6"
    port: int = Field(30000, ge=1, le=65535)
    tp: int = Field(8, ge=1, le=64)
    attention: Literal["kdtree", "prefill-kdtree"] = "kdtree"
    speculative_algorithm: SafeName = "DDTREE"
    speculative_num_draft_tokens: int = Field(9, ge=1, le=128)
    extra_args: list[ShellArg] = Field(default_factory=list)
    environment_file: RemotePath | None = None
    replay_args: list[ShellArg] = Field(default_factory=list)
    standin_args: list[ShellArg] = Field(default_factory=list)  # e.g. ["--load-delay", "3"]
    start_timeout_s: int = Field(1800, ge=10)


class HealthSettings(Strict):
    """Scheduled health checks (opsctl health, the opsctl-health timer) and where alerts go."""

    on_calendar: ShellArg = "*:0/15"
    randomized_delay_s: int = Field(60, ge=0)
    http_path: HttpPath = "/health"
    http_timeout_s: float = Field(5.0, gt=0)
    parity_window_s: int = Field(3600, gt=0)
    restarts_warn: int = Field(1, ge=0)
    disk_warn_mb: int = Field(10240, ge=0)
    alert_command: AlertCommand | None = None
    alert_webhook: Webhook | None = None
    # `opsctl health --probe`: one greedy request through the service's API, then fresh parity lines from every
    # rank with the running invocation's token (docs/gate.md "Health checks"). Off unless asked for: it is traffic.
    probe: bool = False
    probe_max_new_tokens: int = Field(64, ge=1, le=4096)
    probe_wait_s: float = Field(15.0, gt=0, le=600)


class HostConfig(Strict):
    """One host, defaults already merged in."""

    name: SafeName
    address: Address | None = None
    port: int = Field(22, ge=1, le=65535)
    user: SafeName = "root"
    identity_file: LocalPath | None = None
    ssh_alias: SafeName | None = None
    known_hosts: LocalPath = "~/.ssh/known_hosts"
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    connect_timeout_s: float = Field(10.0, gt=0, le=300)
    command_timeout_s: float = Field(600.0, gt=0)
    root: RemotePath = "/root/kdtree-engine"
    unit: UnitName = "sglang-k26-ddtree"
    gpu_arch: GpuArch | None = "12.0"
    build_timeout_s: float = Field(1800.0, gt=0)
    keep_releases: int = Field(5, ge=2, le=100)
    min_free_disk_mb: int = Field(2048, ge=0)
    gate: GateSettings = Field(default_factory=GateSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)

    @model_validator(mode="after")
    def _reachable(self) -> HostConfig:
        if self.address is None and self.ssh_alias is None:
            raise ValueError("needs an 'address' or an 'ssh_alias'")
        return self

    @property
    def target(self) -> str:
        """What ssh connects to: the ssh_config alias when given, else the address."""
        return self.ssh_alias or self.address or self.name


_Settings = TypeVar("_Settings", bound=BaseModel)


def with_options(settings: _Settings, options: Mapping[str, tuple[str, Any]]) -> _Settings:
    """``settings`` (an inventory section, e.g. a host's ``gate``) with fields set from command-line options:
    ``{field: (option, value)}``; a None value leaves the field as it is. Every rule of the inventory holds
    (finite thresholds, fail_rel >= pass_rel, ...), and a refusal is one UsageError line naming the option
    (``--pass-rel: Input should be a finite number``), never pydantic's multi-line dump."""
    update = {name: value for name, (_, value) in options.items() if value is not None}
    try:
        return type(settings).model_validate({**settings.model_dump(), **update})
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"][0] if first["loc"] else None
        msg = str(first["msg"]).removeprefix("Value error, ")
        if isinstance(loc, str) and loc in options:
            raise UsageError(f"{options[loc][0]}: {msg}") from None
        for name, (option, _) in options.items():  # a rule over several fields names them as the fields
            msg = msg.replace(name, option)
        raise UsageError(msg) from None
