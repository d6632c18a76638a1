"""The CLI's pure renderers: log lines (shapes decoded, parity verdicts), release metadata."""

import io
import json

import pytest
from rich.console import Console

from opsctl import hostinfo
from opsctl.cli import deploy as cli_deploy
from opsctl.inventory import HostConfig

SHAPES = "[kdtree] shapes q=(9, 8, 576) kv_buf=(195012, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=21 scale=0.14468 mask=(270,)"
PARITY = "[2026-05-31 13:04:12 TP3] [kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00 tp=3"


def journal(msg: str) -> str:
    return json.dumps({"MESSAGE": msg, "__REALTIME_TIMESTAMP": "1780000000000000"})


@pytest.fixture
def out(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(cli_deploy, "console", Console(file=buf, width=200, color_system=None))
    return buf


def host() -> HostConfig:
    return HostConfig(name="h", address="127.0.0.1", gpu_arch=None)


def test_shapes_decoded_with_bug_warning(out: io.StringIO) -> None:
    p = cli_deploy._LogPrinter(host(), as_json=False, stream=False)
    p.feed(journal(SHAPES), cli_deploy._matcher("shapes"))
    p.feed(journal(PARITY), cli_deploy._matcher("shapes"))
    p.flush()
    text = out.getvalue()
    assert "kv_len_max=21" in text and "9 query tokens x 8 heads x 576" in text
    assert "classic marshaling bug" in text and "L56" not in text


def test_parity_table_with_verdicts(out: io.StringIO) -> None:
    p = cli_deploy._LogPrinter(host(), as_json=False, stream=False)
    for line in (PARITY, PARITY.replace("rel=1.0837e+00", "rel=1.0e-03"), "unrelated"):
        p.feed(journal(line), cli_deploy._matcher("parity"))
    p.flush()
    text = out.getvalue()
    assert "TP3" in text and "L56" in text and "FAIL" in text and "PASS" in text and "unrelated" not in text


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    p = cli_deploy._LogPrinter(host(), as_json=True, stream=False)
    p.feed(journal(PARITY), cli_deploy._matcher(None))
    p.feed(journal("[kdtree] L1 max_abs_diff=nan mean=nan rel=nan tp=0"), cli_deploy._matcher("parity"))
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert docs[0]["kind"] == "parity" and docs[0]["rank"] == 3 and docs[0]["verdict"] == "FAIL"
    assert docs[1]["rel"] == "nan" and docs[1]["verdict"] == "FAIL"


def test_regex_grep_and_bad_regex() -> None:
    m = cli_deploy._matcher("kv_len_max=2[01]")
    assert m(SHAPES, None) and not m(PARITY, None)
    with pytest.raises(cli_deploy.UsageError):
        cli_deploy._matcher("(")


def test_release_meta() -> None:
    text = '== r00000000000a\n "created_at": "2026-01-01T00:00:00Z",\n  "commit": "abc",\n  "dirty": true\n== r0-00000000000b\n'
    meta = hostinfo.parse_release_meta(text)
    assert meta["r00000000000a"] == {"created_at": "2026-01-01T00:00:00Z", "commit": "abc", "dirty": True}
    assert meta["r0-00000000000b"] == {}
