"""One way to run something on many hosts at once: ``run_on_hosts(hosts, fn, workers)``.

Each host's result, or the exception its call raised, is kept as data in a :class:`HostResult`, in the order the
hosts were given (the shape of Fabric's ``GroupResult``); one host's failure never loses another's result. ``fn``
gets the host and decides everything per host (which command, which timeout): nothing is shared but the pool.
``ping``, ``health`` and the roll-out's parallel batches all fan out through here (docs/ssh.md says why this is
not Fabric's ThreadingGroup).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..inventory import HostConfig

T = TypeVar("T")
DEFAULT_WORKERS = 16


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """One host's outcome: ``value`` when ``fn`` returned, ``error`` when it raised."""

    host: str
    value: T | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> T:
        """The value; the host's exception is raised again here."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


@dataclass(frozen=True)
class HostResults(Generic[T]):
    """Every host's :class:`HostResult`, in the order the hosts were given."""

    results: tuple[HostResult[T], ...]

    def __iter__(self) -> Iterator[HostResult[T]]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> tuple[HostResult[T], ...]:
        return tuple(r for r in self.results if not r.ok)

    def values(self) -> list[T]:
        """Every host's value, in order; the first host's exception, if any, is raised instead."""
        return [r.unwrap() for r in self.results]


def _call(fn: Callable[[HostConfig], T], host: HostConfig) -> HostResult[T]:
    try:
        return HostResult(host.name, value=fn(host))
    except Exception as e:  # kept as that host's result; KeyboardInterrupt and SystemExit still stop everything
        return HostResult(host.name, error=e)


def run_on_hosts(
    hosts: Sequence[HostConfig],
    fn: Callable[[HostConfig], T],
    *,
    workers: int = DEFAULT_WORKERS,
    on_result: Callable[[HostResult[T]], None] | None = None,
    thread_name_prefix: str = "opsctl",
) -> HostResults[T]:
    """Call ``fn(host)`` for every host, up to ``workers`` at a time; one host (or ``workers=1``) runs in the
    calling thread. ``on_result`` sees each result in host order as soon as it and those before it are done
    (for progress lines)."""
    if len(hosts) <= 1 or workers <= 1:
        results = []
        for host in hosts:
            results.append(_call(fn, host))
            if on_result is not None:
                on_result(results[-1])
        return HostResults(tuple(results))
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts)), thread_name_prefix=thread_name_prefix) as pool:
        futures: list[Future[HostResult[T]]] = [pool.submit(_call, fn, host) for host in hosts]
        ordered = []
        for future in futures:
            ordered.append(future.result())
            if on_result is not None:
                on_result(ordered[-1])
    return HostResults(tuple(ordered))
