"""Replay service: SGLang-shaped verify batches through the backend's verify path, checked against an
independent dense attention, printing the same ``[kdtree]`` lines as the server.

    PYTHONPATH=<release>/kernel:<release>/backend python3 -m kdtree_backend.replay --steps 0

Needs only torch and this release's ``kernel/`` and ``backend/`` packages (no SGLang). On CUDA the verify path
is the kernel (the reference, with a ``fallback`` line, when the extension is not built); on CPU it is the
reference. Used as the unit's program on testbed hosts (``--steps 0``: forever, SIGTERM ends it cleanly) and as
the pre-restart parity check on GPU hosts (``--steps N --threshold REL``: exit 0 when every parity line is
within the threshold, 3 otherwise). ``--captures DIR`` replays stored captures of real verify calls instead
(:mod:`kdtree_backend.replay_captures`, docs/capture.md); the service itself captures when armed
(:mod:`kdtree_backend.capture`), as the server does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

import torch

from .batch import VerifyBatch, dense_verify_attention, make_verify_batch
from .capture import Capturer
from .config import ConfigError, ReplayConfig, load_config
from .lines import OncePer, ParityIdentity, emit, format_fallback, format_parity, write_line
from .verify import VerifyMetadata, attend, kernel_usable, marshal_verify, parity_stats, shapes_line, shapes_signature
from .wire import REPLAY_EXIT_OK, REPLAY_EXIT_PARITY_FAILED, REPLAY_EXIT_USAGE

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# (rank, (max_abs_diff, mean, rel)) -> the stats to print, or None to print no parity line: the stand-in
# server's injected faults (kdtree_backend.serve); the replay itself prints what it measured.
ParityFilter = Callable[[int, tuple[float, float, float]], tuple[float, float, float] | None]


@dataclass(frozen=True)
class ReplaySettings:
    steps: int
    interval_s: float
    bs: int
    prefix: int
    q_len: int
    heads: int
    layers: tuple[int, ...]
    every_n_steps: int
    device: str
    dtype: str
    tree: str
    seed: int
    threshold: float | None
    tp_size: int = 1


@dataclass
class ReplayOutcome:
    steps_done: int = 0
    parity_lines: int = 0
    worst_rel: float = 0.0
    over_threshold: int = 0


def verdict_exit_code(outcome: ReplayOutcome, threshold: float | None) -> int:
    """Exit status of a finite run: 3 when a threshold was given and a parity line exceeded it (or none ran)."""
    if threshold is None:
        return REPLAY_EXIT_OK
    if outcome.parity_lines == 0 or outcome.over_threshold > 0:
        return REPLAY_EXIT_PARITY_FAILED
    return REPLAY_EXIT_OK


def _layers_arg(raw: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(item) for item in raw.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers wants comma-separated layer ids, got {raw!r}") from None
    if not layers or any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"--layers wants non-negative layer ids, got {raw!r}")
    return layers


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {raw}")
    return value


def build_parser(defaults: ReplayConfig) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kdtree_backend.replay",
        description="Replay SGLang-shaped DDTree verify batches through the kdtree verify path and print "
        "[kdtree] shapes/parity lines (parity against an independent dense attention).",
    )
    parser.add_argument("--steps", type=int, default=0, help="verify steps to run; 0 = run until SIGTERM")
    parser.add_argument("--interval", type=float, default=defaults.interval_s, help="seconds between steps")
    parser.add_argument("--bs", type=_positive, default=defaults.bs, help="requests per batch")
    parser.add_argument("--prefix", type=_positive, default=defaults.prefix, help="longest prefix (ragged)")
    parser.add_argument("--q-len", type=_positive, default=defaults.q_len, help="draft tokens per request")
    parser.add_argument("--heads", type=_positive, default=defaults.heads, help="query heads (per TP rank)")
    parser.add_argument("--layers", type=_layers_arg, default=defaults.layers, help="layer ids to replay, e.g. 0,30,60")
    parser.add_argument("--every", type=_positive, default=defaults.every_n_steps, help="parity every N steps")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=defaults.dtype)
    parser.add_argument("--tree", choices=("tree", "chain", "star"), default=defaults.tree)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tp-size",
        type=_positive,
        default=1,
        help="tensor-parallel ranks to stand in for: each prints its own parity lines (tp=0..N-1), as the "
        "server's ranks do",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="with --steps N: exit 0 if every parity rel <= REL, else exit 3 (pre-restart parity check)",
    )
    parser.add_argument(
        "--captures",
        type=Path,
        default=None,
        metavar="DIR",
        help="replay the stored captures under DIR (<root>/state/capture, one capture, or one call) with this "
        "release and print one parity line per call; with --threshold, exit 3 when one exceeds it",
    )
    return parser


def resolve_device(raw: str) -> torch.device:
    if raw == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(raw)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {raw}: CUDA is not available on this host; use --device cpu")
    return device


def settings_from_args(args: argparse.Namespace) -> ReplaySettings:
    if args.steps < 0:
        raise ValueError(f"--steps must be >= 0, got {args.steps}")
    if args.interval < 0:
        raise ValueError(f"--interval must be >= 0, got {args.interval}")
    if args.threshold is not None and args.steps == 0:
        raise ValueError("--threshold needs a finite --steps N (it decides the exit status at the end)")
    return ReplaySettings(
        steps=args.steps,
        interval_s=args.interval,
        bs=args.bs,
        prefix=args.prefix,
        q_len=args.q_len,
        heads=args.heads,
        layers=args.layers,
        every_n_steps=args.every,
        device=args.device,
        dtype=args.dtype,
        tree=args.tree,
        seed=args.seed,
        threshold=args.threshold,
        tp_size=args.tp_size,
    )


class ReplayService:
    """One verify step per call of :meth:`step`: build a batch, run every layer, print lines. Also the verify
    path of the stand-in server (kdtree_backend.serve), one step per decode step of a request."""

    def __init__(
        self,
        settings: ReplaySettings,
        device: torch.device,
        use_kernel: bool,
        *,
        sink: Callable[[str], None] = emit,
        capture: bool | None = None,
        parity_filter: ParityFilter | None = None,
    ) -> None:
        self.settings = settings
        self.device = device
        self.use_kernel = use_kernel
        self.sink = sink
        self.parity_filter = parity_filter
        self.shapes_once = OncePer(sink)
        self.outcome = ReplayOutcome()
        self.identities = [ParityIdentity.from_env(tp=rank) for rank in range(settings.tp_size)]
        # A service (the replay with --steps 0, the stand-in server) captures when armed, one capturer per rank
        # it stands in for; a one-shot check run from a new release never does.
        if capture is None:
            capture = settings.steps == 0
        self.capturers = [
            Capturer.from_environment(tp=rank) if capture else Capturer(None, release="", tp=rank)
            for rank in range(settings.tp_size)
        ]

    def step(self, index: int, parity_layers: Collection[int] | None = None) -> None:
        """Verify step ``index`` on every rank. ``parity_layers``: the layers checked against the dense
        attention on this step (default: all of them every ``every_n_steps`` steps)."""
        if parity_layers is None:
            parity_layers = self.settings.layers if index % self.settings.every_n_steps == 0 else ()
        for identity in self.identities:
            self._rank_step(index, identity, parity_layers)
        self.outcome.steps_done += 1

    def _rank_step(self, index: int, identity: ParityIdentity, parity_layers: Collection[int]) -> None:
        """One rank's share of a verify step: its own heads (its own random batch), its own lines."""
        s = self.settings
        batch = make_verify_batch(
            bs=s.bs,
            prefix=s.prefix,
            q_len=s.q_len,
            heads=s.heads,
            layers=s.layers,
            tree=s.tree,
            dtype=DTYPES[s.dtype],
            device=self.device,
            seed=s.seed * 1_000_003 + index + 104_729 * identity.tp,
        )
        meta = marshal_verify(
            batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, s.q_len
        )
        capturing = self.begin_capture(index, identity, batch, meta)
        for layer in s.layers:
            self.verify_layer(identity, batch, meta, layer, parity=layer in parity_layers, capturing=capturing)

    def begin_capture(self, index: int, identity: ParityIdentity, batch: VerifyBatch, meta: VerifyMetadata) -> bool:
        """Whether rank ``identity.tp`` captures verify step ``index`` (armed, and the capture wants it)."""
        capturer = self.capturers[identity.tp]
        return capturer.armed() and capturer.begin_step(
            step=index, kv_indptr=batch.kv_indptr, kv_indices=batch.kv_indices, out_cache_loc=batch.out_cache_loc,
            custom_mask=batch.custom_mask, mask_indptr=batch.mask_indptr, qo_indptr=batch.qo_indptr,
            key_indptr=meta.key_indptr, keys=meta.keys, draft_mask=meta.draft_mask, bs=batch.bs, q_len=batch.q_len,
        )  # fmt: skip

    def verify_layer(
        self,
        identity: ParityIdentity,
        batch: VerifyBatch,
        meta: VerifyMetadata,
        layer: int,
        *,
        parity: bool,
        capturing: bool = False,
        reference: VerifyBatch | None = None,
    ) -> torch.Tensor:
        """One layer's verify attention on one rank through the backend's path (``batch.q[layer]`` over
        ``batch.kv_buffers[layer]``, marshaled as ``meta``): its output ``[T, H, Dl]``, the shapes line once per
        signature and, with ``parity``, the parity line against the independent dense attention (over
        ``reference`` when given: the same step in a smaller pool). The stand-in server's model calls this once
        per layer and rank of each decode step."""
        q, kv_buffer = batch.q[layer], batch.kv_buffers[layer]
        out = attend(q, kv_buffer, meta, batch.qo_indptr, batch.sm_scale, use_kernel=self.use_kernel)
        capturer = self.capturers[identity.tp]
        if capturing and capturer.wants(layer):
            capturer.record(layer, q, kv_buffer, out, batch.sm_scale)
        signature = shapes_signature(q, kv_buffer, batch.bs, batch.q_len, batch.sm_scale)
        self.shapes_once(
            signature,
            lambda: shapes_line(q, kv_buffer, meta, batch.bs, int(batch.mask_indptr[-1]), batch.sm_scale),
        )
        if parity:
            dense = dense_verify_attention(batch if reference is None else reference, layer)
            stats: tuple[float, float, float] | None = parity_stats(out, dense)
            if self.parity_filter is not None:
                stats = self.parity_filter(identity.tp, stats)
            if stats is not None:
                max_abs, mean, rel = stats
                self.sink(format_parity(layer, max_abs, mean, rel, identity))
                self._record(rel)
        return out

    def _record(self, rel: float) -> None:
        outcome = self.outcome
        outcome.parity_lines += 1
        outcome.worst_rel = max(outcome.worst_rel, rel)
        if self.settings.threshold is not None and not rel <= self.settings.threshold:
            outcome.over_threshold += 1


def run(settings: ReplaySettings, stop: threading.Event) -> ReplayOutcome:
    device = resolve_device(settings.device)
    if device.type == "cpu":
        # Small batches gain nothing from intra-op threads, and testbed hosts share a few cores between units.
        torch.set_num_threads(1)
    usable, reason = kernel_usable(device)
    if not usable:
        emit(format_fallback(reason, path="reference", device=device.type))
    write_line(
        f"kdtree-replay: started device={device} path={'kernel' if usable else 'reference'} bs={settings.bs} "
        f"prefix={settings.prefix} q_len={settings.q_len} H={settings.heads} layers={list(settings.layers)} "
        f"steps={settings.steps or 'forever'}"
    )
    service = ReplayService(settings, device, use_kernel=usable)
    index = 0
    while not stop.is_set() and (settings.steps == 0 or index < settings.steps):
        with torch.inference_mode():
            service.step(index)
        index += 1
        if settings.steps and index >= settings.steps:
            break
        stop.wait(settings.interval_s)
    return service.outcome


def stop_on_signals(prefix: str) -> threading.Event:
    """An event set by SIGTERM or SIGINT (said on stdout under ``prefix``): the services stop cleanly on it."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        write_line(f"{prefix} {signal.Signals(signum).name} received, stopping")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def exit_without_teardown(code: int) -> NoReturn:
    """Leave at once with ``code``, stdout and stderr flushed, skipping the interpreter's teardown: with torch loaded
    it costs 0.5-0.75 s of CPU (on a testbed host: ``import torch`` and exit, 1.7-2.2 s; with ``os._exit``,
    1.2-1.3 s), paid by every deploy's pre-restart replay and by every stop of the stand-in server, on hosts whose
    cores the other steps share. The programs close what they write before their ``main`` returns (the capture
    writer is a daemon thread, which a normal exit does not wait for either)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load_config()
    except ConfigError as exc:
        write_line(f"kdtree-replay: bad configuration: {exc}", stderr=True)
        return REPLAY_EXIT_USAGE
    args = build_parser(config.replay).parse_args(argv)
    if args.captures is not None:
        from .replay_captures import run_cli

        try:
            return run_cli(args.captures, resolve_device(args.device), args.threshold)
        except ValueError as exc:
            write_line(f"kdtree-replay: {exc}", stderr=True)
            return REPLAY_EXIT_USAGE
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        write_line(f"kdtree-replay: {exc}", stderr=True)
        return REPLAY_EXIT_USAGE

    stop = stop_on_signals("kdtree-replay:")
    started = time.monotonic()
    try:
        outcome = run(settings, stop)
    except ValueError as exc:
        write_line(f"kdtree-replay: {exc}", stderr=True)
        return REPLAY_EXIT_USAGE
    if stop.is_set():  # a service stopped by SIGTERM is fine; an interrupted parity check is not a pass
        code = REPLAY_EXIT_OK if settings.threshold is None else REPLAY_EXIT_PARITY_FAILED
    else:
        code = verdict_exit_code(outcome, settings.threshold)
    write_line(
        f"kdtree-replay: stopped steps={outcome.steps_done} parity_lines={outcome.parity_lines} "
        f"worst_rel={outcome.worst_rel:.4e} threshold={settings.threshold} exit={code} "
        f"elapsed_s={time.monotonic() - started:.1f}"
    )
    return code


if __name__ == "__main__":
    exit_without_teardown(main())
