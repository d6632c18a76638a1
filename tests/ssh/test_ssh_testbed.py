"""The SSH layer against booted testbed hosts: real sshd, real host keys, real processes. No mocks."""

from __future__ import annotations

import base64
import hashlib
import hashlib as _h
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.errors import AuthFailed, CommandFailed, CommandTimeout, HostKeyMismatch, HostKeyUnknown, HostUnreachable
from opsctl.inventory import HostConfig, Inventory
from opsctl.ssh import SSH_CONFIG_ENV, connect


def _fingerprint_from_known_hosts(known_hosts: Path, name: str) -> tuple[str, str]:
    """(key type, SHA256 fingerprint) of ``name`` in a known_hosts file, computed here independently."""
    for line in known_hosts.read_text().splitlines():
        host, ktype, blob = line.split()[:3]
        if host == name:
            digest = hashlib.sha256(base64.b64decode(blob)).digest()
            return ktype, "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    raise AssertionError(f"{name} not in {known_hosts}")


def _with(host: HostConfig, **changes: object) -> HostConfig:
    return host.model_copy(update=changes)


@pytest.fixture
def tb1(testbed: Inventory) -> HostConfig:
    return testbed.host("tb1")


# ---------------------------------------------------------------------------------------------- commands


def test_run_quotes_sequences_and_passes_stdin(tb1: HostConfig) -> None:
    with connect(tb1) as r:
        hostname = r.run("hostname").stdout.strip()
        assert hostname == "tb1"
        hostile = "a b; echo INJECTED $(id)"
        res = r.run(["printf", "%s", hostile])
        assert res.stdout == hostile and res.rc == 0 and res.elapsed_s > 0
        assert r.run("od -An -tx1", stdin=b"\x00\x01\xff").stdout.split() == ["00", "01", "ff"]
        assert r.run("wc -c", stdin="12345").stdout.strip() == "5"


def test_failing_command_surfaces_rc_and_stderr(tb1: HostConfig) -> None:
    with connect(tb1) as r:
        with pytest.raises(CommandFailed) as exc:
            r.run("echo to-stdout; echo 'disk on fire' >&2; exit 7")
        assert exc.value.rc == 7
        assert "disk on fire" in exc.value.stderr_tail
        assert "exited 7" in str(exc.value) and exc.value.exit_code == 15
        res = r.run("echo out; echo err >&2; exit 3", check=False)
        assert (res.rc, res.stdout.strip(), res.stderr.strip()) == (3, "out", "err")


def test_output_streams_before_the_command_ends(tb1: HostConfig) -> None:
    seen: list[tuple[float, str]] = []
    with connect(tb1) as r:
        start = time.monotonic()
        res = r.run(
            "for i in 1 2 3; do echo line$i; sleep 0.7; done; echo done >&2",
            on_output=lambda line: seen.append((time.monotonic() - start, line)),
        )
        end = time.monotonic() - start
    assert [line for _, line in seen] == ["line1", "line2", "line3", "done"]
    assert seen[0][0] < end - 1.0, f"first line arrived at {seen[0][0]:.2f}s, command ended at {end:.2f}s"
    assert res.stdout == "line1\nline2\nline3\n"


def test_timeout_kills_the_command_on_the_host(tb1: HostConfig) -> None:
    tag = f"{time.time_ns() % 10**9}"
    # A foreground sleep, a background child and a child that left the session with setsid.
    cmd = f"sleep 4{tag} & setsid sleep 5{tag} & sleep 6{tag}"
    with connect(tb1) as r:
        start = time.monotonic()
        with pytest.raises(CommandTimeout) as exc:
            r.run(cmd, timeout=1.5)
        took = time.monotonic() - start
        assert 1.5 <= took < 8, took
        assert exc.value.timeout == 1.5 and exc.value.exit_code == 16
        left = r.run(f"pgrep -af 'sleep [456]{tag}' || true").stdout.strip()
    assert left == "", f"still running on the host: {left}"


def test_default_timeout_is_the_hosts_command_timeout(tb1: HostConfig) -> None:
    with connect(_with(tb1, command_timeout_s=1.0)) as r, pytest.raises(CommandTimeout):
        r.run("sleep 30")


def test_sudo_for_a_non_root_user(testbed: Inventory) -> None:
    root = testbed.host("local")
    setup = (
        "id deploy >/dev/null 2>&1 || useradd -m -s /bin/sh deploy; "
        "install -d -m 700 -o deploy -g deploy ~deploy/.ssh; "
        "install -m 600 -o deploy -g deploy /root/.ssh/authorized_keys ~deploy/.ssh/authorized_keys; "
        "echo 'deploy ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/deploy; chmod 440 /etc/sudoers.d/deploy"
    )
    with connect(root) as r:
        r.run(setup)
    with connect(_with(root, user="deploy")) as r:
        assert r.run("id -u").stdout.strip() == "0"  # sudo by default when not root
        assert r.run("id -un", sudo=False).stdout.strip() == "deploy"
        r.write_file("/etc/opsctl-sudo-test", "x\n")  # root-owned path through sudo
        assert r.read_file("/etc/opsctl-sudo-test") == b"x\n"


# ---------------------------------------------------------------------------------------------- files


def test_write_and_read_file_atomically(tb1: HostConfig) -> None:
    data = bytes(range(256)) * 100
    with connect(tb1) as r:
        r.run("mkdir -p /root/opsctl-test")
        r.write_file("/root/opsctl-test/blob", data, mode=0o600)
        assert r.read_file("/root/opsctl-test/blob") == data
        assert r.run("stat -c %a /root/opsctl-test/blob").stdout.strip() == "600"
        r.write_file("/root/opsctl-test/blob", "replaced\n")
        assert r.read_file("/root/opsctl-test/blob") == b"replaced\n"
        assert r.run("ls -A /root/opsctl-test").stdout.split() == ["blob"]  # no temp files left
        with pytest.raises(CommandFailed):
            r.read_file("/root/opsctl-test/missing")
        with pytest.raises(CommandFailed) as exc:
            r.write_file("/root/opsctl-test/no-such-dir/f", "x")
        assert exc.value.command == "write /root/opsctl-test/no-such-dir/f"
        r.run("rm -rf /root/opsctl-test")


def _tree(root: Path) -> None:
    for i in range(20):
        d = root / f"d{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(_h.sha256(str(i).encode()).digest() * 2000)  # 64 KB each
    (root / "skip.log").write_text("excluded\n")


def test_rsync_then_unchanged_rsync_sends_almost_nothing(tb1: HostConfig, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    dest = "/root/opsctl-rsync/a"
    with connect(tb1) as r:
        r.run("rm -rf /root/opsctl-rsync")
        first = r.rsync(src, dest, exclude=["*.log"])
        assert first.files_transferred == 20 and first.bytes_sent > 20 * 64_000
        remote = r.run(f"cd {dest} && find . -type f | sort && cat d1/f1.bin | sha256sum").stdout.split()
        assert "./skip.log" not in remote and "./d1/f1.bin" in remote
        assert hashlib.sha256((src / "d1/f1.bin").read_bytes()).hexdigest() in remote

        second = r.rsync(src, dest, exclude=["*.log"])
        assert second.files_transferred == 0
        assert second.bytes_sent < first.bytes_sent / 50, (first, second)

        # link_dest: an identical tree next to it is hard-linked, not sent again.
        third = r.rsync(src, "/root/opsctl-rsync/b", link_dest=dest, exclude=["*.log"])
        assert third.bytes_sent < first.bytes_sent / 50
        assert r.run("stat -c %h /root/opsctl-rsync/b/d1/f1.bin").stdout.strip() == "2"

        # delete: files gone locally disappear remotely.
        (src / "d1/f1.bin").unlink()
        r.rsync(src, dest, delete=True, exclude=["*.log"])
        assert r.run(f"test -e {dest}/d1/f1.bin", check=False).rc == 1
        r.run("rm -rf /root/opsctl-rsync")


# ---------------------------------------------------------------------------------------------- host keys


def test_unknown_host_key_is_refused_with_fingerprint(tb1: HostConfig, tmp_path: Path) -> None:
    ktype, fp = _fingerprint_from_known_hosts(Path(tb1.known_hosts), f"[127.0.0.1]:{tb1.port}")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = _with(tb1, known_hosts=str(empty))
    with pytest.raises(HostKeyUnknown) as exc:
        with connect(host):
            pass
    assert fp in str(exc.value) and ktype in str(exc.value) and "--accept-new-host-key" in str(exc.value)
    assert exc.value.exit_code == 13
    assert empty.read_text() == ""  # nothing was accepted

    # Accepting on request records it; afterwards strict checking passes.
    with connect(host, accept_new_host_key=True) as r:
        assert r.run("hostname").stdout.strip() == "tb1"
    assert _fingerprint_from_known_hosts(empty, f"[127.0.0.1]:{tb1.port}") == (ktype, fp)
    with connect(host) as r:
        assert r.run("true").rc == 0


def test_accept_new_policy_from_inventory(tb1: HostConfig, tmp_path: Path) -> None:
    kh = tmp_path / "kh"
    with connect(_with(tb1, known_hosts=str(kh), host_key_policy="accept-new")) as r:
        r.run("true")
    assert f"[127.0.0.1]:{tb1.port} ssh-ed25519 " in kh.read_text()


def test_changed_host_key_is_refused(tb1: HostConfig, tmp_path: Path) -> None:
    _, real_fp = _fingerprint_from_known_hosts(Path(tb1.known_hosts), f"[127.0.0.1]:{tb1.port}")
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    ktype, blob = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{tb1.port} {ktype} {blob}\n")
    _, old_fp = _fingerprint_from_known_hosts(kh, f"[127.0.0.1]:{tb1.port}")
    for accept in (False, True):  # accepting new keys never accepts a changed one
        with pytest.raises(HostKeyMismatch) as exc:
            with connect(_with(tb1, known_hosts=str(kh)), accept_new_host_key=accept):
                pass
        assert real_fp in str(exc.value) and old_fp in str(exc.value) and exc.value.exit_code == 14
    assert kh.read_text().count("\n") == 1


# ---------------------------------------------------------------------------------------------- failures to connect


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_closed_port_is_unreachable_at_once(tb1: HostConfig) -> None:
    host = _with(tb1, port=_free_port(), connect_timeout_s=3.0)
    start = time.monotonic()
    with pytest.raises(HostUnreachable) as exc:
        with connect(host):
            pass
    assert time.monotonic() - start < 3.0
    assert exc.value.exit_code == 11 and "refused" in str(exc.value).lower()


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a hung host)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_hung_host_fails_within_connect_timeout(tb1: HostConfig, silent_listener: int) -> None:
    host = _with(tb1, port=silent_listener, connect_timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(HostUnreachable):
        with connect(host):
            pass
    took = time.monotonic() - start
    assert 1.5 <= took < 2.0 + 2.0, took


def test_wrong_key_is_auth_failure(tb1: HostConfig, tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(AuthFailed) as exc:
        with connect(_with(tb1, identity_file=str(key))):
            pass
    assert exc.value.exit_code == 12 and "root" in str(exc.value)


# ---------------------------------------------------------------------------------------------- ssh_config


def test_ssh_alias_with_proxyjump(testbed: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tb1, tb2 = testbed.host("tb1"), testbed.host("tb2")
    key = tb1.identity_file
    closed = _free_port()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host tb2-via-tb1\n  HostName 127.0.0.1\n  Port {tb2.port}\n  User root\n  IdentityFile {key}\n"
        f"  ProxyJump root@127.0.0.1:{tb1.port}\n"
        f"Host tb2-via-nothing\n  HostName 127.0.0.1\n  Port {tb2.port}\n  ProxyJump root@127.0.0.1:{closed}\n"
    )
    monkeypatch.setenv(SSH_CONFIG_ENV, str(cfg))
    via = _with(tb2, ssh_alias="tb2-via-tb1", address=None, port=22)
    with connect(via) as r:
        assert r.run("hostname").stdout.strip() == "tb2"
        src = tmp_path / "tree"
        (src / "x").mkdir(parents=True)
        (src / "x/file").write_text("through the jump host\n")
        stats = r.rsync(src, "/root/opsctl-jump")
        assert stats.files_transferred == 1
        assert r.read_file("/root/opsctl-jump/x/file") == b"through the jump host\n"
        r.run(["rm", "-rf", "/root/opsctl-jump"])
    # The hop is really used: a dead jump host makes the (otherwise reachable) target unreachable.
    with pytest.raises(HostUnreachable):
        with connect(_with(tb2, ssh_alias="tb2-via-nothing", address=None)):
            pass


def test_openssh_sees_the_same_host(tb1: HostConfig) -> None:
    """ssh_command() (what rsync uses) reaches the host with strict checking against the testbed known_hosts."""
    with connect(tb1) as r:
        argv = [*r.ssh_command(), r.endpoint.hostname, "hostname"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tb1"
    assert "StrictHostKeyChecking=yes" in shlex.join(argv)
