"""Alert hook: fires on a change of state only; a failed delivery is retried next run."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from opsctl.alerts import Alert, AlertState, Delivery, decide, notify, send
from opsctl.health import HostHealth, evaluate

from .hosts import inventory
from .test_health_eval import REPLAY, healthy


def run_of(levels: dict[str, str]) -> tuple[dict, list[HostHealth]]:  # type: ignore[type-arg]
    inv = inventory(dict.fromkeys(levels, REPLAY))
    facts = {"ok": {}, "warn": {"parity": ()}, "crit": {"disk_free_mb": 1.0}}
    results = [evaluate(inv.hosts[h], healthy(host=h, **facts[lv])) for h, lv in levels.items()]  # type: ignore[arg-type]
    return inv.hosts, results


def test_decide_only_changes() -> None:
    _, res = run_of({"a": "ok", "b": "crit", "c": "warn"})
    alerts = decide({"a": "ok", "b": "ok", "c": "warn"}, res)
    assert [(a.host, a.previous, a.current) for a in alerts] == [("b", "ok", "crit")]
    assert "disk" in alerts[0].summary


def test_first_sight_alerts_only_when_not_ok() -> None:
    _, res = run_of({"a": "ok", "b": "warn"})
    assert [a.host for a in decide({}, res)] == ["b"]


def test_recovery_is_announced() -> None:
    _, res = run_of({"a": "ok"})
    (alert,) = decide({"a": "crit"}, res)
    assert alert.current == "ok" and alert.payload["previous"] == "crit"


def test_notify_fires_once_per_change_and_retries_failed_delivery(tmp_path: Path) -> None:
    state = AlertState(tmp_path / "alert-state.json")
    sent: list[Alert] = []
    fail = {"now": True}

    def sender(_host, alert):  # type: ignore[no-untyped-def]
        sent.append(alert)
        return [Delivery(alert, "command", not fail["now"], "boom" if fail["now"] else None)]

    hosts, crit = run_of({"a": "crit"})
    notify(hosts, crit, state, sender)  # delivery fails: state not recorded
    assert state.load() == {}
    fail["now"] = False
    notify(hosts, crit, state, sender)  # retried and delivered
    notify(hosts, crit, state, sender)  # same state: nothing
    assert [a.current for a in sent] == ["crit", "crit"]
    assert state.load() == {"a": "crit"}
    _, ok = run_of({"a": "ok"})
    notify(hosts, ok, state, sender)
    assert [a.current for a in sent] == ["crit", "crit", "ok"]


def test_alert_command_gets_json_on_stdin_and_env(tmp_path: Path) -> None:
    out = tmp_path / "alert.json"
    script = tmp_path / "hook.py"
    script.write_text(
        "import json, os, sys\n"
        f"doc = json.load(sys.stdin); doc['env_status'] = os.environ['OPSCTL_ALERT_STATUS']\n"
        f"open({str(out)!r}, 'w').write(json.dumps(doc))\n"
    )
    _hosts, res = run_of({"a": "crit"})
    h = inventory({"a": {**REPLAY, "health": {"alert_command": f"{sys.executable} {script}"}}}).hosts["a"]
    (alert,) = decide({}, res)
    (d,) = send(h, alert)
    assert d.ok, d.error
    doc = json.loads(out.read_text())
    assert doc["host"] == "a" and doc["status"] == "crit" and doc["env_status"] == "crit"


def test_failing_alert_command_reports_rc() -> None:
    _hosts, res = run_of({"a": "crit"})
    h = inventory({"a": {**REPLAY, "health": {"alert_command": "false"}}}).hosts["a"]
    (d,) = send(h, decide({}, res)[0])
    assert not d.ok and "exited 1" in (d.error or "")


def test_webhook_receives_posted_json() -> None:
    got: list[dict] = []  # type: ignore[type-arg]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append({"ctype": self.headers["Content-Type"], **json.loads(body)})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        _hosts, res = run_of({"a": "warn"})
        h = inventory({"a": {**REPLAY, "health": {"alert_webhook": url}}}).hosts["a"]
        (d,) = send(h, decide({}, res)[0])
        assert d.ok, d.error
        assert got[0]["ctype"] == "application/json" and got[0]["status"] == "warn"
        # a dead endpoint is a failed delivery, not an exception
        server.shutdown()
        server.server_close()
        (d2,) = send(h, decide({}, res)[0])
        assert not d2.ok
    finally:
        server.server_close()
