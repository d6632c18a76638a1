"""Issue 47, case 1, on a real host: a release whose TP rank 1 prints a failing parity line that journald cuts
inside its token (standin.fault split-line:1) is failed by the gate and rolled back, and the host's own journal,
read back as JSON and as text, fails offline too."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from opsctl import pipeline as d
from opsctl.gate.decision import Verdict
from opsctl.gate.parity_check import check_journal
from opsctl.inventory import HostConfig, Inventory
from opsctl.release import make_manifest
from opsctl.ssh import connect
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import assert_healthy, ensure_good, fast


def test_a_line_split_inside_its_token_fails_the_gate_and_offline(
    testbed: Inventory, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    host: HostConfig = fast(testbed.host("tb2"))
    ensure_good(host, good_tree, good_id)
    bad = trees.with_standin(trees.copy_tree(tmp_path / "split", "split-line"), fault="split-line:1")
    bad_id = make_manifest(bad).id
    res = d.deploy(host, bad, d.DeployOptions(skip_prerestart_parity=True))
    assert res.verdict == "FAIL", res.line()
    assert "journald split this message (_LINE_BREAK=line-max)" in res.reason, res.reason
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap = assert_healthy(host, good_id)
    assert bad_id in snap.bad and snap.last_good == good_id
    with connect(host) as r:
        unit = shlex.quote(f"{host.unit}.service")
        fields = "--output-fields=_SYSTEMD_INVOCATION_ID,_LINE_BREAK"
        found = r.run(f"journalctl -u {unit} -o json --all {fields} --no-pager -q | grep _LINE_BREAK", timeout=60)
        cut = [json.loads(x) for x in found.stdout.splitlines() if x.startswith("{")]
        # The real journald cut the line (LineMax) inside the failed invocation's journal.
        assert cut and cut[-1]["_LINE_BREAK"] == "line-max", found.stdout[-500:]
        select = "_SYSTEMD_INVOCATION_ID=" + shlex.quote(cut[-1]["_SYSTEMD_INVOCATION_ID"])
        as_json = r.run(f"journalctl {select} -o json --all --no-pager -q", timeout=60).stdout
        as_text = r.run(f"journalctl {select} -o short-iso --all --no-pager -q", timeout=60).stdout
    assert any(line.endswith(tuple("0123456789abcdef")) and " token=" in line[-60:] for line in as_text.splitlines())
    # Offline, without the token (it is gone with the rollback's restart): the invocation is judged by its own.
    for text in (as_json, as_text):
        check = check_journal(text, host.gate, tp=host.service.tp)
        assert check.verdict is Verdict.FAIL, (check.state.reason, text[:300])
