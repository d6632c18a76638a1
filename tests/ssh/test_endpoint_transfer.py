"""Pure parts of the SSH layer: endpoint resolution from ssh_config, OpenSSH/rsync command lines, rsync stats."""

from __future__ import annotations

from pathlib import Path

import paramiko

from opsctl.inventory import parse
from opsctl.ssh import known_hosts_name, openssh_command, parse_rsync_stats, resolve_endpoint, rsync_argv

INV = """\
defaults:
  known_hosts: /tmp/kh
  connect_timeout_s: 4
hosts:
  plain: {address: 10.9.9.9, port: 2200, user: ops, identity_file: /keys/id}
  aliased: {ssh_alias: gpu7, user: root}
  aliased_partial: {ssh_alias: gpu8, address: 10.1.1.8, user: admin, port: 2022}
"""

CONFIG = """\
Host gpu7
  HostName 192.0.2.7
  Port 2207
  User svc
  IdentityFile /keys/gpu7
  ProxyJump jumper@bastion:2200,second
Host gpu8
  IdentityFile /keys/gpu8
Host bastion
  HostName 198.51.100.1
Host second
  HostName 198.51.100.2
  User hop
"""


def _cfg() -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_text(CONFIG)


def test_plain_host_uses_inventory() -> None:
    ep = resolve_endpoint(parse(INV).hosts["plain"], _cfg())
    assert (ep.hostname, ep.port, ep.user, ep.identity_files) == ("10.9.9.9", 2200, "ops", ("/keys/id",))
    assert ep.known_hosts == Path("/tmp/kh") and ep.jumps == () and ep.connect_timeout_s == 4
    assert ep.known_hosts_name == "[10.9.9.9]:2200"


def test_alias_takes_ssh_config_values_and_jumps() -> None:
    ep = resolve_endpoint(parse(INV).hosts["aliased"], _cfg())
    assert (ep.hostname, ep.port, ep.user, ep.identity_files) == ("192.0.2.7", 2207, "svc", ("/keys/gpu7",))
    assert [(j.hostname, j.port, j.user) for j in ep.jumps] == [
        ("198.51.100.1", 2200, "jumper"),
        ("198.51.100.2", 22, "hop"),
    ]


def test_alias_falls_back_to_inventory_for_what_config_does_not_say() -> None:
    ep = resolve_endpoint(parse(INV).hosts["aliased_partial"], _cfg())
    assert (ep.hostname, ep.port, ep.user, ep.identity_files) == ("10.1.1.8", 2022, "admin", ("/keys/gpu8",))


def test_known_hosts_name_follows_openssh() -> None:
    assert known_hosts_name("h", 22) == "h"
    assert known_hosts_name("127.0.0.1", 2221) == "[127.0.0.1]:2221"


def test_openssh_command_is_strict_and_chains_jumps_through_the_same_known_hosts() -> None:
    ep = resolve_endpoint(parse(INV).hosts["aliased"], _cfg())
    argv = openssh_command(ep)
    joined = " ".join(argv)
    assert "StrictHostKeyChecking=yes" in joined and "UserKnownHostsFile=/tmp/kh" in joined
    assert "BatchMode=yes" in joined and "GlobalKnownHostsFile=/dev/null" in joined
    assert argv[argv.index("-p") + 1] == "2207" and argv[argv.index("-l") + 1] == "svc"
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    # Outer hop is the last jump (second), which itself goes through bastion; both check /tmp/kh.
    assert proxy.count("UserKnownHostsFile=/tmp/kh") == 2 and "198.51.100.2" in proxy and "198.51.100.1" in proxy


def test_rsync_argv() -> None:
    ep = resolve_endpoint(parse(INV).hosts["plain"], _cfg())
    argv = rsync_argv(ep, Path("/src"), "/root/x/", "/root/prev", True, ["*.pyc", "build/"], sudo=True)
    assert argv[0] == "rsync" and "-a" in argv and "--stats" in argv
    # Unchanged means the same content, not the same size and mtime (issue 47): for --link-dest and the destination.
    assert "--checksum" in argv
    assert "--link-dest=/root/prev" in argv and "--delete" in argv
    assert "--exclude=*.pyc" in argv and "--exclude=build/" in argv
    assert "--rsync-path=sudo -n rsync" in argv
    assert argv[-2:] == ["/src/", "10.9.9.9:/root/x/"]
    assert "StrictHostKeyChecking=yes" in argv[argv.index("-e") + 1]
    no_sudo = rsync_argv(ep, Path("/src"), "/root/x", None, False, [], sudo=False)
    assert not any(a.startswith("--rsync-path") for a in no_sudo) and "--delete" not in no_sudo


def test_parse_rsync_stats() -> None:
    out = """
Number of files: 25 (reg: 20, dir: 5)
Number of created files: 25 (reg: 20, dir: 5)
Number of regular files transferred: 20
Total file size: 1,310,720 bytes
Total bytes sent: 1,312,345
Total bytes received: 420
"""
    stats = parse_rsync_stats(out, 1.5)
    assert (stats.bytes_sent, stats.files_transferred, stats.elapsed_s) == (1312345, 20, 1.5)
    assert parse_rsync_stats("", 0.1).bytes_sent == 0
