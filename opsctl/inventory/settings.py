"""The inventory's settings: one host (``HostConfig``, defaults already merged in) and its sections (gate, probe,
service, health), validated strictly; ``with_options`` overrides a section from command-line options under the same
rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

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
    redacted_command,
)
from .yamlsource import LineMap


class Strict(BaseModel):
    """Every section of the inventory: unknown keys refused, frozen, finite numbers, plain text in every string."""

    # No inf or NaN in any number: `pass_rel: .inf` would let rel=1e300 pass, and JSON has no Infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return no_control_characters(value)


# Limits of what the gate's program takes to the host (docs/gate.md "Limits"): checked at load, so a value that
# would make every gated deploy fail (or `hosts --json` slow) is refused with its file, line and field.
MAX_PROMPT_CHARS = 262_144  # one prompt
MAX_PROMPTS_CHARS = 1_048_576  # all prompts of a section together
MAX_PROMPTS = 256  # prompts or token-id lists in a section
MAX_INPUT_IDS = 32_768  # token ids in one list
MAX_INPUT_IDS_TOTAL = 65_536  # token ids in all lists of a section together
MAX_TOKEN_ID = 2**24 - 1  # above any vocabulary in use (Kimi K2: 163,840)
MAX_TIMEOUT_S = 3600.0


def _check_prompts(value: list[str]) -> list[str]:
    for i, prompt in enumerate(value):
        if not prompt:
            raise ValueError(f"prompt {i} is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt {i} has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,}")
    total = sum(map(len, value))
    if total > MAX_PROMPTS_CHARS:
        raise ValueError(f"the prompts have {total:,} characters together; at most {MAX_PROMPTS_CHARS:,}")
    return value


def _check_input_ids(value: list[list[int]] | None) -> list[list[int]] | None:
    total = 0
    for i, ids in enumerate(value or ()):
        if not ids:
            raise ValueError(f"entry {i} is empty; each entry must be a non-empty list of token ids")
        if len(ids) > MAX_INPUT_IDS:
            raise ValueError(f"entry {i} has {len(ids):,} token ids; at most {MAX_INPUT_IDS:,}")
        if any(t < 0 or t > MAX_TOKEN_ID for t in ids):
            raise ValueError(f"entry {i}: token ids must be integers in [0, {MAX_TOKEN_ID:,}]")
        total += len(ids)
    if total > MAX_INPUT_IDS_TOTAL:
        raise ValueError(f"{total:,} token ids together; at most {MAX_INPUT_IDS_TOTAL:,}")
    return value


# A workload's prompts and token-id lists (gate.probe, gate.compare), checked against the limits above.
Prompts = Annotated[list[str], AfterValidator(_check_prompts)]
TokenIdLists = Annotated[list[list[int]], AfterValidator(_check_input_ids)]


class StrictTypes(Strict):
    """A section whose values go to the host program: no coercion (``requests: "4"``, ``4.0`` or ``true`` is not
    the integer 4; ``input_ids: [["1"]]`` or ``[[true]]`` is not a token id)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True, defer_build=True)


class ProbeSettings(StrictTypes):
    """The gate's own verify traffic (docs/gate.md "The probe"): after the restart opsctl waits until
    ``ready_path`` answers 200 on the host's loopback, then sends waves of greedy requests to ``endpoint`` from the
    host itself until the gate decides. The API key, if the server wants one, is read on the host from
    ``service.environment_file`` (variable ``api_key_env``): it is never in the inventory, argv or output."""

    enabled: bool = True
    endpoint: Literal["/generate", "/v1/completions"] = "/generate"
    ready_path: HttpPath = "/health"
    prompts: Prompts = Field(
        default_factory=lambda: ["The capital of France is", "def fibonacci(n):", "Once upon a time"],
        min_length=1,
        max_length=MAX_PROMPTS,
    )
    input_ids: TokenIdLists | None = Field(None, min_length=1, max_length=MAX_PROMPTS)
    requests: int = Field(4, ge=1, le=256)
    concurrency: int = Field(4, ge=1, le=64)
    max_new_tokens: int = Field(8, ge=1, le=4096)
    timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S)
    parity_grace_s: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S)
    api_key_env: EnvName = "SGLANG_API_KEY"
    model: SafeName = "default"


# The comparison workload's default prompts: 16 of varied length (a few words to a paragraph), code and prose, so
# that decode runs over short and long contexts (docs/gate.md "The comparison workload").
DEFAULT_COMPARE_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
    "Translate to German: The weather is nice today.",
    "Write a haiku about the sea.",
    "import numpy as np; def softmax(x):",
    "Q: What is 17 times 23? A:",
    "List the planets of the solar system in order from the sun:",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING",
    "Explain in one sentence why the sky is blue.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1969, the Apollo 11 mission landed on the Moon. The astronauts who walked on its surface were",
    "Summarize the following paragraph. Attention mechanisms let a model weigh every earlier token when it "
    "predicts the next one; speculative decoding drafts several tokens ahead and verifies them in one pass, "
    "keeping those the target model agrees with. Summary:",
    "class LinkedList: def __init__(self): self.head = None; def append(self, value):",
    "A recipe for bread: mix 500 g of flour, 10 g of salt, 7 g of yeast and 350 ml of water. Knead for ten "
    "minutes, let it rise for an hour, shape the loaf, let it rise again, and bake at 230 degrees for",
)


DEFAULT_COMPARE_CONCURRENCY = (1, 8)  # issue 48: a release slower only at 8 concurrent requests is caught


def _levels(value: Any) -> Any:
    """``concurrency: 8`` is ``[8]`` (the form before levels); a list is checked as it is."""
    return [value] if isinstance(value, int) and not isinstance(value, bool) else value


def _distinct(levels: list[int]) -> list[int]:
    if len(set(levels)) != len(levels):
        raise ValueError("each concurrency level at most once")
    return levels


ConcurrencyLevels = Annotated[
    list[Annotated[int, Field(ge=1, le=64)]],
    BeforeValidator(_levels),
    Field(min_length=1, max_length=4),
    AfterValidator(_distinct),
]


class CompareSettings(StrictTypes):
    """The comparison of the new release with the one it replaces (docs/gate.md "The comparison workload", "The
    comparison"): the same greedy requests, on the same host, just before and just after the restart; the
    answers, decode speed and accepted drafts judged. Sent by the gate's host program on the loopback to
    ``/generate`` (the native API: it returns token ids), with the API key of ``gate.probe.api_key_env``."""

    enabled: bool = True
    prompts: Prompts = Field(
        default_factory=lambda: list(DEFAULT_COMPARE_PROMPTS), min_length=1, max_length=MAX_PROMPTS
    )
    input_ids: TokenIdLists | None = Field(None, min_length=1, max_length=MAX_PROMPTS)
    max_new_tokens: int = Field(32, ge=2, le=4096)  # two at least: decode speed is timed after the first token
    # The levels the workload runs at, each judged apart (paired within the level): 1 makes decode speed
    # per-request latency, 8 shows a kernel slower at larger batches. An int is one level ([int]).
    concurrency: ConcurrencyLevels = Field(default_factory=lambda: list(DEFAULT_COMPARE_CONCURRENCY))
    warmup: int = Field(2, ge=0, le=64)  # requests sent first and discarded
    # Output ids compared per prompt; when not given, all of them: max_new_tokens (the default, 32).
    compare_tokens: int = Field(32, ge=1, le=4096)
    min_identical: float = Field(0.5, ge=0, le=1)  # FAIL when fewer of the prompts agree
    # FAIL when decode (paired by prompt, per level) is slower than 1 - this, less 1.5 times the pairs' own spread,
    # and p < alpha; chosen from the simulated power and false FAILs (docs/gate.md "The statistics").
    max_slowdown: float = Field(0.04, ge=0, lt=1)
    alpha: float = Field(0.01, gt=0, le=0.5)  # the one-sided signed-rank test's level (and accepted drafts' U test)
    max_accept_drop: float = Field(0.10, ge=0, lt=1)  # FAIL when mean spec_accept_length drops more (and p < alpha)
    # The speed is compared only when the busier side's 1 + mean load (sglang:num_running_reqs, read around each
    # request) is at most 1 + max_load_diff times the quieter side's (1.0: 2x); else "cannot decide" (docs/gate.md).
    max_load_diff: float = Field(1.0, ge=0, le=1000)
    enforce: bool = True  # false: the comparison only reports, never fails the deploy
    timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S)  # per request

    @model_validator(mode="before")
    @classmethod
    def _all_tokens_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "compare_tokens" not in data:
            n = data.get("max_new_tokens", 32)
            if isinstance(n, int) and not isinstance(n, bool):
                return {**data, "compare_tokens": n}
        return data

    @model_validator(mode="after")
    def _tokens(self) -> CompareSettings:
        if self.compare_tokens > self.max_new_tokens:
            raise ValueError(
                f"compare_tokens ({self.compare_tokens}) must be <= max_new_tokens ({self.max_new_tokens})"
            )
        return self

    @property
    def workload_size(self) -> int:
        """Prompts measured per level (one request per prompt or token-id list; the warmup not counted)."""
        return len(self.input_ids) if self.input_ids else len(self.prompts)

    @property
    def requests_per_side(self) -> int:
        """Requests measured per side: every prompt at every concurrency level."""
        return self.workload_size * len(self.concurrency)


BatchSizes = Annotated[list[Annotated[int, Field(ge=1, le=512)]], Field(min_length=1, max_length=8)]
PrefixLengths = Annotated[list[Annotated[int, Field(ge=1, le=1 << 20)]], Field(min_length=1, max_length=8)]


class SpeedSettings(StrictTypes):
    """The pre-restart speed check (docs/gate.md "The pre-restart speed check"): before the switch, the new
    release's verify path is timed against the running release's on the host, on the same calls, alternating; a
    release slower than ``1 + max_slowdown`` with ``p < alpha`` is refused before any restart (exit 31). The
    defaults come from the measured noise (docs/gate.md, "The statistics")."""

    enabled: bool = True
    max_slowdown: float = Field(0.02, ge=0, lt=1)  # docs/gate.md: above the two processes' placement bias (<= 0.7%)
    alpha: float = Field(0.001, gt=0, le=0.5)  # the one-sided signed-rank test's level, over all the pairs
    rounds: int = Field(8, ge=3, le=100)  # at most; fewer when budget_s is spent (never under 3)
    budget_s: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S)  # for the rounds, after both sides are loaded
    heads: int | None = Field(None, ge=1, le=256)  # None: the release's replay.heads (per TP rank)
    batch_sizes: BatchSizes | None = None  # None: 1, 8, 32 on a GPU (1, 2, 8 on the testbed's CPU)
    prefixes: PrefixLengths | None = None  # None: 1k, 8k, 32k on a GPU (64, 128 on the testbed's CPU)
    graphs: bool = True  # time CUDA graph replays, as the server runs the verify (eager where a graph fails)


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
    compare: CompareSettings = Field(default_factory=CompareSettings)
    speed: SpeedSettings = Field(default_factory=SpeedSettings)

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
    # Off (the default): the file must exist and be readable on the host. A deploy's preflight refuses a host where
    # it is not, and the unit reads it without systemd's '-', so a missing file fails the start instead of serving
    # with no API key (issue 47: a typo in the path turned the key off). On: the unit ignores a missing file.
    environment_file_optional: bool = Field(False, strict=True)
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
    # `health --probe`: WARN when the running release's decode speed (or accepted drafts) drifted more than this
    # fraction from the sample recorded when it was deployed (docs/gate.md "Health checks").
    max_drift: float = Field(0.2, gt=0, lt=1, strict=True)

    @field_serializer("alert_command", when_used="json")
    def _redacted(self, value: str | None) -> str | None:
        return None if value is None else redacted_command(value)


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
    # The inventory file and the line of each of its keys (set by the loader; None for a host built in code): a
    # message about a setting checked on the host names where it is written (`where`).
    _source: tuple[str, LineMap] | None = PrivateAttr(default=None)

    def located(self, path: str, lines: LineMap) -> HostConfig:
        """This host, knowing that it was read from ``path`` whose keys are on ``lines`` (the loader's)."""
        self._source = (path, lines)
        return self

    def where(self, *field: str) -> str:
        """``inventory.yaml:14: hosts.ct200.service.environment_file``: the file, line and dotted key where
        ``field`` is written (on the host, else in ``defaults``); the dotted key alone when not known."""
        own = ("hosts", self.name, *field)
        if self._source is None:
            return ".".join(own)
        path, lines = self._source
        for key in (own, ("defaults", *field)):
            if key in lines:
                return f"{path}:{lines[key]}: {'.'.join(key)}"
        return f"{path}: {'.'.join(own)}"

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
