#!/usr/bin/env bash
# One-command rehearsal of a production deploy, on this machine:
#   boot the testbed (real systemd-nspawn hosts), deploy this working tree to `local` through the full pipeline
#   (upload, verify, build, pre-restart parity, switch, unit, restart, readiness, probe traffic, gate), then show the
#   verdict, the status and the decoded shapes lines from the journal.
# Usage: deploy/rehearse.sh [--bad] [extra `opsctl deploy` options, e.g. --gate-timeout 120]
#   --bad: then also deploy a copy of this tree with the seed's bug (drafts left out of the keys, opsctl.testbed.
#          variants) past the pre-restart check, and show the gate catch it on the probe's traffic and the host
#          left on the good release. Exit 0 only when the good release PASSed and the bad one was caught.
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
BAD=0
if [ "${1:-}" = --bad ]; then
    BAD=1
    shift
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
if [ "$BAD" = 1 ] && [ "$rc" = 0 ]; then
    good=$("$OPSCTL" --inventory "$INV" status local --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["current"])')
    bad_tree=$(mktemp -d /tmp/kdtree-seed-bug.XXXXXX)
    trap 'rm -rf "$bad_tree"' EXIT
    "$OPSCTL" testbed variant seed-bug "$bad_tree/tree" >/dev/null
    echo "== deploy a release with the seed's bug (drafts left out of the keys) past the pre-restart check"
    bad_rc=0
    "$OPSCTL" --inventory "$INV" deploy local --yes --src "$bad_tree/tree" --skip-prerestart-parity "$@" || bad_rc=$?
    now=$("$OPSCTL" --inventory "$INV" status local --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["current"])')
    echo "== status of local after the bad release"
    "$OPSCTL" --inventory "$INV" status local || true
    if [ "$bad_rc" = 31 ] && [ "$now" = "$good" ]; then
        echo "== rehearsal --bad: the gate caught the seed's bug (exit 31); local is back on the good release $good"
    else
        echo "== rehearsal --bad: NOT CAUGHT as expected (deploy exit $bad_rc, current $now, good $good)"
        rc=1
    fi
fi
echo "== rehearsal: $([ "$rc" = 0 ] && echo PASS || echo "FAILED (exit $rc)"); next: $OPSCTL --inventory $INV --help"
exit "$rc"
