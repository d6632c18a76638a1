"""Alert hook: tell someone when a host's health changes state, not on every run.

The last notified state of each host lives in a small JSON file on the machine running opsctl. ``decide`` (pure)
compares it with this run's results and returns the transitions to announce; ``deliver`` sends each one to the
host's ``health.alert_command`` (run without a shell, the JSON on stdin and the essentials in OPSCTL_ALERT_*
environment variables) and/or ``health.alert_webhook`` (HTTP POST of the JSON). A host's state is recorded only
once its alert went out, so a failed delivery is retried by the next run instead of being lost.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inventory import HostConfig, WebhookUrl
from ..inventory.fields import redacted_command
from .levels import HostHealth, Level
from .localstate import state_dir, write_atomic

DELIVERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Alert:
    host: str
    previous: str | None  # None: first time this host is seen
    current: str
    summary: str
    payload: dict[str, Any]


def decide(previous: Mapping[str, str], results: Sequence[HostHealth]) -> list[Alert]:
    """Transitions worth telling: any change of level; a host seen for the first time only when it is not OK."""
    alerts = []
    for r in results:
        now = r.level.value
        before = previous.get(r.host)
        if before == now or (before is None and r.level is Level.OK):
            continue
        failing = [f"{c.name}: {c.detail}" for c in r.checks if c.level in (Level.WARN, Level.CRIT)]
        summary = f"{r.host}: {(before or 'new').upper()} -> {now.upper()}" + (
            f" ({'; '.join(failing)})" if failing else ""
        )
        payload = {
            "source": "opsctl health",
            "reporter": socket.gethostname(),
            "host": r.host,
            "previous": before,
            "status": now,
            "summary": summary,
            "result": r.to_dict(),
        }
        alerts.append(Alert(r.host, before, now, summary, payload))
    return alerts


class AlertState:
    """host -> last announced level, in one JSON file written atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "alert-state.json"

    def load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            return {}  # a damaged file only means the next change is announced again
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def save(self, state: Mapping[str, str]) -> None:
        write_atomic(self.path, json.dumps(dict(sorted(state.items())), indent=1) + "\n", mode=0o600)


@dataclass(frozen=True)
class Delivery:
    alert: Alert
    target: str  # "command" / "webhook" / "none" / "error" (the hook itself crashed)
    ok: bool
    error: str | None = None


Sender = Callable[[HostConfig, Alert], list[Delivery]]


def send(host: HostConfig, alert: Alert) -> list[Delivery]:
    """Deliver one alert to whatever the host's inventory names. No target configured counts as delivered."""
    out: list[Delivery] = []
    body = json.dumps(alert.payload, sort_keys=True).encode()
    if host.health.alert_command:
        out.append(_run_command(host.health.alert_command, alert, body))
    if host.health.alert_webhook:
        out.append(_post_webhook(host.health.alert_webhook, alert, body))  # a WebhookUrl: prints redacted
    return out or [Delivery(alert, "none", True)]


def _run_command(command: str, alert: Alert, body: bytes) -> Delivery:
    env = {
        **os.environ,
        "OPSCTL_ALERT_HOST": alert.host,
        "OPSCTL_ALERT_STATUS": alert.current,
        "OPSCTL_ALERT_PREVIOUS": alert.previous or "",
        "OPSCTL_ALERT_SUMMARY": alert.summary,
    }
    try:
        r = subprocess.run(shlex.split(command), input=body, env=env, capture_output=True, timeout=DELIVERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return Delivery(alert, "command", False, f"{redacted_command(command)}: {e}")
    if r.returncode != 0:
        # The command is named by its program only: its arguments may hold a secret (as `hosts --json` shows it).
        tail = r.stderr.decode(errors="replace").strip()[-200:]
        return Delivery(alert, "command", False, f"{redacted_command(command)} exited {r.returncode}: {tail}")
    return Delivery(alert, "command", True)


def _post_webhook(url: WebhookUrl, alert: Alert, body: bytes) -> Delivery:
    """POST the alert. Every message names the URL redacted (``str(url)``): the real one may hold a token, and a
    library error can quote any part of it, so the error text is scrubbed of every part (:func:`redact`).
    Whatever goes wrong (http.client's InvalidURL is neither an OSError nor a ValueError) is a failed delivery,
    never an exception: the alert state and ``--rollback-on-fail`` come after the delivery."""
    secret = url.get_secret_value()
    try:
        req = urllib.request.Request(secret, data=body, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=DELIVERY_TIMEOUT_S) as resp:
            resp.read(1024)
    except urllib.error.HTTPError as e:
        return Delivery(alert, "webhook", False, f"{url}: HTTP {e.code}")
    except Exception as e:  # any library failure is a failed delivery, reported redacted
        return Delivery(alert, "webhook", False, f"{url}: {redact(f'{type(e).__name__}: {e}', [secret])}")
    return Delivery(alert, "webhook", True)


def secret_parts(url: str) -> list[str]:
    """The pieces of a webhook URL that may be secret, longest first: the whole URL, its authority (user and
    password included), the user, the password, the path and the query. A library error quotes any of them."""
    try:
        parts = urllib.parse.urlsplit(url)
        pieces = [url, parts.netloc, parts.username or "", parts.password or "", parts.path, parts.query]
    except ValueError:
        pieces = [url]
    # A piece of one or two characters ('/', 'a') would blank out the message, not a secret.
    return sorted({p for p in pieces if len(p) > 2}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret part of each webhook URL in ``secrets`` replaced by ``<redacted>``."""
    for piece in sorted({p for s in secrets for p in secret_parts(s)}, key=len, reverse=True):
        text = text.replace(piece, "<redacted>")
    return text


def webhook_secrets(hosts: Iterable[HostConfig]) -> list[str]:
    """Every host's webhook URL (the raw values :func:`redact` scrubs from an error)."""
    return [h.health.alert_webhook.get_secret_value() for h in hosts if h.health.alert_webhook is not None]


def notify(
    hosts: Mapping[str, HostConfig],
    results: Sequence[HostHealth],
    state: AlertState | None = None,
    sender: Sender = send,
) -> list[Delivery]:
    """Announce state changes and record the states that were announced (or needed no announcement)."""
    state = state or AlertState()
    previous = state.load()
    deliveries: list[Delivery] = []
    new_state = dict(previous)
    announced = {a.host: a for a in decide(previous, results)}
    for r in results:
        alert = announced.get(r.host)
        if alert is None:
            new_state[r.host] = r.level.value
            continue
        try:
            sent = sender(hosts[r.host], alert)
        except Exception as e:  # one host's broken hook must not stop the others or the state
            why = redact(f"{type(e).__name__}: {e}", webhook_secrets([hosts[r.host]]))
            sent = [Delivery(alert, "error", False, f"alert hook crashed: {why}")]
        deliveries.extend(sent)
        if all(d.ok for d in sent):
            new_state[r.host] = r.level.value
    if new_state != previous:
        state.save(new_state)
    return deliveries
