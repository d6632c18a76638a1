"""rollback, restart and deploy refuse before they ask (issue 38): what the host shows (the lock held, nothing to
roll back to, an install opsctl does not manage, a release marked bad) ends the command before the confirmation
prompt. The host is read through the views' one read (replaced here by what a host would answer); the prompt is
never shown."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from opsctl import pipeline
from opsctl.cli import restart as cli_restart
from opsctl.host import views
from opsctl.host.history import parse_history
from opsctl.host.releaseroot import parse_snapshot

cli_main = importlib.import_module("opsctl.cli.main")

LOCK = 'lock_present=1\nlock={"user": "ana", "client": "laptop", "pid": 1, "command": "deploy r2"}\n'
PASSED = [{"event": "deploy", "release": "r000000000001", "verdict": "PASS", "at": "t1"}]


def _snapshot(*, managed: bool = True, current: str | None = "r000000000002", extra: str = "", releases=()) -> Any:
    text = ["root_exists=1", "unit.ActiveState=active"]
    if managed:
        text.append("managed={}")
    if current:
        text.append(f"current=/root/kdtree-engine/releases/{current}")
    text += [f"release={i} {r}" for i, r in enumerate(releases, 1)]
    return parse_snapshot("\n".join(text) + "\n" + extra)


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": {"address": "127.0.0.1"}}}))
    return path


@pytest.fixture
def no_prompt(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []

    def confirm(question: str, **_kw: Any) -> bool:
        asked.append(question)
        return False

    monkeypatch.setattr(typer, "confirm", confirm)
    return asked


def _host_shows(monkeypatch: pytest.MonkeyPatch, snap: Any, history: list[dict[str, Any]]) -> None:
    hist = parse_history("\n".join(json.dumps(d) for d in history))
    monkeypatch.setattr(views, "read_releases", lambda _h: views.ReleasesView(snap, hist, {}))


def _boom(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("the command ran although it should have refused")


@pytest.mark.parametrize(
    ("snap", "history", "code", "said"),
    [
        (_snapshot(releases=("r000000000002",)), [], 30, "nothing to roll back to"),
        (_snapshot(releases=("r000000000001", "r000000000002"), extra=LOCK), PASSED, 20, "lock is held by ana"),
        (_snapshot(managed=False, current=None), [], 30, "not managed by opsctl"),
    ],
    ids=["no target", "lock held", "unmanaged"],
)
def test_rollback_refuses_before_asking(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    inventory: Path,
    no_prompt: list[str],
    snap: Any,
    history: list[dict[str, Any]],
    code: int,
    said: str,
) -> None:
    _host_shows(monkeypatch, snap, history)
    monkeypatch.setattr(pipeline, "rollback", _boom)
    assert cli_main.main(["-i", str(inventory), "rollback", "h"]) == code
    assert no_prompt == [] and said in capsys.readouterr().err


def test_rollback_asks_naming_its_target(
    monkeypatch: pytest.MonkeyPatch, inventory: Path, no_prompt: list[str]
) -> None:
    _host_shows(monkeypatch, _snapshot(releases=("r000000000001", "r000000000002")), PASSED)
    monkeypatch.setattr(pipeline, "rollback", _boom)
    assert cli_main.main(["-i", str(inventory), "rollback", "h"]) == 1  # not confirmed
    assert no_prompt == ["Roll h back from r000000000002 to r000000000001 and restart it?"]


@pytest.mark.parametrize(
    ("snap", "code", "said"),
    [
        (_snapshot(extra=LOCK), 20, "lock is held by ana"),
        (_snapshot(current=None), 30, "no current release to restart"),
        (_snapshot(managed=False, current=None), 30, "not managed by opsctl"),
    ],
    ids=["lock held", "no current", "unmanaged"],
)
def test_restart_refuses_before_asking(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    inventory: Path,
    no_prompt: list[str],
    snap: Any,
    code: int,
    said: str,
) -> None:
    _host_shows(monkeypatch, snap, [])
    monkeypatch.setattr(pipeline, "restart", _boom)
    assert cli_main.main(["-i", str(inventory), "restart", "h"]) == code
    assert no_prompt == [] and said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("refusal", "error"),
    [("h: the deploy lock is held by ana", "LockHeld"), ("h: release r1 is marked bad there (FAIL)", "DeployFailed")],
)
def test_deploy_refuses_before_asking(
    monkeypatch: pytest.MonkeyPatch, inventory: Path, no_prompt: list[str], refusal: str, error: str
) -> None:
    """The deploy's dry run (the real preflight on the host) finds the refusal; the real run raises it, unasked."""
    from opsctl import errors

    calls: list[bool] = []

    def deploy(_h: Any, _tree: Path, opts: pipeline.DeployOptions, _rep: Any = None) -> pipeline.DeployResult:
        calls.append(opts.dry_run)
        if opts.dry_run:
            return pipeline.DeployResult("h", "deploy", "r1", verdict=pipeline.DeployVerdict.REFUSED, reason=refusal)
        raise getattr(errors, error)(refusal)

    monkeypatch.setattr(pipeline, "deploy", deploy)
    code = cli_main.main(["-i", str(inventory), "deploy", "h"])
    assert code == getattr(errors, error).exit_code and no_prompt == [] and calls == [True, False]


def test_the_checks_are_pure_over_what_the_host_showed() -> None:
    from tests import builders

    h = builders.host("h")
    target = cli_restart.check_rollback(
        h, _snapshot(releases=("r000000000001", "r000000000002")), parse_history(json.dumps(PASSED[0])), None, False
    )
    assert target == "r000000000001"
    cli_restart.check_restart(h, _snapshot())  # a managed host with a current release, no lock: nothing refused
