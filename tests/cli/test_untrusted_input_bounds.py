"""Secrets and bounds of what opsctl reads (issue 47 item 11): the parity token from a file or stdin, never argv;
no secret in a refusal; every inventory value and every comparison sample checked in time and memory linear in its
size, with a cap checked before the work; each refusal names the file, the line and the field, exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.cli.compare import MAX_SAMPLE_BYTES
from opsctl.errors import InventoryError
from opsctl.health import alerts
from opsctl.inventory import loader
from opsctl.inventory.fields import MAX_ALERT_COMMAND_CHARS
from tests.cli.test_untrusted_text import _opsctl
from tests.comparison.test_compare import side

TOKEN = "0123456789abcdef0123456789abcdef"
J = "2026-05-31T13:04:12+0000 ct200 python[22251]: "
SECRET = "SUPERSECRET123"


def _passing_journal(tmp_path: Path) -> Path:
    lines = [
        f"{J}[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp=0 token={TOKEN}"
        for layer in (0, 30, 60)
    ]
    path = tmp_path / "journal.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------ the token, never in argv


def test_parity_check_takes_the_token_from_a_file_or_stdin(tmp_path: Path) -> None:
    src = _passing_journal(tmp_path)
    env = tmp_path / "parity.env"
    env.write_text(f"# written by opsctl\nKDTREE_PARITY_TOKEN={TOKEN}\n")
    bare = tmp_path / "token"
    bare.write_text(TOKEN + "\n")
    for args, stdin in (((env,), None), ((bare,), None), (("-",), f"KDTREE_PARITY_TOKEN={TOKEN}\n")):
        r = _opsctl("parity", "check", src, "--tp", "1", "--token-file", *args, stdin=stdin)
        assert r.returncode == 0 and "token checked (given)" in r.stdout, r.stdout + r.stderr
    # Another token: the lines are not this invocation's, nothing counts.
    other = tmp_path / "other.env"
    other.write_text("KDTREE_PARITY_TOKEN=ffffffffffffffff\n")
    assert _opsctl("parity", "check", src, "--tp", "1", "--token-file", other).returncode == 31


def test_a_bad_token_file_is_refused_without_its_content(tmp_path: Path) -> None:
    src = _passing_journal(tmp_path)
    junk = tmp_path / "junk.env"
    junk.write_text(f"SOMETHING_ELSE={SECRET}\n")
    r = _opsctl("parity", "check", src, "--token-file", junk)
    assert r.returncode == 2 and "holds no token" in r.stderr and SECRET not in r.stdout + r.stderr
    both = _opsctl("parity", "check", "-", "--token-file", "-", stdin="")
    assert both.returncode == 2 and "the journal is already on stdin" in both.stderr
    twice = _opsctl("parity", "check", src, "--token", TOKEN, "--token-file", junk)
    assert twice.returncode == 2 and "give one of them" in twice.stderr
    missing = _opsctl("parity", "check", src, "--token-file", tmp_path / "nope")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_the_docs_pass_the_token_as_a_file() -> None:
    repo = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/gate.md"):
        text = (repo / doc).read_text()
        assert '--token "$(' not in text and '--token "$TOKEN"' not in text, doc
        assert "--token-file" in text, doc


# ------------------------------------------------------------------------------------------- the inventory


def _inventory(tmp_path: Path, health: dict[str, object]) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"a": {"address": "127.0.0.1", "health": health}}}, width=1 << 30))
    return path


def test_a_1mb_alert_command_is_refused_in_under_a_second_without_its_value(tmp_path: Path) -> None:
    path = _inventory(tmp_path, {"alert_command": f"/bin/notify --token={SECRET} " + "x" * 1_000_000})
    start = time.thread_time()  # CPU time: three test workers share two cores in CI
    with pytest.raises(InventoryError) as e:
        loader.load(path)
    elapsed = time.thread_time() - start
    assert elapsed < 1.0, elapsed
    assert f"{path}:" in e.value.message and "health.alert_command" in e.value.message
    assert f"at most {MAX_ALERT_COMMAND_CHARS:,}" in e.value.message and SECRET not in e.value.message
    # At the cap, a long word (shlex is quadratic in a word's length) still checks at once.
    ok = _inventory(tmp_path, {"alert_command": "/bin/notify " + "x" * (MAX_ALERT_COMMAND_CHARS - 12)})
    start = time.thread_time()
    loader.load(ok)
    assert time.thread_time() - start < 1.0


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (f"/bin/notify --x={SECRET};", "contains shell syntax (';')"),
        (f"TOKEN={SECRET} /bin/notify", "starts with a variable assignment (TOKEN=...)"),
        (f"/bin/notify '{SECRET}", "does not split into words"),
    ],
)
def test_an_alert_command_refusal_never_echoes_the_command(tmp_path: Path, command: str, said: str) -> None:
    path = _inventory(tmp_path, {"alert_command": command})
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "-i", str(path), "hosts", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert f"{path}:5: hosts.a.health.alert_command" in r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_a_failed_alert_names_its_program_only() -> None:
    alert = alerts.Alert(host="h1", previous="ok", current="crit", summary="s", payload={})
    delivery = alerts._run_command(f"/nonexistent/notify --token={SECRET}", alert, b"{}")
    assert not delivery.ok and SECRET not in (delivery.error or "") and "/nonexistent/notify" in (delivery.error or "")


def test_an_overlong_on_calendar_is_refused_before_systemd_analyze(tmp_path: Path) -> None:
    path = _inventory(tmp_path, {"on_calendar": "x" * 200_000})
    with pytest.raises(InventoryError) as e:
        loader.load(path)
    assert e.value.message.startswith(f"{path}:5: hosts.a.health.on_calendar: 200,000 characters")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_a_bad_on_calendar_names_its_line_and_systemds_words_escaped(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(
        "defaults:\n  address: 127.0.0.1\n  health:\n    on_calendar: 'Mon \u202e 99:99'\nhosts:\n  a: {}\n"
    )
    with pytest.raises(InventoryError) as e:
        loader.load(path)
    assert e.value.message.startswith(f"{path}:4: defaults.health.on_calendar: ")
    assert "\u202e" not in e.value.message and "\\u202e" in e.value.message


# ---------------------------------------------------------------------------------------- comparison samples


def _sample(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_sample_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    good = _sample(tmp_path, "old.json", json.dumps(side().to_json()))
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: 250 MiB of nothing, refused by its size alone
        f.truncate(250 * 2**20)
    start = time.perf_counter()
    r = _opsctl("compare", good, big)
    assert r.returncode == 2 and f"larger than {MAX_SAMPLE_BYTES // 2**20} MiB" in r.stderr, r.stderr
    assert time.perf_counter() - start < 10


def test_a_key_given_twice_is_refused_with_its_line_and_field(tmp_path: Path) -> None:
    good = _sample(tmp_path, "old.json", json.dumps(side().to_json()))
    doc = json.dumps(side().to_json(), indent=1)
    forged = doc[:-2] + ',\n "requests": []\n}'
    line = forged[: forged.rindex('"requests"')].count("\n") + 1
    r = _opsctl("compare", good, _sample(tmp_path, "dup.json", forged))
    assert r.returncode == 2 and f"dup.json:{line}: requests: the key is given twice" in r.stderr, r.stderr
    inner = doc.replace('"error": null', '"error": null, "error": "x"', 1)
    r = _opsctl("compare", good, _sample(tmp_path, "inner.json", inner))
    assert r.returncode == 2 and "requests[0].error: the key is given twice" in r.stderr, r.stderr


def test_an_integer_of_over_4300_digits_is_exit_2_naming_its_field(tmp_path: Path) -> None:
    good = _sample(tmp_path, "old.json", json.dumps(side().to_json()))
    doc = side().to_json()
    text = json.dumps(doc, indent=1).replace('"status": null', '"status": ' + "9" * 5000, 1)
    r = _opsctl("compare", good, _sample(tmp_path, "long.json", text))
    assert r.returncode == 2, r.stderr
    assert "long.json:" in r.stderr and "requests[0].status: a number of more than 4300 digits" in r.stderr
    assert "Traceback" not in r.stderr and "ValueError" not in r.stderr
