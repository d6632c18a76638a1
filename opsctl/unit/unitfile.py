"""Render the systemd unit from systemd/sglang-k26-ddtree.service and inventory (pure), and install it (I/O).

ExecStart runs from ``<root>/current``: SGLang with the kdtree backend and the DDTree settings on GPU hosts,
on testbed hosts the CPU stand-in for SGLang (``standin``) or the timer replay service (``replay``):
``service.mode`` decides.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..inventory import HostConfig
from ..ssh.remote import Remote
from . import systemctl

if TYPE_CHECKING:
    from ..host.releaseroot import Layout

__all__ = [
    "exec_argv",
    "install",
    "render",
    "render_from_tree",
    "systemd_value",
    "systemd_word",
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
        "ENVIRONMENT_FILE": f"EnvironmentFile=-{systemd_value(svc.environment_file)}"
        if svc.environment_file
        else "# no EnvironmentFile in inventory",
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


def install_for_release(r: Remote, host: HostConfig, layout: Layout, release: str) -> bool:
    """Install the unit stored with a release (rendered at its deploy, or the hand-made one for release zero)."""
    text = r.read_file(f"{layout.release(release)}/unit.service").decode()
    changed = install(r, host, text, read_installed(r, host))
    r.run(systemctl.enable_once_command(host.unit), timeout=60, check=False)
    return changed
