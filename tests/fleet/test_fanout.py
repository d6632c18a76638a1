"""opsctl.fleet.fanout: every host's result or exception kept as data, in host order, hosts run side by side."""

from __future__ import annotations

import threading
import time

import pytest

from opsctl.errors import HostUnreachable
from opsctl.fleet.fanout import HostResult, run_on_hosts
from opsctl.inventory import HostConfig
from tests.builders import inventory

HOSTS = list(inventory(["h1", "h2", "h3", "h4"]).hosts.values())


def test_results_and_exceptions_in_host_order() -> None:
    def fn(h: HostConfig) -> str:
        time.sleep(0.05 if h.name == "h1" else 0.0)  # the first host finishes last
        if h.name == "h3":
            raise HostUnreachable("h3", "no route")
        return h.name.upper()

    results = run_on_hosts(HOSTS, fn, workers=4)
    assert [r.host for r in results] == ["h1", "h2", "h3", "h4"]
    assert [r.value for r in results if r.ok] == ["H1", "H2", "H4"]
    (failed,) = results.failed
    assert failed.host == "h3" and isinstance(failed.error, HostUnreachable)
    with pytest.raises(HostUnreachable, match="no route"):
        results.values()


def test_hosts_run_at_the_same_time_up_to_workers() -> None:
    barrier = threading.Barrier(4, timeout=5)  # breaks (raises) unless four calls are in flight together
    results = run_on_hosts(HOSTS, lambda h: barrier.wait(), workers=4)
    assert all(r.ok for r in results)
    running = 0
    peak = 0
    lock = threading.Lock()

    def count(h: HostConfig) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    run_on_hosts(HOSTS, count, workers=2)
    assert peak == 2


def test_one_host_runs_in_the_calling_thread_and_progress_is_in_order() -> None:
    seen: list[str] = []
    run_on_hosts(HOSTS[:1], lambda h: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]
    order: list[str] = []
    run_on_hosts(HOSTS, lambda h: time.sleep(0.04 if h.name == "h1" else 0), on_result=lambda r: order.append(r.host))
    assert order == ["h1", "h2", "h3", "h4"]


def test_unwrap() -> None:
    assert HostResult("h", value=3).unwrap() == 3
    with pytest.raises(KeyError):
        HostResult[int]("h", error=KeyError("x")).unwrap()
