"""Alert hook: fires on a change of state only; a failed delivery is retried next run."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from opsctl.errors import InventoryError
from opsctl.health.alerts import Alert, AlertState, Delivery, _post_webhook, decide, notify, redact, send
from opsctl.health.checks import evaluate
from opsctl.health.levels import HostHealth
from opsctl.inventory import WebhookUrl
from tests.builders import inventory
from tests.health.test_health_eval import REPLAY, healthy


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


SECRET_URL = "https://ops:SECRETPASS@hooks.example.com/hook"


def test_webhook_with_userinfo_is_refused_at_load_naming_host_and_field_never_the_password() -> None:
    for url in (SECRET_URL, "https://ops@hooks.example.com/hook", "https://hooks.example.com:SECRETPASS/x"):
        with pytest.raises(InventoryError) as e:
            inventory({"web1": {**REPLAY, "health": {"alert_webhook": url}}})
        assert "hosts.web1.health.alert_webhook" in e.value.message
        assert "SECRETPASS" not in e.value.message and "ops" not in e.value.message.split(": ", 2)[-1]


def test_every_webhook_delivery_failure_is_a_redacted_failed_delivery() -> None:
    """A URL the inventory would refuse (built by hand here) makes urllib raise http.client.InvalidURL, which is
    neither an OSError nor a ValueError: it is a failed delivery, and no part of the secret is in its error."""
    _hosts, res = run_of({"a": "crit"})
    alert = decide({}, res)[0]
    for url in (
        SECRET_URL,
        "https://hooks.example.com:99999999/TOKEN123/x",
        "http://127.0.0.1:1/TOKEN123?k=QUERYSECRET",
    ):
        d = _post_webhook(WebhookUrl(url), alert, b"{}")
        assert not d.ok and d.target == "webhook" and d.error
        for secret in ("SECRETPASS", "TOKEN123", "QUERYSECRET", "ops:"):
            assert secret not in d.error, d.error


def test_redact_scrubs_every_part_of_the_url() -> None:
    text = "nonnumeric port: 'SECRETPASS@hooks.example.com' for https://ops:SECRETPASS@hooks.example.com/hook"
    out = redact(text, [SECRET_URL])
    assert "SECRETPASS" not in out and "/hook" not in out and "<redacted>" in out


def test_a_crashing_alert_hook_is_a_failed_delivery_and_the_other_hosts_state_is_saved(tmp_path: Path) -> None:
    state = AlertState(tmp_path / "alert-state.json")
    hosts, res = run_of({"a": "crit", "b": "warn"})

    def sender(host, alert):  # type: ignore[no-untyped-def]
        if alert.host == "a":
            raise http.client.InvalidURL("nonnumeric port: 'SECRETPASS@hooks.example.com'")
        return [Delivery(alert, "command", True)]

    deliveries = notify(hosts, res, state, sender)
    failed = [d for d in deliveries if not d.ok]
    assert [(d.alert.host, d.target) for d in failed] == [("a", "error")]
    assert "InvalidURL" in (failed[0].error or "")
    assert state.load() == {"b": "warn"}  # a's alert is retried next run; b's was delivered and recorded
