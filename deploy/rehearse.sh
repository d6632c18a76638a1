#!/usr/bin/env bash
# One-command rehearsal of a production deploy, on this machine:
#   boot the testbed (real systemd-nspawn hosts), deploy this working tree to `local` through the full pipeline
#   (upload, verify, build, pre-restart parity, switch, unit, restart, gate), then show the verdict, the status
#   and the decoded shapes lines from the journal.
# Usage: deploy/rehearse.sh [extra `opsctl deploy` options, e.g. --gate-timeout 120]
# Needs root (systemd-nspawn). Exit code: the deploy's (0 only on a PASS).
set -euo pipefail
cd "$(dirname "$0")/.."
OPSCTL=${OPSCTL:-$( [ -x .venv/bin/opsctl ] && echo .venv/bin/opsctl || command -v opsctl)}
STATE=${OPSCTL_TESTBED_DIR:-.testbed}
INV="$STATE/inventory.yaml"

"$OPSCTL" testbed up
rc=0
"$OPSCTL" --inventory "$INV" deploy local --yes "$@" || rc=$?
"$OPSCTL" --inventory "$INV" status local || true
"$OPSCTL" --inventory "$INV" logs local --grep shapes --lines 400 | tail -n 6 || true
exit "$rc"
