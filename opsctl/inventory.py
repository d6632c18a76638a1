"""inventory.yaml: hosts, groups and defaults, validated strictly.

Every error names the file, the line and the dotted field (``inventory.yaml:14: hosts.ct200.unit: ...``).
Values that end up in a shell command or a filesystem path are checked here once, so the rest of the code can
trust them (and still quotes every remote command).
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import subprocess
import unicodedata
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import InventoryError, UsageError

ENV_VAR = "OPSCTL_INVENTORY"
DEFAULT_FILE = "inventory.yaml"

# Always used with fullmatch: "$" alone would accept a trailing newline ("DDTREE\n").
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_UNIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}")
_ARCH_RE = re.compile(r"\d{1,2}\.\d")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HTTP_PATH_RE = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")
# Characters with a meaning to a shell, plus whitespace; a path or argument containing one is refused outright.
_SHELL_META = set(";&|$`\\\"'<>(){}[]*?!#~\n\r\t ")


def control_character(value: str) -> str | None:
    """The first control character in ``value`` (NUL, CR, LF, TAB, DEL, C1 ...), named for an error message."""
    for ch in value:
        if unicodedata.category(ch) == "Cc":
            return f"U+{ord(ch):04X}"
    return None


def _no_control_characters(value: Any) -> Any:
    """Every string field of the inventory (and each string of a list field): a NUL, CR or LF in a value could end a line of the
    rendered unit file and start a directive of its own (ExecStartPre=...)."""
    if isinstance(value, str):
        bad = control_character(value)
        if bad:
            raise ValueError(f"contains the control character {bad}; inventory values must be plain text")
    elif isinstance(value, list | tuple):
        for item in value:
            _no_control_characters(item)
    return value


def _http_path(value: str) -> str:
    if not _HTTP_PATH_RE.fullmatch(value) or value.startswith("//"):
        raise ValueError(
            f"{value!r} must be a URL path: one leading '/', no query or fragment (it is the path of "
            "http://127.0.0.1:<port>)"
        )
    return value


class WebhookUrl(SecretStr):
    """A webhook URL: often holds a secret (a token in the path or query), so every output shows only the scheme
    and host; ``get_secret_value()`` is for the one place that posts to it."""

    def _display(self) -> str:
        parts = urllib.parse.urlsplit(self.get_secret_value())
        return f"{parts.scheme}://{parts.hostname or '?'}/... (redacted)"


def _webhook(value: WebhookUrl) -> WebhookUrl:
    # The value is never echoed: the error message would print the secret.
    text = value.get_secret_value()
    try:
        parts = urllib.parse.urlsplit(text)
        host = parts.hostname
    except ValueError:
        raise ValueError("is not a parsable URL (value not shown: webhook URLs often hold secrets)") from None
    if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in text):
        raise ValueError("must be an http:// or https:// URL with a host (value not shown: it may hold a secret)")
    if "@" in parts.netloc:
        # urllib does not send user:password@ as credentials (it reads the password as a port and fails), and
        # every error would quote it: put a token in the path or query instead, which opsctl never prints.
        raise ValueError(
            "must not carry a user name or password (user:password@host); put the token in the URL's path or "
            "query (value not shown)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number, as delivery would
    except ValueError:
        raise ValueError("has a port that is not a number (value not shown: it may hold a secret)") from None
    return value


def _alert_command(value: str) -> str:
    try:
        argv = shlex.split(value)
    except ValueError as e:
        raise ValueError(f"{value!r} does not split into words: {e}") from None
    if not argv:
        raise ValueError("names no program to run")
    return value


def _safe_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a safe name (letters, digits, '_', '.', '-'; max 63)")
    return value


def _unit_name(value: str) -> str:
    if not _UNIT_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{value!r} is not a valid systemd unit name (no spaces, '/', or shell characters)")
    return value


def _address(value: str) -> str:
    if not _ADDRESS_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a hostname or IP address")
    return value


def _abs_path(value: str) -> str:
    bad = sorted(set(value) & (_SHELL_META - {"~"}))
    if bad:
        raise ValueError(f"{value!r} contains characters unsafe in a shell or path: {''.join(bad)!r}")
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path")
    parts = value.split("/")
    if ".." in parts or "." in parts[1:]:
        raise ValueError(f"{value!r} must not contain '.' or '..' components")
    if value.rstrip("/") in ("", "/root", "/home", "/etc", "/usr", "/var", "/opt", "/tmp", "/bin", "/lib"):
        raise ValueError(f"{value!r} is a system directory; a release root must be a directory of its own")
    return value.rstrip("/")


def _local_path(value: str) -> str:
    bad = sorted(set(value) & (_SHELL_META - {"~"}))
    if bad:
        raise ValueError(f"{value!r} contains characters unsafe in a shell or path: {''.join(bad)!r}")
    return value


def _shell_arg(value: str) -> str:
    if "$(" in value or "`" in value or ";" in value or "\n" in value or "&&" in value or "|" in value:
        raise ValueError(f"{value!r} contains shell syntax")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, '_'; not a digit first)")
    return value


def _arch(value: str) -> str:
    if not _ARCH_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a compute capability like '12.0' or '9.0'")
    return value


SafeName = Annotated[str, AfterValidator(_safe_name)]
UnitName = Annotated[str, AfterValidator(_unit_name)]
Address = Annotated[str, AfterValidator(_address)]
RemotePath = Annotated[str, AfterValidator(_abs_path)]
LocalPath = Annotated[str, AfterValidator(_local_path)]
ShellArg = Annotated[str, AfterValidator(_shell_arg)]
HttpPath = Annotated[str, AfterValidator(_http_path)]
Webhook = Annotated[WebhookUrl, AfterValidator(_webhook)]
AlertCommand = Annotated[str, AfterValidator(_shell_arg), AfterValidator(_alert_command)]
GpuArch = Annotated[str, AfterValidator(_arch)]


class _Strict(BaseModel):
    # No inf or NaN in any number: `pass_rel: .inf` would let rel=1e300 pass, and JSON has no Infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return _no_control_characters(value)


class ProbeSettings(_Strict):
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
    api_key_env: Annotated[str, AfterValidator(_env_name)] = "SGLANG_API_KEY"
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


class GateSettings(_Strict):
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


class ServiceSettings(_Strict):
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


class HealthSettings(_Strict):
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


class HostConfig(_Strict):
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


class _InventoryFile(_Strict):
    default: str | None = None  # the target of a command given no host: a host, a group or 'all'
    defaults: dict[str, Any] = Field(default_factory=dict)
    hosts: dict[str, dict[str, Any]]
    groups: dict[str, list[str]] = Field(default_factory=dict)


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict[str, HostConfig]
    groups: dict[str, tuple[str, ...]]
    default: str | None = None  # `default:` of the file: what a command given no host acts on

    def resolve(self, target: str) -> list[HostConfig]:
        """A host name, a group name or ``all`` -> hosts, in inventory order."""
        if target in self.hosts:
            return [self.hosts[target]]
        if target in self.groups:
            return [self.hosts[h] for h in self.groups[target]]
        if target == "all":
            return list(self.hosts.values())
        known = ", ".join([*self.hosts, *self.groups]) or "none"
        raise InventoryError(f"{self.path}: no host or group named {target!r} (known: {known})")

    def host(self, name: str) -> HostConfig:
        hosts = self.resolve(name)
        if len(hosts) != 1 or name not in self.hosts:
            raise InventoryError(f"{self.path}: {name!r} is a group; this command takes one host")
        return hosts[0]


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


def default_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--inventory, else $OPSCTL_INVENTORY, else ./inventory.yaml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path(DEFAULT_FILE)


def load(path: str | os.PathLike[str] | None = None) -> Inventory:
    p = default_path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InventoryError(f"{p}: cannot read inventory: {e.strerror or e}") from e
    inv = parse(text, p)
    for host in inv.hosts.values():
        problem = calendar_problem(host.health.on_calendar)
        if problem:
            raise InventoryError(f"{p}: hosts.{host.name}.health.on_calendar: {problem}")
    return inv


def calendar_problem(expression: str) -> str | None:
    """What systemd says is wrong with an OnCalendar expression (None when it parses, or when this machine has no
    systemd-analyze to ask: the timer's own installation asks again)."""
    if shutil.which("systemd-analyze") is None:
        return None
    r = subprocess.run(
        ["systemd-analyze", "calendar", "--", expression], capture_output=True, text=True, timeout=30, check=False
    )
    if r.returncode == 0:
        return None
    return f"{expression!r} is not a systemd calendar expression: {r.stderr.strip() or r.stdout.strip()}"


def shown(value: object) -> str:
    """A name from the file as an error message shows it: as is when printable, else escaped like a Python
    literal (``'a\\nb'``), so a newline or an escape sequence in a key can never split or forge a line."""
    text = str(value)
    return text if text.isprintable() else repr(text)


# Aliases may add this many values beyond the ones written in the file (:func:`_bound_aliases`).
MAX_ALIAS_EXPANSION = 10_000
MAX_NESTING = 64  # an inventory is five levels deep; PyYAML's composer recurses once per level


def _bound_nesting(text: str, path: Path) -> None:
    """Refuse collections nested deeper than :data:`MAX_NESTING` from the event stream (linear, no recursion):
    ``[[[[...]]]]`` a few thousand deep would otherwise end in a RecursionError inside the YAML composer."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise InventoryError(
                        f"{path}:{event.start_mark.line + 1}: nested more than {MAX_NESTING} levels deep"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return  # the composer below reports it, with its line


def _bound_aliases(node: yaml.Node | None, path: Path) -> None:
    """Refuse YAML aliases that expand to too much, before anything is built from the node graph: nine aliases of
    nine aliases of ... make a few hundred bytes expand to billions of values (an "alias bomb"; minutes and
    gigabytes before a field check sees them). A plain anchor shared by a few hosts is fine. Linear in the
    file: each node's expanded size is computed once (the composer shares an aliased node, it does not copy)."""
    sizes: dict[int, int] = {}
    distinct = 0

    def expanded(n: yaml.Node) -> int:
        nonlocal distinct
        key = id(n)
        if key in sizes:
            if sizes[key] < 0:
                raise InventoryError(f"{path}:{n.start_mark.line + 1}: a YAML alias refers to itself")
            return sizes[key]
        sizes[key] = -1  # being sized: meeting it again below is a cycle
        distinct += 1
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(expanded(k) + expanded(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(expanded(v) for v in n.value)
        sizes[key] = total
        return total

    if node is None:
        return
    total = expanded(node)
    if total - distinct > MAX_ALIAS_EXPANSION:
        raise InventoryError(
            f"{path}: YAML aliases expand the inventory to {total:,} values ({distinct:,} written); at most "
            f"{MAX_ALIAS_EXPANSION:,} may come from aliases: put shared settings in `defaults:`"
        )


def _check_names(path: Path, lines: dict[tuple[str | int, ...], int], raw: dict[str, Any]) -> None:
    """Host keys, group names and group members are names: anything else (a newline, an escape sequence, a
    non-string) is refused here, shown escaped, before a message could print it raw."""
    for name in raw.get("hosts") or {}:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise InventoryError(
                f"{path}:{lines.get(('hosts', name), 1)}: hosts.{shown(name)}: {str(name)!r} is not a safe host "
                "name (letters, digits, '_', '.', '-'; max 63)"
            )
    groups = raw.get("groups")
    for group, members in groups.items() if isinstance(groups, dict) else ():
        where = f"{path}:{lines.get(('groups', group), 1)}: groups.{shown(group)}"
        if not isinstance(group, str) or not _NAME_RE.fullmatch(group):
            raise InventoryError(
                f"{where}: {str(group)!r} is not a safe group name (letters, digits, '_', '.', '-'; max 63)"
            )
        for member in members if isinstance(members, list) else ():
            if not isinstance(member, str) or not _NAME_RE.fullmatch(member):
                raise InventoryError(f"{where}: member {str(member)!r} is not a host name")


def parse(text: str, path: Path | str = DEFAULT_FILE) -> Inventory:
    path = Path(path)
    _bound_nesting(text, path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _bound_aliases(node, path)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise InventoryError(f"{where}: invalid YAML: {problem}") from e
    lines = _line_map(node)
    if not isinstance(raw, dict):
        raise InventoryError(f"{path}:1: the inventory must be a mapping with 'hosts' (and 'defaults', 'groups')")
    _check_names(path, lines, raw)
    try:
        doc = _InventoryFile.model_validate(raw)
    except ValidationError as e:
        raise _inventory_error(path, lines, e, ()) from None

    hosts: dict[str, HostConfig] = {}
    for name, fields in doc.hosts.items():
        if not isinstance(fields, dict):
            raise InventoryError(f"{path}:{lines.get(('hosts', name), 1)}: hosts.{name}: must be a mapping")
        merged = _deep_merge(doc.defaults, fields)
        merged["name"] = name
        try:
            hosts[name] = HostConfig.model_validate(merged)
        except ValidationError as e:
            raise _inventory_error(path, lines, e, ("hosts", name), defaults_fields=set(doc.defaults)) from None

    groups: dict[str, tuple[str, ...]] = {}
    for group, members in doc.groups.items():
        where = f"{path}:{lines.get(('groups', group), 1)}: groups.{group}"
        try:
            _safe_name(group)
        except ValueError as e:
            raise InventoryError(f"{where}: {e}") from None
        if group in hosts:
            raise InventoryError(f"{where}: a group cannot share its name with a host")
        missing = [m for m in members if m not in hosts]
        if missing:
            raise InventoryError(f"{where}: unknown host(s) {', '.join(map(str, missing))}")
        groups[group] = tuple(dict.fromkeys(members))
    if doc.default is not None and doc.default != "all" and doc.default not in hosts and doc.default not in groups:
        known = ", ".join([*hosts, *groups]) or "none"
        raise InventoryError(
            f"{path}:{lines.get(('default',), 1)}: default: {doc.default!r} is no host or group (known: {known}, all)"
        )
    return Inventory(path=path, hosts=hosts, groups=groups, default=doc.default)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _line_map(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
    """Dotted key path -> 1-based line of that key in the file."""
    lines: dict[tuple[str | int, ...], int] = {}

    def walk(n: yaml.Node, prefix: tuple[str | int, ...]) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = (*prefix, k.value)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                key = (*prefix, i)
                lines[key] = v.start_mark.line + 1
                walk(v, key)

    if node is not None:
        walk(node, ())
    return lines


def _inventory_error(
    path: Path,
    lines: dict[tuple[str | int, ...], int],
    err: ValidationError,
    prefix: tuple[str, ...],
    defaults_fields: Iterable[str] = (),
) -> InventoryError:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    full = (*prefix, *loc)
    line = _closest_line(lines, full)
    # A bad value inherited from `defaults` (not written on the host itself) is reported where it is written.
    if full not in lines and prefix and loc and ("defaults", *loc) in lines and loc[0] in set(defaults_fields):
        full = ("defaults", *loc)
        line = lines[full]
    dotted = ".".join(shown(p) for p in full) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    return InventoryError(f"{path}:{line or 1}: {dotted}: {msg}")


def _closest_line(lines: dict[tuple[str | int, ...], int], key: tuple[str | int, ...]) -> int | None:
    for n in range(len(key), 0, -1):
        if key[:n] in lines:
            return lines[key[:n]]
    return None
