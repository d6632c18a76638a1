"""Render the systemd unit from systemd/sglang-k26-ddtree.service and inventory (pure), and install it (I/O).

ExecStart runs from ``<root>/current``: SGLang with the kdtree backend and the DDTree settings on GPU hosts,
on testbed hosts the CPU stand-in for SGLang (``standin``) or the timer replay service (``replay``):
``service.mode`` decides.

A release's unit is always rendered from *today's* inventory with the release's own template
(``<release>/systemd/sglang-k26-ddtree.service``): a rollback or a deploy's undo never brings back the settings
of the inventory as it was at that release's deploy (issue 36: an old stored unit without ``EnvironmentFile``
served with no API key). Release zero (adopted, no template) keeps its hand-made unit; a unit that would lose a
setting the running unit has from today's inventory is refused, naming it (docs/release-layout.md).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DeployFailed
from ..inventory import HostConfig
from ..ssh.remote import Remote
from . import systemctl

if TYPE_CHECKING:
    from ..hostdata.layout import Layout

__all__ = [
    "UnitSettingsLost",
    "environment_file_line",
    "exec_argv",
    "install",
    "install_for_release",
    "lost_settings",
    "release_unit_text",
    "render",
    "render_from_tree",
    "systemd_value",
    "systemd_word",
    "unit_for_release",
    "unit_path",
]

TEMPLATE_REL = "systemd/sglang-k26-ddtree.service"
_PLACEHOLDER_RE = re.compile(r"@@([A-Z_]+)@@")
# nvidia character-device classes from /proc/devices: GPUs + control, UVM, MIG caps, NVLink/NVSwitch.
_GPU_DEVICE_CLASSES = (
    "char-nvidia-frontend",
    "char-nvidia-uvm",
    "char-nvidia-caps",
    "char-nvidia-nvlink",
    "char-nvidia-nvswitch",
)
REPLAY_INTERVAL_S = 2.0
_MODE_TEXT = {"sglang": "SGLang", "standin": "CPU stand-in for SGLang (testbed)", "replay": "CPU replay (testbed)"}


def systemd_value(value: str) -> str:
    """A value for a unit setting that expands specifiers but is not a command line: '%' doubled. The inventory
    refuses whitespace, quotes, backslashes and control characters in these values (paths and names), so this is
    the one character left that systemd would read differently from opsctl."""
    return value.replace("%", "%%")


def systemd_word(arg: str) -> str:
    """Quote one ExecStart argument for systemd's own parser: '%' and '$' are specifiers/expansions there."""
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    if escaped and not re.search(r"[\s'\"\\]", escaped):
        return escaped
    return f'"{escaped}"'


def exec_argv(host: HostConfig) -> list[str]:
    svc = host.service
    if svc.mode == "standin":
        # The SGLang-shaped stand-in (kdtree_backend.serve) on the service port: the deploy's readiness poll and
        # probe requests reach it as they reach SGLang.
        argv = [svc.python, "-m", "kdtree_backend.serve", "--port", str(svc.port), "--tp-size", str(svc.tp)]
        return [*argv, *svc.standin_args]
    if svc.mode == "replay":
        args = list(svc.replay_args)
        if not any(a == "--steps" or a.startswith("--steps=") for a in args):
            args = ["--steps", "0", *args]
        if not any(a == "--interval" or a.startswith("--interval=") for a in args):
            args = [*args, "--interval", f"{REPLAY_INTERVAL_S:g}"]
        if not any(a == "--tp-size" or a.startswith("--tp-size=") for a in args):
            args = [*args, "--tp-size", str(svc.tp)]  # one set of parity lines per rank, as the server prints
        return [svc.python, "-m", "kdtree_backend.replay", *args]
    if svc.attention == "kdtree":
        attention = ["--attention-backend", "kdtree"]
    else:
        attention = ["--prefill-attention-backend", "kdtree", "--decode-attention-backend", "triton"]
    return [
        svc.python,
        "-m",
        "kdtree_backend.launch",
        "--model-path",
        svc.model_path,
        "--tp-size",
        str(svc.tp),
        "--port",
        str(svc.port),
        "--trust-remote-code",
        *attention,
        "--speculative-algorithm",
        svc.speculative_algorithm,
        "--speculative-num-draft-tokens",
        str(svc.speculative_num_draft_tokens),
        "--speculative-draft-attention-backend",
        "triton",
        "--page-size",
        "1",
        *svc.extra_args,
    ]


def environment_file_line(host: HostConfig) -> str | None:
    """The unit's ``EnvironmentFile=`` for ``service.environment_file`` (None without one). systemd's '-' (ignore
    a missing file) only when the inventory says the file is optional: otherwise a missing key file fails the start
    (a failed unit) instead of serving without the API key (issue 47)."""
    svc = host.service
    if not svc.environment_file:
        return None
    return f"EnvironmentFile={'-' if svc.environment_file_optional else ''}{systemd_value(svc.environment_file)}"


def render(template: str, host: HostConfig) -> str:
    """The unit file for ``host``. Every placeholder must be known (a typo in the template fails loudly)."""
    svc = host.service
    gpu = ""
    if host.gpu_arch is not None and svc.mode == "sglang":
        gpu = "# GPU access (compute capability " + host.gpu_arch + "): only the nvidia devices besides the defaults.\n"
        gpu += "DevicePolicy=auto\n" + "".join(f"DeviceAllow={c} rw\n" for c in _GPU_DEVICE_CLASSES)
        gpu = gpu.rstrip("\n")
    values = {
        "HEADER": f"{host.unit}.service for host {host.name}",
        "MODE": _MODE_TEXT[svc.mode],
        # Every inventory value below lands in a setting where systemd expands specifiers (WorkingDirectory=,
        # Environment=, EnvironmentFile=, User=, SyslogIdentifier=): '%' is escaped, so systemd's paths are the
        # ones opsctl writes to (a root of /srv/kd%n would otherwise become /srv/kd<unit name>).
        "ROOT": systemd_value(host.root),
        "USER": systemd_value(host.user),
        "UNIT": systemd_value(host.unit),
        "ENVIRONMENT_FILE": environment_file_line(host) or "# no EnvironmentFile in inventory",
        "EXEC_START": " ".join(systemd_word(a) for a in exec_argv(host)),
        "RESTART_SEC": "10" if svc.mode == "sglang" else "1",
        "START_TIMEOUT": str(svc.start_timeout_s),
        "GPU_ACCESS": gpu or f"# no GPU on this host ({svc.mode} mode)",
    }

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise KeyError(f"{TEMPLATE_REL}: unknown placeholder @@{key}@@")
        return values[key]

    return _PLACEHOLDER_RE.sub(sub, template)


def render_from_tree(tree: Path, host: HostConfig) -> str:
    return render((tree / TEMPLATE_REL).read_text(), host)


def unit_path(host: HostConfig) -> str:
    return systemctl.unit_file_path(host.unit)


def digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def install(r: Remote, host: HostConfig, text: str, current_text: str | None) -> bool:
    """Write the unit and daemon-reload, only when it changed. Returns whether it changed."""
    if current_text is not None and digest(current_text) == digest(text):
        return False
    r.write_file(unit_path(host), text.encode(), mode=0o644)
    r.run(systemctl.daemon_reload_argv(), timeout=120)
    return True


def read_installed(r: Remote, host: HostConfig) -> str | None:
    res = r.run(systemctl.read_unit_file_command(host.unit), timeout=60, check=False)
    return res.stdout if res.rc == 0 else None


# The template's placeholders that carry a setting from the inventory (HEADER and MODE are comments). An older
# release's template without one of them would render a unit without that setting.
SETTING_PLACEHOLDERS = {
    "ROOT": "WorkingDirectory=, the PYTHONPATH/KDTREE_CONFIG paths and the parity token's EnvironmentFile=",
    "USER": "User=",
    "UNIT": "SyslogIdentifier=",
    "ENVIRONMENT_FILE": "EnvironmentFile= (service.environment_file)",
    "EXEC_START": "ExecStart=",
    "RESTART_SEC": "RestartSec=",
    "START_TIMEOUT": "TimeoutStartSec=",
    "GPU_ACCESS": "DeviceAllow=",
}


class UnitSettingsLost(DeployFailed):
    """Installing a release's unit would drop a setting the running unit has from today's inventory."""


def _settings(text: str) -> set[str]:
    """The unit's ``Key=value`` lines, stripped (sections, comments and blank lines left out)."""
    lines = (line.strip() for line in text.split("\n"))
    return {line for line in lines if "=" in line and not line.startswith(("#", ";", "["))}


def lost_settings(host: HostConfig, running: str | None, target: str, template: str | None) -> list[str]:
    """The settings from today's inventory that installing ``target`` would lose. ``template``: the release's
    template ``target`` was rendered from (None for release zero's hand-made unit). A template without one of
    today's setting placeholders loses that setting; any unit without the inventory's ``EnvironmentFile=`` that
    the running unit has loses it. Pure."""
    lost = []
    if template is not None:
        lost += [what for key, what in SETTING_PLACEHOLDERS.items() if f"@@{key}@@" not in template]
    env_file = host.service.environment_file
    if env_file and running is not None:
        # Either form reads the file (with '-', or without it since issue 47); a unit with neither drops it.
        forms = {f"EnvironmentFile={dash}{systemd_value(env_file)}" for dash in ("-", "")}
        had = sorted(forms & _settings(running))
        if had and not forms & _settings(target):
            lost.append(had[0])
    return lost


def release_unit_text(
    host: HostConfig, release: str, template: str | None, stored: str | None, running: str | None
) -> str:
    """The unit to install for ``release``: its own template rendered with today's inventory; release zero (no
    template) its stored hand-made unit. Raises UnitSettingsLost naming what the running unit would lose. Pure."""
    if template is not None:
        try:
            text = render(template, host)
        except KeyError as e:
            raise DeployFailed(f"{host.name}: release {release}'s {TEMPLATE_REL}: {e.args[0]}") from None
    elif stored is not None:
        text = stored
    else:
        raise DeployFailed(f"{host.name}: release {release} has neither {TEMPLATE_REL} nor a stored unit.service")
    lost = lost_settings(host, running, text, template)
    if lost:
        where = f"its {TEMPLATE_REL}" if template is not None else "its hand-made unit.service"
        raise UnitSettingsLost(
            f"{host.name}: refusing to install the unit of release {release}: it would drop {'; '.join(lost)}, "
            f"which the running unit has from the inventory ({where} lacks it). Roll back to another release "
            f"(--to), or add the setting to {where}"
        )
    return text


def _read_optional(r: Remote, path: str) -> str | None:
    res = r.run(f"test -f {shlex.quote(path)} && cat -- {shlex.quote(path)}", timeout=60, check=False)
    return res.stdout if res.rc == 0 else None


def _unit_and_installed(r: Remote, host: HostConfig, layout: Layout, release: str) -> tuple[str, str | None]:
    release_dir = layout.release(release)
    template = _read_optional(r, f"{release_dir}/{TEMPLATE_REL}")
    stored = None if template is not None else _read_optional(r, f"{release_dir}/unit.service")
    installed = read_installed(r, host)
    return release_unit_text(host, release, template, stored, installed), installed


def unit_for_release(r: Remote, host: HostConfig, layout: Layout, release: str) -> str:
    """Read the release's template (or release zero's stored unit) and the running unit; the unit to install
    (release_unit_text), or UnitSettingsLost. Nothing is changed on the host."""
    return _unit_and_installed(r, host, layout, release)[0]


def install_for_release(r: Remote, host: HostConfig, layout: Layout, release: str) -> bool:
    """Install the unit of a release: its template rendered with today's inventory (release zero: its hand-made
    unit), refused when it would drop a setting the running unit has from the inventory. Returns whether the
    installed unit changed."""
    text, installed = _unit_and_installed(r, host, layout, release)
    changed = install(r, host, text, installed)
    r.run(systemctl.enable_once_command(host.unit), timeout=60, check=False)
    return changed
