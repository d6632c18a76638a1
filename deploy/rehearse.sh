#!/usr/bin/env bash
# One-command rehearsal of a production deploy, on this machine:
#   boot the testbed (real systemd-nspawn hosts), deploy this working tree to `local` through the full pipeline
#   (upload, verify, build, pre-restart parity, switch, unit, restart, readiness, probe traffic, gate), then show the
#   verdict, the status and the decoded shapes lines from the journal.
#   The comparison with the release replaced (docs/gate.md "The comparison") is printed after the deploy.
# Usage: deploy/rehearse.sh [--bad] [--slow] [--common-mode] [extra `opsctl deploy` options, e.g. --gate-timeout 120]
#   --bad: then also deploy a copy of this tree with the seed's bug (drafts left out of the keys, opsctl.testbed.
#          variants) past the pre-restart check, and show the gate catch it on the probe's traffic and the host
#          left on the good release.
#   --slow: then deploy a copy whose every verify step takes 1.5x as long (`opsctl testbed variant slow`): parity
#          passes, the pre-restart speed check refuses it before the switch (no restart), exit 31.
#   --common-mode: then deploy a copy with a metadata bug the kernel path and its reference share (`opsctl testbed
#          variant common-mode`): parity passes, the answers differ, the comparison FAILs, rolled back.
#   Each: exit 0 only when the good release PASSed and every bad one was caught (exit 31, the host back on the good
#   release, caught at the stage the flag names).
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
SLOW=0
COMMON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bad) BAD=1 ;;
        --slow) SLOW=1 ;;
        --common-mode) COMMON=1 ;;
        *) break ;;
    esac
    shift
done
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
current() {
    "$OPSCTL" --inventory "$INV" status local --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["current"])'
}
# The comparison line of the running release's deploy (opsctl releases --json: each release's comparison).
running_comparison() {
    "$OPSCTL" --inventory "$INV" releases local --json | python3 -c '
import json, sys
rows = [r for r in json.load(sys.stdin) if "current" in r["flags"]]
c = rows[0].get("comparison") if rows else None
print(c["line"] if c and c.get("line") else "none recorded")'
}
echo "== the comparison with the release it replaced: $(running_comparison)"
bad_tree=$(mktemp -d /tmp/kdtree-variants.XXXXXX)
trap 'rm -rf "$bad_tree"' EXIT
# stage_and_line ID: where the deploy of release ID stopped ("gate" when no comparison was recorded for it) and its
# comparison line (opsctl releases --json).
stage_and_line() {
    "$OPSCTL" --inventory "$INV" releases local --json | python3 -c '
import json, sys
rows = [r for r in json.load(sys.stdin) if r["id"] == sys.argv[1]]
c = rows[0].get("comparison") if rows else None
row = rows[0] if rows else {}
# Refused before the switch (the pre-restart speed check): that stage and its reason; else the comparison'"'"'s.
if row.get("stage") == "pre-restart speed":
    print(row["stage"], row.get("reason") or "-", sep="\t")
else:
    print((c or {}).get("stage") or "gate", (c or {}).get("line") or "-", sep="\t")' "$1"
}
# caught NAME VARIANT STAGE [deploy options]: deploy `opsctl testbed variant VARIANT` of this tree; it must exit 31,
# stop at STAGE ("gate", "comparison" or "pre-restart speed") and leave local on the good release.
caught() {
    local name=$1 variant=$2 stage=$3 good now id got line bad_rc=0
    shift 3
    good=$(current)
    "$OPSCTL" testbed variant "$variant" "$bad_tree/$variant" >/dev/null
    id=$("$OPSCTL" bundle --src "$bad_tree/$variant" 2>/dev/null)
    echo "== deploy a release with $name ($id)"
    "$OPSCTL" --inventory "$INV" deploy local --yes --src "$bad_tree/$variant" "$@" || bad_rc=$?
    IFS=$'\t' read -r got line < <(stage_and_line "$id")
    local tries=1
    # Speed "cannot decide" (other work took this machine's CPU on one side) passes the release: put the good one
    # back (the baseline must be the good release) and deploy it again.
    while [ "$bad_rc" = 0 ] && [ "$tries" -lt 3 ] && [[ "$line" == *"cannot decide"* ]]; do
        echo "== the comparison could not decide ($line): back to $good, then deploying it again"
        tries=$((tries + 1))
        bad_rc=0
        "$OPSCTL" --inventory "$INV" rollback local --to "$good" --yes >/dev/null || true
        "$OPSCTL" --inventory "$INV" deploy local --yes --src "$bad_tree/$variant" "$@" || bad_rc=$?
        IFS=$'\t' read -r got line < <(stage_and_line "$id")
    done
    now=$(current)
    echo "== the $got: $line"
    if [ "$bad_rc" = 31 ] && [ "$now" = "$good" ] && [ "$got" = "$stage" ]; then
        echo "== rehearsal: $name caught at the $stage (exit 31); local is back on the good release $good"
    else
        echo "== rehearsal: $name NOT CAUGHT as expected (deploy exit $bad_rc, stage $got, current $now, good $good)"
        rc=1
    fi
}
if [ "$rc" = 0 ] && [ "$BAD" = 1 ]; then
    caught "the seed's bug (drafts left out of the keys) past the pre-restart check" seed-bug gate \
        --skip-prerestart-parity "$@"
fi
if [ "$rc" = 0 ] && [ "$SLOW" = 1 ]; then
    caught "every verify step 1.5x as long (parity passes)" slow "pre-restart speed" "$@"
fi
if [ "$rc" = 0 ] && [ "$COMMON" = 1 ]; then
    caught "a metadata bug the kernel and its reference share (parity passes)" common-mode comparison "$@"
fi
echo "== rehearsal: $([ "$rc" = 0 ] && echo PASS || echo "FAILED (exit $rc)"); next: $OPSCTL --inventory $INV --help"
exit "$rc"
