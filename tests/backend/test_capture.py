"""Capture of verify calls (kdtree_backend.capture) and their replay (kdtree_backend.replay_captures), on CPU:
the safetensors codec, the request, where captures go, the gather plan, the capturer through the real engine
(bounds, eager and the CUDA-graph protocol emulated on CPU, output unchanged), and the replay of stored calls with this release and with a classic-bug copy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch
from kdtree_backend import tensorfile
from kdtree_backend.batch import VerifyBatch, dense_verify_attention, make_verify_batch
from kdtree_backend.capture import Capturer
from kdtree_backend.capture_format import REQUEST_FILE, CaptureError, locate, parse_request
from kdtree_backend.capture_rows import remap_keys, step_rows
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.replay_captures import (
    dense_reference,
    find_calls,
    load_call,
    replay_captures,
)
from kdtree_backend.wire import REPLAY_EXIT_OK, REPLAY_EXIT_PARITY_FAILED

from tests.backend.emulation import GraphServer, rows_read
from tests.backend.helpers import PYTHON, REPO, buggy_release, replay_env

CAPTURE_ID = "c20260601T120000Z-0a1b2c"
LINE = r"^\[kdtree\] L(\d+) max_abs_diff=\S+ mean=\S+ rel=(\S+) tp=(\d+)(?: token=\S+)? capture=(\S+) "


def request(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "id": CAPTURE_ID,
        "layers": [0, 5],
        "steps": 2,
        "max_bytes": 50_000_000,
        "expires_at": time.time() + 600,
    }
    doc.update(over)
    return doc


def arm(directory: Path, **over: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / REQUEST_FILE).write_text(json.dumps(request(**over)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------------------------- safetensors codec


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float8_e4m3fn,
    ],
)
def test_tensorfile_roundtrip(dtype: torch.dtype) -> None:
    t = (torch.randn(3, 5) * 4).to(dtype)
    data = tensorfile.encode({"x": t, "empty": torch.empty(0, 7, dtype=dtype)}, {"k": "v"})
    assert int.from_bytes(data[:8], "little") % 8 == 0
    back, meta = tensorfile.decode(data)
    assert meta == {"k": "v"}
    assert back["x"].dtype == dtype and back["x"].shape == (3, 5)
    assert torch.equal(back["x"].view(torch.uint8), t.view(torch.uint8))
    assert back["empty"].shape == (0, 7)


def test_tensorfile_interoperates_with_the_safetensors_package(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensors = {
        "q": torch.randn(9, 8, 16).bfloat16(),
        "idx": torch.arange(11, dtype=torch.int32),
        "m": torch.ones(4, dtype=torch.bool),
    }
    ours = tmp_path / "ours.safetensors"
    size, digest = tensorfile.write_tensors(ours, tensors, {"capture": CAPTURE_ID})
    assert size == ours.stat().st_size and len(digest) == 64
    loaded = st.load_file(str(ours))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(tensors, str(theirs), metadata={"a": "b"})
    back, meta, _ = tensorfile.read_tensors(theirs)
    assert meta == {"a": "b"} and all(torch.equal(back[k], v) for k, v in tensors.items())


def test_tensorfile_refuses_malformed_files() -> None:
    good = tensorfile.encode({"a": torch.arange(4, dtype=torch.int32), "b": torch.arange(2, dtype=torch.int64)})
    with pytest.raises(tensorfile.TensorFileError, match="too short"):
        tensorfile.decode(good[:4])
    with pytest.raises(tensorfile.TensorFileError, match="after the last tensor"):
        tensorfile.decode(good + b"\0" * 8)
    with pytest.raises(tensorfile.TensorFileError, match="do not hold"):
        tensorfile.decode(good[:-1])
    header = json.dumps({"a": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    with pytest.raises(tensorfile.TensorFileError, match="hole"):
        tensorfile.decode(len(header).to_bytes(8, "little") + header + b"\0" * 8)


def test_write_tensors_is_private_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    old = os.umask(0)
    try:
        tensorfile.write_tensors(path, {"a": torch.zeros(2)})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        tensorfile.write_tensors(path, {"a": torch.zeros(2)})


# ---------------------------------------------------------------------------------------------- request, location


def test_parse_request_accepts_a_good_one_and_normalises_layers() -> None:
    req = parse_request(request(layers=[30, 0, 30]))
    assert req.id == CAPTURE_ID and req.layers == (0, 30) and req.steps == 2
    assert not req.expired(time.time()) and req.expired(req.expires_at)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "../../etc"),
        ("id", None),
        ("layers", []),
        ("layers", [-1]),
        ("layers", ["0"]),
        ("steps", 0),
        ("steps", 65),
        ("steps", True),
        ("max_bytes", 0),
        ("expires_at", "soon"),
        ("expires_at", float("nan")),
    ],
)
def test_parse_request_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(CaptureError, match=f"request.{field}"):
        parse_request(request(**{field: value}))


def test_locate_finds_the_state_of_an_installed_release(tmp_path: Path) -> None:
    module = tmp_path / "root" / "releases" / "r0123456789ab" / "backend" / "kdtree_backend" / "capture.py"
    module.parent.mkdir(parents=True)
    module.write_text("")
    assert locate(module, {}) == (tmp_path / "root" / "state" / "capture", "r0123456789ab")
    assert locate(REPO / "backend" / "kdtree_backend" / "capture.py", {}) == (None, "unreleased")
    assert locate(module, {"KDTREE_STATE_DIR": "/x/state", "KDTREE_RELEASE_ID": "rX"}) == (
        Path("/x/state/capture"),
        "rX",
    )


# ---------------------------------------------------------------------------------------------- the gather plan


def test_step_rows_are_prefix_then_drafts_per_request_and_remap_the_lists() -> None:
    batch = make_verify_batch(bs=3, prefix=40, q_len=5, heads=2, seed=3)
    plan = step_rows(batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, 5)
    expected = []
    for b, seq_len in enumerate(batch.seq_lens.tolist()):
        req = int(batch.req_pool_indices[b])
        expected += batch.req_to_token[req, : seq_len + 5].tolist()  # prefix ++ drafts (prepare_for_verify)
    assert plan.rows.tolist() == expected
    assert torch.equal(plan.rows[plan.kv_indices.long()], batch.kv_indices)
    assert torch.equal(plan.rows[plan.out_cache_loc], batch.out_cache_loc)


def test_remap_keys_marks_rows_the_step_does_not_read() -> None:
    rows = torch.tensor([7, 3, 9])
    assert remap_keys(torch.tensor([9, 7, 4, 3]), rows, 12).tolist() == [2, 0, -1, 1]


def test_dense_reference_matches_the_batch_reference(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=1)
    run_engine(directory, steps=1, layers=(0,))
    (call_dir,) = find_calls(directory)
    call = load_call(call_dir)
    batch = make_verify_batch(bs=2, prefix=48, q_len=9, heads=4, layers=(0,), seed=0)
    assert torch.allclose(dense_reference(call), dense_verify_attention(batch, 0), atol=1e-5)


# ---------------------------------------------------------------------------------------------- the capturer via the engine


def run_engine(
    directory: Path | None,
    *,
    steps: int,
    layers: tuple[int, ...] = (0, 5),
    clock: Clock | None = None,
    logs: list[str] | None = None,
) -> tuple[list[torch.Tensor], Capturer]:
    """Steps of the real VerifyEngine (eager, reference path) over SGLang-shaped batches; returns the outputs."""
    sink: list[str] = []
    capturer = Capturer(
        directory,
        release="rtest",
        tp=0,
        poll_s=0.0 if clock is None else 1.0,
        clock=clock or time.monotonic,
        log=(logs.append if logs is not None else lambda _: None),
    )
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=sink.append, capturer=capturer
    )
    outs = []
    for step in range(steps):
        if clock is not None:
            clock.now += 0.5
        batch = make_verify_batch(bs=2, prefix=48, q_len=9, heads=4, layers=layers, seed=step)
        engine.prepare(**batch.metadata(), graph=False)
        for layer in layers:
            out = torch.empty(18, 4, 512, dtype=torch.bfloat16)
            engine.forward(layer, batch.q[layer], batch.kv_buffers[layer], out, batch.sm_scale)
            outs.append(out.clone())
    capturer.drain()
    return outs, capturer


def test_armed_capture_stores_the_steps_asked_for_and_changes_no_output(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "capture"
    arm(directory, layers=[5], steps=2)
    outs, _ = run_engine(directory, steps=4)
    plain, _ = run_engine(None, steps=4)
    assert all(torch.equal(a, b) for a, b in zip(outs, plain, strict=True))  # capture never changes the output

    capture = directory / CAPTURE_ID
    calls = find_calls(directory)
    assert [c.name for c in calls] == ["tp0-L5-s0", "tp0-L5-s1"]  # 2 steps, layer 5 only
    done = json.loads((capture / "tp0.done.json").read_text())
    assert done["reason"] == "steps" and done["calls"] == 2 and done["layers"] == [5]
    for path in [directory, capture, *calls]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in capture.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    manifest = json.loads((calls[0] / "manifest.json").read_text())
    assert manifest["release"] == "rtest" and manifest["tp"] == 0 and manifest["layer"] == 5
    assert manifest["keys_outside_rows"] == 0 and manifest["q_len"] == 9
    assert manifest["tensors"]["inputs/q"] == {"shape": [18, 4, 576], "dtype": "bfloat16"}
    assert manifest["bytes"] == sum(f["bytes"] for f in manifest["files"].values())
    call = load_call(calls[0])  # sha256 checked
    assert torch.equal(call.output["out"], outs[1])  # step 0, layer 5: what the engine returned
    assert call.sglang["custom_mask"].dtype == torch.bool
    assert call.inputs["kv_rows"].shape[0] == int(call.sglang["seq_lens"].sum()) + 18


def test_a_finished_capture_is_not_taken_again_after_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=1)
    run_engine(directory, steps=3)
    assert len(find_calls(directory)) == 1
    _, capturer = run_engine(directory, steps=3)  # a new process: the done file says this rank is done
    assert capturer.progress is None and len(find_calls(directory)) == 1


def test_the_byte_budget_stops_a_capture_and_says_what_one_call_needs(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0, 5], steps=8, max_bytes=400_000)  # one call is ~0.26 MB here
    run_engine(directory, steps=4)
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "max_bytes" and done["calls"] == 1 and done["needed"] > 0
    assert done["bytes"] <= 400_000
    stored = sum(p.stat().st_size for p in (directory / CAPTURE_ID).rglob("*.safetensors"))
    assert stored <= 400_000 + 4096  # headers and metadata on top of the tensors


def test_expired_and_malformed_requests_are_ignored_and_said_once(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, expires_at=time.time() - 1)
    logs: list[str] = []
    run_engine(directory, steps=3, logs=logs)
    assert not (directory / CAPTURE_ID).exists()
    assert sum("expired" in line for line in logs) == 1, logs
    (directory / REQUEST_FILE).write_text('{"id": "x"')
    logs.clear()
    run_engine(directory, steps=3, logs=logs)
    assert len(logs) == 1 and "ignored" in logs[0]


def test_unarmed_check_reads_the_request_file_once_per_poll_interval(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    directory.mkdir()
    clock = Clock()
    capturer = Capturer(directory, release="r", poll_s=1.0, clock=clock, log=lambda _: None)
    assert not capturer.armed()  # polled at t=0: nothing there
    arm(directory)
    clock.now = 0.5
    assert not capturer.armed()  # not looked at again before the interval
    clock.now = 1.0
    assert capturer.armed()
    assert not Capturer(None, release="r").armed()  # no state dir (a checkout): never armed


def run_graph(
    directory: Path | None,
    *,
    steps: int,
    layers: tuple[int, ...] = (0, 5),
    graph_layers: tuple[int, ...] = (0, 5),
    in_graphs: bool = True,
) -> tuple[list[dict[int, torch.Tensor]], list, Capturer, GraphServer]:
    """Steps under the CUDA-graph protocol (CPU emulation, reference path); ``graph_layers``: the capture layers
    (the parity layers, parity itself off). Returns the outputs per step and the batches."""
    capturer = Capturer(directory, release="rtest", tp=0, poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(False, 1, graph_layers), use_kernel=False, sink=lambda _: None,
        capturer=capturer, capture_in_graphs=in_graphs,
    )  # fmt: skip
    template = make_verify_batch(bs=2, prefix=48, q_len=9, heads=4, layers=layers, seed=99)
    server = GraphServer(engine, template, max_context=64)
    batches = [make_verify_batch(bs=2, prefix=48, q_len=9, heads=4, layers=layers, seed=s) for s in range(steps)]
    outs = [server.step(batch, padding=1 if index == 1 else 0) for index, batch in enumerate(batches)]
    capturer.drain()
    return outs, batches, capturer, server


def test_graph_mode_capture_stores_what_each_replay_read_and_changes_no_output(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0, 5], steps=2)
    outs, batches, _, server = run_graph(directory, steps=4)
    plain, _, _, _ = run_graph(None, steps=4)
    for captured, uncaptured in zip(outs, plain, strict=True):
        assert all(torch.equal(captured[layer], uncaptured[layer]) for layer in (0, 5))
    calls = find_calls(directory)
    assert [c.name for c in calls] == ["tp0-L0-s0", "tp0-L0-s1", "tp0-L5-s0", "tp0-L5-s1"]
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "steps" and done["calls"] == 4 and done["layers"] == [0, 5]
    for call_dir in calls:
        call = load_call(call_dir)
        layer, step = call.manifest["layer"], call.manifest["step"]
        batch = batches[step]
        # Every row as the step read it: the prefix, and the drafts its replay saved (since overwritten).
        assert torch.equal(call.inputs["kv_rows"], batch.kv_buffers[layer][rows_read(batch)])
        assert torch.equal(call.inputs["q"], batch.q[layer])
        assert torch.equal(call.output["out"], outs[step][layer])
        assert call.manifest["graph"] is True and call.manifest["keys_outside_rows"] == 0
        assert call.manifest["padding_requests"] == (1 if step == 1 else 0)
    assert server.engine.graph is not None and server.engine.graph.capture is not None
    assert not bool(server.engine.graph.capture.flag.item())  # disarmed once the steps were taken
    lines: list[str] = []
    summary = replay_captures(directory, torch.device("cpu"), threshold=0.01, sink=lines.append)
    assert summary.calls == 4 and summary.worst_rel < 0.01
    assert all("vs_running=0.0000e+00" in line for line in lines), lines


def test_unarmed_graph_replays_leave_the_capture_slots_untouched(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    directory.mkdir()
    _, _, capturer, server = run_graph(directory, steps=3)
    slots = server.engine.graph.capture if server.engine.graph is not None else None
    assert slots is not None and capturer.progress is None
    assert not bool(slots.flag.item()) and not slots.armed_on_device
    assert all(not bool(t.any()) for t in [*slots.q.values(), *slots.out.values(), *slots.drafts.values()])


def test_graph_capture_switched_off_allocates_no_slots_and_says_so_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=2)
    outs, _, _, server = run_graph(directory, steps=2, in_graphs=False)
    plain, _, _, _ = run_graph(None, steps=2)
    assert server.engine.graph is not None and server.engine.graph.capture is None
    assert all(torch.equal(a[layer], b[layer]) for a, b in zip(outs, plain, strict=True) for layer in (0, 5))
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "graph_capture_off" and done["calls"] == 0 and not find_calls(directory)


def test_graph_mode_capture_of_layers_outside_the_capture_set_says_so(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[5, 7], steps=1)
    run_graph(directory, steps=2, graph_layers=(0,))
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "layers_not_in_graph" and done["graph_layers"] == [0] and done["calls"] == 0


def test_graph_mode_capture_of_an_fp8_pool_keeps_its_bytes(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=1)
    capturer = Capturer(directory, release="rtest", tp=0, poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(False, 1, (0,)), use_kernel=False, sink=lambda _: None,
        capturer=capturer,
    )  # fmt: skip

    def fp8(batch: VerifyBatch) -> VerifyBatch:
        batch.kv_buffers = {layer: pool.float().to(torch.float8_e4m3fn) for layer, pool in batch.kv_buffers.items()}
        return batch

    server = GraphServer(engine, fp8(make_verify_batch(bs=2, prefix=40, q_len=9, heads=4, seed=99)), max_context=64)
    batches = [fp8(make_verify_batch(bs=2, prefix=40, q_len=9, heads=4, seed=s)) for s in range(2)]
    outs = [server.step(batch) for batch in batches]
    capturer.drain()
    (call_dir,) = find_calls(directory)
    call = load_call(call_dir)
    batch = batches[0]
    rows = rows_read(batch)
    assert call.inputs["kv_rows"].dtype == torch.float8_e4m3fn
    assert torch.equal(call.inputs["kv_rows"].view(torch.uint8), batch.kv_buffers[0][rows].view(torch.uint8))
    assert torch.equal(call.output["out"], outs[0][0])
    summary = replay_captures(directory, torch.device("cpu"), threshold=0.01, sink=lambda _: None)
    assert summary.calls == 1 and summary.worst_rel < 0.01


def test_graph_mode_capture_keeps_the_byte_budget(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0, 5], steps=4, max_bytes=400_000)  # one call is ~0.26 MB here
    outs, _, _, _ = run_graph(directory, steps=3)
    plain, _, _, _ = run_graph(None, steps=3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[5], b[5]) for a, b in zip(outs, plain, strict=True))
    done = json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())
    assert done["reason"] == "max_bytes" and done["calls"] == 1 and done["bytes"] <= 400_000 and done["needed"] > 0
    assert [c.name for c in find_calls(directory)] == ["tp0-L0-s0"]


def test_a_failing_capture_never_reaches_the_server(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0])
    logs: list[str] = []
    capturer = Capturer(directory, release="r", poll_s=0.0, log=logs.append)
    assert capturer.armed()
    ok = capturer.begin_step(
        step=0,
        kv_indptr=torch.tensor([0, 5]),
        kv_indices=torch.arange(3),  # shorter than kv_indptr says: a broken batch
        out_cache_loc=torch.arange(2),
        custom_mask=torch.ones(10, dtype=torch.bool),
        mask_indptr=torch.tensor([0, 10]),
        qo_indptr=torch.tensor([0, 2]),
        key_indptr=torch.tensor([0, 7]),
        keys=torch.arange(7),
        draft_mask=torch.zeros(2, 1, dtype=torch.int64),
        bs=1,
        q_len=2,
    )
    capturer.drain()
    assert not ok and capturer.progress is None
    assert any("capture failed" in line for line in logs)
    assert json.loads((directory / CAPTURE_ID / "tp0.done.json").read_text())["reason"] == "error"


# ---------------------------------------------------------------------------------------------- replay


def test_replay_of_stored_calls_passes_with_this_release_and_names_the_capture(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0, 5], steps=2)
    run_engine(directory, steps=3)
    lines: list[str] = []
    summary = replay_captures(directory, torch.device("cpu"), threshold=0.01, sink=lines.append)
    assert summary.calls == 4 and summary.damaged == 0 and summary.exit_code(0.01) == REPLAY_EXIT_OK
    assert len(lines) == 4
    for line in lines:
        assert f"capture={CAPTURE_ID}/tp0-L" in line and " tp=0" in line
        assert "vs_running=0.0000e+00" in line  # the same reference path reproduces the running output exactly
        fields = dict(kv.split("=", 1) for kv in line.split()[2:])
        assert float(fields["rel"]) < 0.01 and float(fields["running_rel"]) < 0.01


def test_a_damaged_capture_is_skipped_and_fails_the_replay(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=1)
    run_engine(directory, steps=1)
    (call_dir,) = find_calls(directory)
    target = call_dir / "output.safetensors"
    target.chmod(0o600)
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    warnings: list[str] = []
    summary = replay_captures(directory, torch.device("cpu"), threshold=0.01, sink=lambda _: None, warn=warnings.append)
    assert summary.calls == 0 and summary.damaged == 1 and summary.exit_code(0.01) == REPLAY_EXIT_PARITY_FAILED
    assert "sha256" in warnings[0] and "skipped" in warnings[0]


def replay_cli(root: Path, captures: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = replay_env(root)
    env["KDTREE_PARITY_TOKEN"] = "tok-" + "a" * 12
    return subprocess.run(
        [PYTHON, "-m", "kdtree_backend.replay", "--captures", str(captures), "--device", "cpu", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
    )


@pytest.mark.parametrize(("bug", "graph"), [("drafts", False), ("stride", False), ("drafts", True)])
def test_the_classic_bug_is_caught_by_the_capture_replay(tmp_path: Path, bug: str, graph: bool) -> None:
    import re

    directory = tmp_path / "capture"
    arm(directory, layers=[0, 5], steps=1)
    if graph:
        run_graph(directory, steps=2)
    else:
        run_engine(directory, steps=1)
    good = replay_cli(REPO, directory, "--threshold", "0.05")
    assert good.returncode == 0, good.stderr
    assert "captures=2 damaged=0" in good.stdout
    bad = replay_cli(buggy_release(bug, tmp_path), directory, "--threshold", "0.05")
    assert bad.returncode == 3, bad.stdout + bad.stderr
    rels = [float(m[2]) for m in re.finditer(LINE, bad.stdout, re.M)]
    assert len(rels) == 2 and min(rels) > 0.3, bad.stdout  # rel ~ 1: the drafts lost or the mask misread
    assert "token=tok-aaaaaaaaaaaa" in bad.stdout


def test_replay_cli_with_nothing_captured_prints_captures_0(tmp_path: Path) -> None:
    res = replay_cli(REPO, tmp_path / "never-made", "--threshold", "0.05")
    assert res.returncode == 0 and "captures=0 damaged=0" in res.stdout and "[kdtree] L" not in res.stdout


def test_an_fp8_pool_is_captured_as_stored_and_replayed_with_its_scales(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    arm(directory, layers=[0], steps=1)
    capturer = Capturer(directory, release="r", poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=lambda _: None, capturer=capturer
    )
    batch = make_verify_batch(bs=2, prefix=40, q_len=9, heads=4, seed=1)
    pool = (batch.kv_buffers[0].float() / 0.5).to(torch.float8_e4m3fn)
    engine.prepare(
        **batch.metadata(),
        graph=False,
    )
    out = torch.empty(18, 4, 512, dtype=torch.bfloat16)
    engine.forward(0, batch.q[0], pool, out, batch.sm_scale, k_scale=0.5, v_scale=0.5)
    capturer.drain()
    (call_dir,) = find_calls(directory)
    call = load_call(call_dir)
    assert call.inputs["kv_rows"].dtype == torch.float8_e4m3fn
    assert call.manifest["k_scale"] == 0.5 and call.manifest["v_scale"] == 0.5
    rows = torch.cat([batch.kv_indices, batch.out_cache_loc])  # not in capture order; compare as sets of bytes
    assert call.inputs["kv_rows"].numel() == pool[rows].numel()
    lines: list[str] = []
    summary = replay_captures(directory, torch.device("cpu"), threshold=0.01, sink=lines.append)
    assert summary.calls == 1 and summary.worst_rel < 0.01 and "vs_running=0.0000e+00" in lines[0]
