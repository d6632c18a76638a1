"""Run a built command in a local POSIX shell (dash on Debian, as a host's `sh -c` would)."""

from __future__ import annotations

import subprocess

HOSTILE = "/srv/kdtree engine/it's $HOME `id`; rm -rf x"  # a value every builder must keep as one word


def sh(command: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=60, env=env)
