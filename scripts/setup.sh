#!/usr/bin/env bash
# Set up this checkout on a fresh Debian/Ubuntu machine (idempotent): the apt tools the testbed needs and a venv
# at .venv with opsctl (+ dev tools), the CPU torch and SGLang's Python code for the backend tests.
#   bash scripts/setup.sh
# As root it runs apt-get itself; as a user, apt-get goes through sudo (only when a package is missing) and the
# venv belongs to that user. Prints a few lines of what it did; pip's full output is in .venv/setup-pip.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
PY="${PYTHON:-python3}"
say() { echo "setup: $*"; }

need=()
for pair in systemd-nspawn:systemd-container debootstrap:debootstrap rsync:rsync ssh:openssh-client \
    ssh-keygen:openssh-client nsenter:util-linux ip:iproute2; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
"$PY" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    if [ "$(id -u)" = 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null; then
        as_root=(sudo)
    else
        echo "error: missing ${need[*]}; installing them needs root and there is no sudo here: run this as root" >&2
        exit 2
    fi
    say "apt-get install ${need[*]}"
    apt_log=$(mktemp)
    if ! { "${as_root[@]}" apt-get update -qq && \
           "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; \
         } >"$apt_log" 2>&1; then
        tail -n 20 "$apt_log" >&2
        echo "error: apt-get install ${need[*]} failed (above: the end of its output)" >&2
        exit 1
    fi
    rm -f "$apt_log"
else
    say "apt tools present (systemd-nspawn, debootstrap, rsync, ssh)"
fi

if [ -x .venv/bin/python ]; then
    say ".venv exists ($(.venv/bin/python -V 2>&1))"
else
    "$PY" -m venv .venv
    say ".venv created ($(.venv/bin/python -V 2>&1))"
fi
LOG=.venv/setup-pip.log
: >"$LOG"
pip_install() {  # pip_install WHAT ARGS...: quiet pip into $LOG; on failure its tail and the log's path
    local what=$1
    shift
    echo "\$ pip install $*" >>"$LOG"
    if ! .venv/bin/pip install -q "$@" >>"$LOG" 2>&1; then
        grep -v 'is ignored: it is neither a file nor a directory' "$LOG" | tail -n 20 >&2
        echo "error: pip install of $what failed (full output: $LOG)" >&2
        exit 1
    fi
}
pip_install "opsctl, dev tools and the CPU torch" -e '.[dev]' 'torch==2.13.0'
# --- backend: the real SGLang 0.5.23 on the CPU, so the plugin is tested against upstream. SGLang and the packages
# whose own requirements would pull a CUDA torch go in with --no-deps; the light rest is the backend-cpu extra.
pip_install "SGLang (no deps)" --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 gguf openai==2.8.0
pip_install "the backend's CPU packages" -e '.[dev,backend-cpu]' 'torch==2.13.0'
# --- end backend ---------------------------------------------------------------------------------------------
# An editable install leaves the project's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set (or the
# checkout is read-only) every opsctl command would compile them again: ~0.15 s of each start. Compiled once here.
PYTHONDONTWRITEBYTECODE= .venv/bin/python -m compileall -q opsctl backend kernel >/dev/null
say "installed opsctl (editable), pytest/ruff, torch 2.13.0 (CPU) and SGLang 0.5.23 without its GPU dependencies"
.venv/bin/python scripts/pip_summary.py "$LOG" --expected sglang | sed 's/^/setup: /'
.venv/bin/python -c "import torch, opsctl; print(f'setup: done: .venv/bin/opsctl {opsctl.__version__} (torch {torch.__version__}); pip log: $LOG')"
