"""Issue 16, the first hour of a new user: each item has a test here that can fail (no testbed needed; the ones
that need hosts are in tests/cli/test_first_hour_cli.py).

Hosts that must not answer are real sockets on 127.0.0.1: a closed port (refused) or a listener that closes the
connection before any SSH banner; nothing here reaches a real host.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from opsctl.cli import common as cli_common
from opsctl.cli.progress import RichReporter
from opsctl.errors import InventoryError, OpsError
from opsctl.gate.decision import LineVerdict
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.inventory import parse
from opsctl.testbed import DEFAULT_CACHE_DIR, Testbed, last_log_line
from opsctl.testbed.localrun import run as run_local

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import pip_summary  # noqa: E402
import readme_command  # noqa: E402


def _opsctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture
def no_banner_port() -> Iterator[int]:
    """A TCP listener that answers with something that is not SSH and hangs up (like a wrong service)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    srv.close()


def _inventory(tmp_path: Path, hosts: dict[str, int], extra: str = "") -> Path:
    lines = ["defaults:", f"  known_hosts: {tmp_path}/known_hosts", "  connect_timeout_s: 3", "hosts:"]
    lines += [f"  {name}: {{address: 127.0.0.1, port: {port}}}" for name, port in hosts.items()]
    p = tmp_path / "inventory.yaml"
    p.write_text("\n".join(lines) + "\n" + extra)
    return p


# ---------------------------------------------------------------------------------------------- 0 default target


def test_inventory_default_must_name_a_host_or_group() -> None:
    inv = parse("default: g\nhosts:\n  a: {address: h}\n  b: {address: h}\ngroups:\n  g: [a]\n", "x.yaml")
    assert inv.default == "g"
    assert parse("hosts:\n  a: {address: h}\n", "x.yaml").default is None
    with pytest.raises(InventoryError, match=r"x.yaml:1: default: 'nope' is no host or group \(known: a, all\)"):
        parse("default: nope\nhosts:\n  a: {address: h}\n", "x.yaml")


def test_pick_target_default_then_only_host_then_asks(capsys: pytest.CaptureFixture[str]) -> None:
    two = parse("hosts:\n  a: {address: h}\n  b: {address: h}\ngroups:\n  g: [b]\n", "inv.yaml")
    assert cli_common.pick_target(two, "b", "logs") == "b"
    with pytest.raises(OpsError, match=r"which host\? inv.yaml has 2 hosts \(a, b; groups: g\) and no `default:`"):
        cli_common.pick_target(two, None, "logs")
    one = parse("hosts:\n  ct200: {address: h}\n", "inv.yaml")
    assert cli_common.pick_host(one, None, "rollback").name == "ct200"
    with_default = parse("default: g\nhosts:\n  a: {address: h}\n  b: {address: h}\ngroups:\n  g: [b]\n", "i.yaml")
    assert cli_common.pick_host(with_default, None, "logs").name == "b"  # a default group of one host
    several = parse("default: g\nhosts:\n  a: {address: h}\n  b: {address: h}\ngroups:\n  g: [a, b]\n", "i.yaml")
    assert cli_common.pick_target(several, None, "status") == "g"
    with pytest.raises(OpsError, match="'g' is a group of 2 hosts"):
        cli_common.pick_host(several, None, "logs")


# Every command that takes a host, as a user types it without one; the host is a closed port, so each ends with
# "unreachable" (or its usage check) after announcing the host it chose: never "Missing argument".
HOST_COMMANDS = [
    ("deploy", "--yes"),
    ("restart", "--yes"),
    ("rollback", "--yes"),
    ("adopt",),
    ("releases",),
    ("status",),
    ("logs", "--grep", "shapes"),
    ("lock",),
    ("service", "status"),
    ("ping",),
    ("health", "--no-alerts"),
]


@pytest.mark.parametrize("argv", HOST_COMMANDS, ids=lambda a: a[0])
def test_every_host_command_takes_the_default(tmp_path: Path, argv: tuple[str, ...]) -> None:
    inv = _inventory(tmp_path, {"a": _closed_port(), "ct200": _closed_port()}, "default: ct200\n")
    proc = _opsctl("-i", str(inv), *argv)
    assert "Missing argument" not in proc.stderr
    assert f"{argv[0]}: ct200 (the default of {inv})" in proc.stderr, proc.stderr
    assert proc.returncode in (2, 11, 30), (proc.returncode, proc.stderr)  # health: CRIT = 2
    assert "Traceback" not in proc.stderr


def test_without_default_commands_name_the_hosts(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {"a": _closed_port(), "b": _closed_port()})
    proc = _opsctl("-i", str(inv), "rollback")
    assert proc.returncode == 2
    assert "which host?" in proc.stderr and "(a, b)" in proc.stderr and "add `default: HOST`" in proc.stderr


def test_lock_and_service_take_the_action_alone(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {"only": _closed_port()})
    proc = _opsctl("-i", str(inv), "lock", "release")  # the one word is the action; --force is still required
    assert proc.returncode == 2 and "breaking a lock needs --force" in proc.stderr
    assert f"lock: only (the only host in {inv})" in proc.stderr


# ---------------------------------------------------------------------------------------------- 1 README commands


def test_readme_commands_need_no_sudo_and_ci_runs_the_main_job_from_the_readme() -> None:
    found = readme_command.commands((REPO / "README.md").read_text())
    assert found["main-job"] == "bash scripts/setup.sh && deploy/rehearse.sh"
    assert found["tests"] == "bash .ci/run"
    ci = (REPO / ".ci/run").read_text()
    assert "scripts/readme_command.py main-job" in ci and 'bash -c "$MAIN_JOB"' in ci
    for path in ("deploy/rehearse.sh", ".ci/run", "scripts/setup.sh"):
        assert os.access(REPO / path, os.X_OK), path
    # The README never writes a bare `opsctl <command>` the PATH does not have.
    bare = re.findall(
        r"(?<![\w/.-])opsctl (?:deploy|logs|status|rollback|health|ping|hosts|testbed)", _code(REPO / "README.md")
    )
    assert not bare, bare


def _code(md: Path) -> str:
    """The code spans and blocks of a markdown file."""
    text = md.read_text()
    return "\n".join(re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text))


def _as_nobody(argv: list[str], path_dirs: list[Path]) -> subprocess.CompletedProcess[str]:
    """Run a command as an unprivileged user (setpriv), with PATH = the given dirs + the system's."""
    env = {
        "PATH": ":".join([*map(str, path_dirs), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
        "OPSCTL_TESTBED_DIR": "/tmp/x-tb",
        "HOME": "/tmp",
    }
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to become a user")
@pytest.mark.parametrize("script", ["deploy/rehearse.sh", ".ci/run"])
def test_root_scripts_elevate_themselves_through_sudo(script: str) -> None:
    if not _readable_by_nobody(REPO / script):
        pytest.skip(f"{REPO} is not readable by an unprivileged user here")
    tmp_path = Path(tempfile.mkdtemp(prefix="as-root-"))
    tmp_path.chmod(0o755)
    # A user with sudo: the script runs itself again through sudo, keeping the OPSCTL_* variables. (The stand-in
    # sudo records its arguments: elevating for real needs a real sudo, which CI, root without sudo, lacks.)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "sudo-args"
    record.touch()
    record.chmod(0o666)
    (bindir / "sudo").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    (bindir / "sudo").chmod(0o755)
    proc = _as_nobody([str(REPO / script), "--gate-timeout", "5"], [bindir])
    assert proc.returncode == 0, proc.stderr
    args = record.read_text().splitlines()
    assert args[:2] == ["--", "env"] and "OPSCTL_TESTBED_DIR=/tmp/x-tb" in args
    assert args[-3:] == [str(REPO / script), "--gate-timeout", "5"] and args[-4] == "bash"
    assert "running it through sudo" in proc.stderr
    # No sudo on the machine (and not root): one line saying to run it as root, exit 2.
    if shutil.which("sudo", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        shutil.rmtree(tmp_path)
        return
    proc = _as_nobody([str(REPO / script)], [])
    shutil.rmtree(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {REPO / script} needs root (systemd-nspawn, mounts) and there is no sudo here: run it as root"
    ]


def _readable_by_nobody(path: Path) -> bool:
    return (
        subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "test", "-r", str(path)]
        ).returncode
        == 0
    )


# ---------------------------------------------------------------------------------------------- 2 quiet set-up


def test_pip_conflicts_of_no_deps_sglang_become_one_explained_line() -> None:
    text = (REPO / "tests/scripts/pip-sglang-conflicts.txt").read_text()  # captured from a real set-up
    assert text.count("\n") > 40 and "ERROR: pip's dependency resolver" in text
    out = pip_summary.render(pip_summary.summarise("$ pip install -e .[dev] torch==2.13.0\n" + text, {"sglang"}))
    assert len(out) == 1, out
    assert out[0].startswith("sglang 0.5.23: its Python code only, as intended")
    assert "torch==2.14.1 (this machine has torch 2.13.0+cpu)" in out[0]
    # Nothing in the note reads like a failure to a newcomer.
    assert not any(word in out[0].lower() for word in ("error", "unmet", "missing", "fail"))
    # A conflict of a package not installed that way is shown as pip wrote it.
    other = "numpy 2.0 requires foo>=1, which is not installed."
    assert pip_summary.render(pip_summary.summarise(text + other + "\n", {"sglang"}))[0] == other


def test_setup_prints_no_pip_error_block() -> None:
    setup = (REPO / "scripts/setup.sh").read_text()
    assert "pip_summary.py" in setup and '>>"$LOG" 2>&1' in setup  # pip's output goes to the log, summarised


# ---------------------------------------------------------------------------------------------- 3 docs


DOCS = ["architecture", "sglang-verify", "lines", "release-layout", "pipeline", "gate", "exit-codes", "testbed"]


def test_no_reference_points_outside_the_repo() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        path = REPO / name
        if name.startswith("tests/cli/test_first_hour") or not path.is_file() or path.suffix in (".json", ".whl"):
            continue
        text = path.read_text(errors="replace")
        if re.search(r"design\.md|\bs\.\d+a?\b(?! *=)", text):
            offenders.append(name)
    assert not offenders, offenders


def test_every_docs_reference_resolves() -> None:
    for doc in DOCS:
        assert (REPO / "docs" / f"{doc}.md").is_file(), doc
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    files += [f"docs/{d}.md" for d in DOCS]
    missing = set()
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix not in (".py", ".md", ".sh", ".toml", ".yaml", ".service", ""):
            continue
        text = path.read_text(errors="replace")
        for ref in re.findall(r"\bdocs/[\w-]+\.md\b", text):  # every docs/<page>.md reference in the repo
            if not (REPO / ref).is_file():
                missing.add(f"{name}: {ref}")
        for ref in re.findall(r"\]\(([^)#]+)", text) if path.suffix == ".md" else ():  # markdown links
            if not ref.startswith("http") and not (path.parent / ref).exists():
                missing.add(f"{name}: {ref}")
    assert not missing, sorted(missing)


def test_exit_code_doc_matches_the_error_types() -> None:
    from opsctl import errors

    table = (REPO / "docs/exit-codes.md").read_text()
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.OpsError) and cls is not errors.OpsError:
            assert re.search(rf"^\| {cls.exit_code} \|.*`{cls.__name__}`", table, re.M), cls.__name__
    from opsctl.cli.deploy import DEPLOY_EXIT_CODES

    for code in (0, 1, 2, 11, 12, 13, 14, 15, 16, 20, 30, 31):
        assert re.search(rf"\b{code} ", DEPLOY_EXIT_CODES), code


# ---------------------------------------------------------------------------------------------- 4/5 reporting


def _reporter(release: str = "r0123456789ab", terminal: bool = False) -> tuple[RichReporter, io.StringIO]:
    buf = io.StringIO()
    out = Console(file=buf, width=200, force_terminal=terminal, color_system=None)
    return RichReporter("local", out, release=release), buf


def _line(text: str) -> ParityLine:
    rec = parse_line(text)
    assert isinstance(rec, ParityLine)
    return rec


@pytest.mark.parametrize("terminal", [False, True], ids=["log", "terminal"])
def test_a_failed_gate_step_shows_a_cross_and_lines_name_their_release(terminal: bool) -> None:
    rep, buf = _reporter(terminal=terminal)
    with rep:
        rep.step("parity")
        rep.parity(_line("[kdtree] L0 max_abs_diff=1.0e+00 mean=1.0e-01 rel=1.12e+00 tp=0"), LineVerdict.FAIL)
        rep.failed("parity", "pre-restart parity FAIL")
        rep.step("switch", "current -> r0123456789ab")
        rep.step("gate")
        rep.parity(_line("[kdtree] L30 max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp=0"), LineVerdict.PASS)
        rep.done("gate", "FAIL: parity L60 rel=1.1 >= fail threshold 0.05")
        rep.step("rollback", "current -> r999999999999")
        rep.step("gate (rollback)")
        rep.parity(_line("[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel=1.0e-03 tp=0"), LineVerdict.PASS)
        rep.done("gate (rollback)", "PASS: 3 consecutive passing parity lines")
    out = buf.getvalue()
    assert "parity r0123456789ab (new, pre-restart) L0" in out
    assert "parity r0123456789ab (new) L30" in out
    assert "parity r999999999999 (rollback) L0" in out
    gate_row = next(line for line in out.splitlines() if "gate FAIL" in line or ("gate " in line and "FAIL:" in line))
    assert "✗" in gate_row and "✓" not in gate_row, gate_row
    assert re.search(r"✓ gate \(rollback\) PASS", out), out
    if not terminal:  # a log: each step's line when it ends, in order with the parity lines
        assert out.index("✗ parity") < out.index("(new) L30") < out.index("✗ gate") < out.index("(rollback) L0")


def test_prerestart_reason_names_the_failing_layers() -> None:
    from opsctl.pipeline import prerestart_fail_reason

    lines = [
        (_line("[kdtree] L30 max_abs_diff=1 mean=0.1 rel=1.05 tp=0"), LineVerdict.FAIL),
        (_line("[kdtree] L0 max_abs_diff=1 mean=0.1 rel=1.12 tp=0"), LineVerdict.FAIL),
        (_line("[kdtree] L0 max_abs_diff=1 mean=0.1 rel=0.9 tp=0"), LineVerdict.FAIL),
        (_line("[kdtree] L60 max_abs_diff=0 mean=0 rel=0.001 tp=0"), LineVerdict.PASS),
    ]
    reason = prerestart_fail_reason(lines, 0.05)
    assert reason.startswith("pre-restart parity L0 rel=1.12 L30 rel=1.05 >= fail threshold 0.05"), reason
    assert prerestart_fail_reason(lines[3:], 0.05) == ""


# ---------------------------------------------------------------------------------------------- 6 JSON errors


def test_json_commands_print_a_json_error(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {"a": _closed_port()})
    for argv in (
        ["deploy", "a", "--json", "--canary", "a"],
        ["status", "a", "--json"],
        ["hosts", "--json", "-i", "/nope.yaml"],
    ):
        proc = _opsctl("-i", str(inv), *argv)
        doc = json.loads(proc.stdout)
        assert set(doc) >= {"error", "exit_code"} and doc["exit_code"] == proc.returncode != 0, (argv, proc.stdout)
        assert doc["error"] in proc.stderr.replace("\n", " ") or doc["error"][:40] in proc.stderr


def test_health_says_where_it_wrote_the_prometheus_file(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {"a": _closed_port()})
    prom = tmp_path / "kdtree.prom"
    proc = _opsctl("-i", str(inv), "health", "a", "--no-alerts", "--prometheus", str(prom))
    assert prom.is_file() and f"wrote {prom} (1 host(s)" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------- 7 tracebacks


def test_unreachable_host_is_one_line_and_the_traceback_needs_debug(tmp_path: Path, no_banner_port: int) -> None:
    inv = _inventory(tmp_path, {"ct200": no_banner_port})
    proc = _opsctl("-i", str(inv), "ping", "ct200")
    assert proc.returncode == 11
    assert "Traceback" not in proc.stderr and "Exception (client)" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ct200: ssh to root@127.0.0.1:"), proc.stderr
    debug = _opsctl("-i", str(inv), "--debug", "ping", "ct200")
    assert debug.returncode == 11 and "Traceback" in debug.stderr


def test_an_unexpected_error_is_one_line_without_debug(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a: {address: 127.0.0.1}\n")
    code = (
        "import sys, opsctl.cli as c, opsctl.fleet.ping as p\n"
        "def boom(*a, **k): raise RuntimeError('library exploded')\n"
        "p.ping_many = boom\n"  # the ping command imports it when it runs
        "sys.exit(c.main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "-i", str(inv), "ping", "a"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: RuntimeError: library exploded (rerun with --debug for the traceback)"


# ---------------------------------------------------------------------------------------------- 8 testbed down


def test_status_on_a_downed_testbed_says_so(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    tb.mkdir()
    (tb / "id_ed25519").write_text("key stays after down\n")  # what `testbed down` leaves behind
    proc = _opsctl("-i", str(tb / "inventory.yaml"), "status", "local")
    assert proc.returncode == 2
    assert f"the testbed at {tb} is down" in proc.stderr
    assert f"bring it up with: OPSCTL_TESTBED_DIR={tb} .venv/bin/opsctl testbed up" in proc.stderr
    assert "No such file" not in proc.stderr
    other = _opsctl("-i", str(tmp_path / "elsewhere.yaml"), "status", "local")  # not a testbed: the plain error
    assert "cannot read inventory" in other.stderr


# ---------------------------------------------------------------------------------------------- 9 one cache


def test_one_rootfs_cache_per_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPSCTL_TESTBED_CACHE", raising=False)
    assert Testbed(tmp_path / "a").cache_dir == Testbed(tmp_path / "b").cache_dir == Path(DEFAULT_CACHE_DIR)
    for script in ("deploy/rehearse.sh", ".ci/run"):
        assert "OPSCTL_TESTBED_CACHE=" not in (REPO / script).read_text(), script  # nobody picks another default
    monkeypatch.setenv("OPSCTL_TESTBED_CACHE", str(tmp_path / "c"))
    assert Testbed(tmp_path / "a").cache_dir == tmp_path / "c"


# ---------------------------------------------------------------------------------------------- 10 progress


def test_long_steps_report_elapsed_time_and_the_last_log_line(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    seen: list[str] = []
    run_local(
        ["bash", "-c", "for i in 1 2 3 4 5 6; do echo I: step $i; sleep 0.25; done"],
        log_file=log,
        what="debootstrap",
        progress=seen.append,
        every_s=0.5,
    )
    assert len(seen) >= 2, seen
    assert re.fullmatch(r"  debootstrap: \d+s, last: I: step \d", seen[-1]), seen
    assert last_log_line(log) == "I: step 6"


def test_log_lines_are_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsctl.cli import testbed as cli_testbed

    buf = io.StringIO()
    monkeypatch.setattr(cli_common, "err", Console(file=buf, width=60))
    path = "/var/cache/opsctl-testbed/rootfs-8d43053c9d1534ec.build.log"
    cli_testbed._log_line(f"debootstrap bookworm (minbase) -> /var/cache/x (log: {path})")
    assert f"(log: {path})" in buf.getvalue().splitlines()[0]


# ---------------------------------------------------------------------------------------------- 11 help


def test_help_texts() -> None:
    deploy = _opsctl("deploy", "--help").stdout
    assert "Exit codes" in deploy and "20 the host's deploy lock is held" in " ".join(deploy.split())
    assert "31 parity FAIL" in " ".join(deploy.split())
    sched = " ".join(_opsctl("schedule", "install", "--help").stdout.split())
    assert "--rollback-on-fail" in sched and "last good release" in sched


@pytest.mark.parametrize("command", ["rollback", "restart"])
def test_commands_that_restart_the_service_read_the_host_before_asking(tmp_path: Path, command: str) -> None:
    inv = _inventory(tmp_path, {"ct200": _closed_port()})
    proc = subprocess.run(
        [sys.executable, "-m", "opsctl", "-i", str(inv), command, "ct200"],
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    # Refused before asking (issue 38): the host is read first, so an unreachable one ends the command with its
    # own code (11) and nothing is asked.
    assert proc.returncode == 11, (proc.returncode, proc.stdout, proc.stderr)
    assert "[y/N]" not in proc.stdout and "ct200" in proc.stderr
