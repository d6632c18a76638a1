"""Inventory values that could reach a unit file, a shell or a URL: control characters, trailing newlines,
paths that are authorities, webhook URLs (validated, and never printed in full)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from opsctl.cli.common import to_jsonable
from opsctl.errors import InventoryError
from opsctl.health import alerts
from opsctl.health.probe import probe_params
from opsctl.inventory import load, parse
from opsctl.unit import unitfile as unit

REPO = Path(__file__).resolve().parents[2]
SECRET = "https://hooks.example.com/services/T000/B000/s3cr3tT0ken?key=abc"


def inventory(service: str = "", health: str = "") -> str:
    return textwrap.dedent(
        """\
        hosts:
          a:
            address: 10.0.0.1
            gpu_arch: null
            service:
              mode: sglang
        {service}
            health:
              on_calendar: "*:0/15"
        {health}
        """
    ).format(service=textwrap.indent(service, "      "), health=textwrap.indent(health, "      "))


def refused(text: str) -> str:
    with pytest.raises(InventoryError) as exc:
        parse(text, "inv.yaml")
    return exc.value.message


@pytest.mark.parametrize(
    ("service", "field"),
    [
        ('extra_args: ["--foo\\u0000ExecStartPre=/bin/sh -c id"]', "hosts.a.service.extra_args"),
        ('replay_args: ["--x\\rExecStartPre=/bin/true"]', "hosts.a.service.replay_args"),
        ('model_path: "/models/K\\u0000ExecStartPre=/bin/true"', "hosts.a.service.model_path"),
        ('environment_file: "/etc/k.env\\u0000ExecStartPre=/bin/true"', "hosts.a.service.environment_file"),
        ('speculative_algorithm: "DDTREE\\n"', "hosts.a.service.speculative_algorithm"),
        ('python: "/usr/bin/python3\\u007f"', "hosts.a.service.python"),
        ('model_path: "/models/K\\u0085x"', "hosts.a.service.model_path"),
    ],
)
def test_control_characters_are_refused_in_every_string(service: str, field: str) -> None:
    msg = refused(inventory(service=service))
    assert field in msg and ("control character" in msg or "not a safe name" in msg), msg
    assert msg.startswith("inv.yaml:")


def test_a_nul_that_reached_the_unit_file_would_have_added_a_directive() -> None:
    """Why the check exists: the rendered unit is line-based; systemd reads NUL/CR as line ends."""
    template = (REPO / unit.TEMPLATE_REL).read_text()
    good = parse(inventory(service='extra_args: ["--enable-metrics"]'), "inv.yaml").host("a")
    text = unit.render(template, good)
    assert "ExecStartPre" not in text and "--enable-metrics" in text


@pytest.mark.parametrize("name", ["a\n", "a\u0000"])
def test_trailing_newline_in_a_name_fails_the_full_match(name: str) -> None:
    text = inventory().replace("  a:\n", f"  {json.dumps(name)}:\n")
    assert "hosts." in refused(text)


@pytest.mark.parametrize(
    "path",
    ["@evil.example/health", "//evil.example/health", "health", "/h?x=1", "/h#f", "/a b", "/@evil.example/health"],
)
def test_http_path_must_be_a_path(path: str) -> None:
    msg = refused(inventory(health=f"http_path: {json.dumps(path)}"))
    assert "hosts.a.health.http_path" in msg and "URL path" in msg


def test_http_path_is_joined_as_the_path_of_the_local_url() -> None:
    host = parse(inventory(health='http_path: "/v1/health_generate"'), "inv.yaml").host("a")
    assert probe_params(host).http_url == "http://127.0.0.1:30000/v1/health_generate"


@pytest.mark.parametrize(
    "url",
    ["ftp://hooks.example.com/x", "https://", "hooks.example.com/x", "https://exa mple.com/x", "file:///etc/passwd"],
)
def test_webhook_must_be_http_with_a_host_and_is_never_echoed(url: str) -> None:
    msg = refused(inventory(health=f"alert_webhook: {json.dumps(url)}"))
    assert "hosts.a.health.alert_webhook" in msg and "http" in msg
    assert url not in msg.replace("http:// or https://", "")


def test_webhook_is_redacted_in_every_output() -> None:
    host = parse(inventory(health=f"alert_webhook: {json.dumps(SECRET)}"), "inv.yaml").host("a")
    hook = host.health.alert_webhook
    assert hook is not None and hook.get_secret_value() == SECRET
    for shown in (str(hook), repr(hook), repr(host), json.dumps(to_jsonable(host))):
        assert "s3cr3t" not in shown and "key=abc" not in shown
    assert str(hook) == "https://hooks.example.com/... (redacted)"


def test_a_failed_webhook_delivery_names_it_redacted() -> None:
    host = parse(inventory(health='alert_webhook: "http://127.0.0.1:9/hook/s3cr3t"'), "inv.yaml").host("a")
    alert = alerts.Alert(host="a", previous="ok", current="crit", summary="x", payload={})
    [delivery] = alerts.send(host, alert)
    assert not delivery.ok and delivery.error is not None
    assert "s3cr3t" not in delivery.error and "127.0.0.1" in delivery.error


@pytest.mark.parametrize("command", ["'unbalanced", ""])
def test_alert_command_must_split_into_a_program(command: str) -> None:
    msg = refused(inventory(health=f"alert_command: {json.dumps(command)}"))
    assert "hosts.a.health.alert_command" in msg


def test_on_calendar_is_checked_by_systemd_at_load(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory().replace('on_calendar: "*:0/15"', 'on_calendar: "every tuesday-ish"'))
    with pytest.raises(InventoryError, match=r"hosts\.a\.health\.on_calendar: 'every tuesday-ish' is not"):
        load(path)
    path.write_text(inventory())
    assert load(path).host("a").health.on_calendar == "*:0/15"
