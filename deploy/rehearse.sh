#!/usr/bin/env bash
# One-command rehearsal of a production deploy, on this machine:
#   boot the testbed (real systemd-nspawn hosts), deploy this working tree to `local` through the full pipeline
#   (upload, verify, build, pre-restart parity, switch, unit, restart, gate), then show the verdict, the status
#   and the decoded shapes lines from the journal.
# Usage: deploy/rehearse.sh [extra `opsctl deploy` options, e.g. --gate-timeout 120]
# Needs root (systemd-nspawn): as a user it runs itself through sudo. Exit code: the deploy's (0 only on a PASS).
set -euo pipefail
# shellcheck source=../scripts/as-root.sh
. "$(dirname "$0")/../scripts/as-root.sh"
as_root "$0" "$@"
cd "$(dirname "$0")/.."
if [ -n "${OPSCTL:-}" ]; then :
elif [ -x .venv/bin/opsctl ]; then OPSCTL=.venv/bin/opsctl
else
    echo "error: no .venv/bin/opsctl: set up first with: bash scripts/setup.sh" >&2
    exit 2
fi
STATE=${OPSCTL_TESTBED_DIR:-.testbed}
INV="$STATE/inventory.yaml"

echo "== testbed up (the rootfs is built once, a few minutes; later boots take seconds)"
"$OPSCTL" testbed up
echo "== deploy this working tree to local"
rc=0
"$OPSCTL" --inventory "$INV" deploy local --yes "$@" || rc=$?
echo "== status of local"
"$OPSCTL" --inventory "$INV" status local || true
echo "== the last [kdtree] shapes lines, decoded"
"$OPSCTL" --inventory "$INV" logs local --grep shapes --lines 5000 | tail -n 6 || true
echo "== rehearsal: $([ "$rc" = 0 ] && echo PASS || echo "FAILED (exit $rc)"); next: $OPSCTL --inventory $INV --help"
exit "$rc"
