#!/usr/bin/env bash
# Set up this checkout on a fresh Debian/Ubuntu machine (idempotent): the apt tools the testbed needs and a venv
# at .venv with opsctl (+ dev tools) and the CPU torch. Root for apt-get; run as: sudo bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
PY="${PYTHON:-python3}"

need=()
for pair in systemd-nspawn:systemd-container debootstrap:debootstrap rsync:rsync ssh:openssh-client \
    ssh-keygen:openssh-client nsenter:util-linux ip:iproute2; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "error: missing ${need[*]}: run as root, or: sudo apt-get install -y ${need[*]}" >&2
        exit 2
    fi
    echo "apt-get install ${need[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip_install() {  # quiet pip; this machine's pip config names package folders that may not exist: not news
    .venv/bin/pip install -q "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
}
pip_install -e '.[dev]' 'torch==2.13.0'
# --- backend: the real SGLang 0.5.23 on the CPU, so the plugin is tested against upstream. SGLang and the packages
# whose own requirements would pull a CUDA torch go in with --no-deps; the light rest is the backend-cpu extra.
pip_install --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 gguf openai==2.8.0
pip_install -e '.[dev,backend-cpu]' 'torch==2.13.0'
# --- end backend ---------------------------------------------------------------------------------------------
.venv/bin/python -c "import torch, opsctl; print('opsctl', opsctl.__version__, '| torch', torch.__version__)"
