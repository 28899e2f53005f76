"""Faults around the training loop: non-finite updates, crashes mid-save, damaged or hostile files,
full or read-only disks, duplicated log rows after resume, and stop signals."""

import errno
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aha import algos
from aha.metrics import JsonlLogger, read_metrics
from aha.models import load_model, load_tokenizer, save_model
from aha.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from aha.train.loop import optimizer_step
from aha.config import GRPOConfig, SFTConfig
from aha.train.grpo import GRPOTrainer
from aha.train.loop import Trainer
from aha.train.sft import SFTTrainer

# The errors are caught by their standard base classes (CorruptCheckpointError is a ValueError,
# DiskFullError an OSError, NonFiniteError a FloatingPointError, Preempted a SystemExit).
MARKER = "trainer_state.json"

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
SUBPROCESS_TIMEOUT_S = 180
"""Longest wait for the training subprocess (start-up imports torch and transformers)."""
POLL_S = 0.05
SLOW_REWARD_S = 0.3
"""Sleep per reward call in the subprocess, so a signal lands well before the run would end."""


def read_line(proc, timeout_s: float = SUBPROCESS_TIMEOUT_S) -> str:
    """The subprocess's next stdout line, or a failure after timeout_s (a child that hangs before it prints must not
    hang the suite)."""
    import select
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        proc.kill()
        pytest.fail(f"no line from the subprocess within {timeout_s} s")
    return proc.stdout.readline()


def digit_share(prompts, completions, **kw):
    """Graded reward: share of digits in the completion (varies inside every group from step 1)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def grpo_args(run_dir, **kw):
    base = dict(output_dir=str(run_dir), max_steps=2, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, seed=0)
    return GRPOConfig(**{**base, **kw})


def grpo(tiny_dir, run_dir, **kw):
    return GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=grpo_args(run_dir, **kw),
                       train_dataset=PROMPTS)


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same(a, b):
    for n in a:
        assert torch.equal(a[n], b[n]), n


def logged_steps(path):
    return [json.loads(line)["step"] for line in Path(path).read_text().splitlines()]


class Crash(BaseException):
    """A simulated kill at an exact point (BaseException: nothing on the way may swallow it)."""


# ------------------------------------------------------------------ non-finite loss or gradient
def test_optimizer_step_keeps_a_nonfinite_update_off_the_weights():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = params(model)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    with pytest.raises(FloatingPointError, match=r"^non-finite grad norm \((inf|nan)\)$"):
        optimizer_step(SimpleNamespace(max_grad_norm=1.0, on_nonfinite="stop"), model, opt, sched)
    assert_same(before, params(model))

    assert math.isnan(optimizer_step(SimpleNamespace(max_grad_norm=1.0, on_nonfinite="skip"), model, opt, sched))
    assert_same(before, params(model))
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())
    assert not opt.state  # AdamW never stepped: no moments that would move the weights later

    norm = optimizer_step(SimpleNamespace(max_grad_norm=1.0, on_nonfinite="skip"), model, opt, sched, math.nan)
    assert math.isnan(norm) and not opt.state  # a NaN loss is skipped even with finite (zero) gradients
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert optimizer_step(SimpleNamespace(max_grad_norm=0.0, on_nonfinite="skip"), model, opt, sched, 1.0) == \
        pytest.approx(math.sqrt(3 * 2 + 2))
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_nonfinite_loss_stops_grpo_naming_the_step_before_any_checkpoint(tiny_dir, tmp_path, monkeypatch):
    t = grpo(tiny_dir, tmp_path / "run", max_steps=4, save_steps=1, save_total_limit=5)
    real = algos.aggregate

    def nan_at_step_3(*a, **kw):
        loss = real(*a, **kw)
        return loss * float("nan") if t.step_count == 2 else loss

    monkeypatch.setattr(algos, "aggregate", nan_at_step_3)
    with pytest.raises(FloatingPointError, match=r"^step 3: non-finite loss \(nan\).*no checkpoint written"):
        t.train()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint-1", "checkpoint-2"]
    saved = torch.load(tmp_path / "run" / "checkpoint-2" / "trainable.pt", weights_only=True)
    now = params(t.model)
    assert all(torch.isfinite(w).all() for w in now.values())
    assert_same(saved, now)  # the NaN step never touched the weights


def test_nonfinite_skip_in_sft_counts_and_leaves_the_weights(tiny_dir, tmp_path, monkeypatch):
    import aha.train.sft as sft_mod
    rows = [{"prompt": f"{a}+1=", "completion": str(a + 1)} for a in range(16)]
    t = SFTTrainer(model=tiny_dir, train_dataset=rows, args=SFTConfig(
        output_dir=str(tmp_path / "sft"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
        progress_bar=False, report_to=[], on_nonfinite="skip"))
    real = sft_mod.completion_logprobs

    def nan_on_step_2(*a, **kw):
        logp, mask, ent = real(*a, **kw)
        return (logp * float("nan") if t.step_count == 1 else logp), mask, ent

    monkeypatch.setattr(sft_mod, "completion_logprobs", nan_on_step_2)
    seen, weights = [], [params(t.model)]
    for _ in range(3):
        seen.append(t.step())
        t.step_count += 1
        weights.append(params(t.model))
    assert [m["train/nonfinite_skipped"] for m in seen] == [0.0, 1.0, 0.0]
    assert_same(weights[1], weights[2])  # the skipped step moved nothing
    assert any(not torch.equal(weights[2][n], weights[3][n]) for n in weights[2])
    assert all(torch.isfinite(w).all() for w in weights[3].values())


# ------------------------------------------------------------------ checkpoints: once, atomic, complete
def test_the_last_step_is_saved_once(tiny_dir, tmp_path, monkeypatch):
    import aha.train.loop as loop_mod
    real, steps = loop_mod.save_checkpoint, []

    def counting(output_dir, step, *a, **kw):
        steps.append(step)
        return real(output_dir, step, *a, **kw)

    monkeypatch.setattr(loop_mod, "save_checkpoint", counting)
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    grpo(tiny_dir, tmp_path / "run", max_steps=2, save_steps=2).train()
    assert steps == [2]
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers  # restored after train()


def _deleting_crash(path, ignore_errors=False, **kw):
    """rmtree killed part-way: every file but the marker is gone when the process dies."""
    path = Path(path)
    if not path.exists():
        return
    for f in path.iterdir():
        if f.name != MARKER:
            f.unlink()
    raise Crash(f"killed while deleting {path}")


@pytest.mark.parametrize("crash_at", ["pruning", "replacing_delete", "replacing_rename"])
def test_a_crash_mid_save_never_leaves_a_complete_looking_broken_checkpoint(tiny_dir, tmp_path, monkeypatch, crash_at):
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=2, save_steps=1)
    t.train()  # checkpoint-1 and checkpoint-2
    step = {"pruning": 3, "replacing_delete": 2, "replacing_rename": 2}[crash_at]
    if crash_at == "replacing_rename":
        real_replace = os.replace

        def rename_in_crashes(src, dst):  # the old directory is already aside when this runs
            if Path(src).name == f".checkpoint-{step}.tmp":
                raise Crash("killed between renaming the old checkpoint aside and the new one in")
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", rename_in_crashes)
    else:
        monkeypatch.setattr(shutil, "rmtree", _deleting_crash)
    with pytest.raises(Crash):
        t.step_count = step
        t.save_checkpoint()
    monkeypatch.undo()
    listed = list_checkpoints(run)
    assert listed, "a crash must not lose every checkpoint"
    for ckpt in listed:  # whatever looks complete loads
        assert load_checkpoint(ckpt, t.model, t.optimizer, t.scheduler)["step"] == int(ckpt.name.split("-")[1])
    expected = {"pruning": "checkpoint-3", "replacing_delete": "checkpoint-2", "replacing_rename": "checkpoint-1"}
    assert latest_checkpoint(run).name == expected[crash_at]
    resumed = grpo(tiny_dir, run, max_steps=4, save_steps=1, resume=True)
    resumed.train()
    assert resumed.step_count == 4 and latest_checkpoint(run).name == "checkpoint-4"
    assert sorted(p.name for p in run.glob(".checkpoint-*")) == []  # leftovers cleared by the next save


@pytest.mark.parametrize("damage", ["truncated trainable.pt", "truncated optimizer.pt", "garbage state.pt"])
def test_resume_falls_back_past_a_damaged_newest_checkpoint(tiny_dir, tmp_path, caplog, damage):
    full = grpo(tiny_dir, tmp_path / "full", max_steps=2)
    full.train()
    run = tmp_path / "run"
    grpo(tiny_dir, run, max_steps=2, save_steps=1).train()
    kind, name = damage.split()
    target = run / "checkpoint-2" / name
    target.write_bytes(target.read_bytes()[:100] if kind == "truncated" else os.urandom(200))
    t = grpo(tiny_dir, run, max_steps=2)
    with pytest.raises(ValueError, match=f"checkpoint file {target}"):
        load_checkpoint(target.parent, t.model, t.optimizer, t.scheduler)
    with caplog.at_level(logging.WARNING, logger="aha.train"):
        resumed = grpo(tiny_dir, run, max_steps=2, resume=True)
        resumed.train()
    assert any(str(target) in r.getMessage() and "previous checkpoint" in r.getMessage() for r in caplog.records)
    assert_same(params(full.model), params(resumed.model))


def test_a_state_pt_that_would_run_code_is_refused(tiny_dir, tmp_path):
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=1)
    t.train()
    sentinel = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(sentinel),)

    state = run / "checkpoint-1" / "state.pt"
    torch.save({"rng": Payload(), "step": 1}, state)
    with pytest.raises(ValueError, match=f"cannot load checkpoint file {state}"):
        load_checkpoint(run / "checkpoint-1", t.model, t.optimizer, t.scheduler)
    assert not sentinel.exists()


# ------------------------------------------------------------------ the final model directory
def test_save_model_replaces_the_directory_atomically(tiny_dir, tmp_path, monkeypatch):
    model, tok = load_model(tiny_dir, device="cpu"), load_tokenizer(tiny_dir)
    out = tmp_path / "model"
    save_model(model, tok, out)
    (out / "stale.txt").write_text("from an older save")
    old_weights = (out / "model.safetensors").read_bytes()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)

    def killed(*a, **kw):
        raise Crash("killed after the weights were written")

    monkeypatch.setattr(tok, "save_pretrained", killed)
    with pytest.raises(Crash):
        save_model(model, tok, out)
    assert (out / "model.safetensors").read_bytes() == old_weights and (out / "stale.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp dir left behind
    monkeypatch.undo()
    save_model(model, tok, out)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").read_bytes() != old_weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    reloaded = load_model(str(out), device="cpu")
    assert_same(params(model), params(reloaded))


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_a_damaged_model_safetensors_names_the_file(tiny_dir, tmp_path, damage):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"empty": b"", "truncated": data[:len(data) // 2], "garbage": os.urandom(4096)}[damage])
    with pytest.raises(ValueError, match=f"^cannot load model from {weights}: "):
        load_model(str(model_dir), device="cpu")


# ------------------------------------------------------------------ full or unwritable disk
def test_no_space_while_saving_is_one_clear_error_and_leaves_no_temp(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=1)
    real_save = torch.save

    def disk_fills(obj, f, *a, **kw):
        Path(f).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_fills)
    with pytest.raises(OSError) as e:
        t.save_checkpoint()
    assert str(e.value) == f"no space left on device while writing {run / 'checkpoint-0'}"
    assert e.value.errno == errno.ENOSPC
    assert not [p for p in run.iterdir() if "checkpoint" in p.name]
    monkeypatch.setattr(torch, "save", real_save)

    def tokenizer_fills(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(t.tokenizer, "save_pretrained", tokenizer_fills)
    with pytest.raises(OSError, match=f"^no space left on device while writing {run / 'model'}$"):
        t.save_model()
    assert not [p for p in run.iterdir() if "model" in p.name]


def _disk_with(free):
    """A stand-in for shutil.disk_usage: a 1 GB filesystem with `free` bytes left."""
    return lambda path: SimpleNamespace(total=10**9, used=10**9 - free, free=free)


def test_a_full_disk_that_the_writer_reports_otherwise_is_still_one_clear_error(tiny_dir, tmp_path, monkeypatch):
    """On a real full disk torch.save raises RuntimeError and safetensors SafetensorError, not ENOSPC: a failed
    save while the filesystem is (nearly) full is the disk-full error, naming the path and the free bytes."""
    from safetensors import SafetensorError
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=1)
    pos = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 298240 vs 298128")

    def disk_fills(obj, f, *a, **kw):
        Path(f).write_bytes(b"partial")
        raise pos

    monkeypatch.setattr(torch, "save", disk_fills)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(0))
    with pytest.raises(OSError) as e:
        t.save_checkpoint()
    assert str(e.value) == f"no space left on device while writing {run / 'checkpoint-0'} (0 bytes free)"
    assert e.value.errno == errno.ENOSPC and e.value.__cause__ is pos
    assert not [p for p in run.iterdir() if "checkpoint" in p.name]
    monkeypatch.undo()

    serializing = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def safetensors_fills(*a, **kw):
        raise serializing

    monkeypatch.setattr(t.model, "save_pretrained", safetensors_fills)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(4096))
    with pytest.raises(OSError) as e:
        t.save_model()
    assert str(e.value) == f"no space left on device while writing {run / 'model'} (4096 bytes free)"
    assert e.value.__cause__ is serializing
    assert not [p for p in run.iterdir() if "model" in p.name]
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(10**8))  # safetensors removed its partial file first
    with pytest.raises(OSError) as e:
        t.save_model()
    assert str(e.value) == f"no space left on device while writing {run / 'model'}"
    assert e.value.__cause__ is serializing
    assert not [p for p in run.iterdir() if "model" in p.name]


def test_a_failed_save_with_space_left_raises_the_writers_own_error(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=1)
    broken = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 298240 vs 298128")

    def fails(obj, f, *a, **kw):
        raise broken

    monkeypatch.setattr(torch, "save", fails)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(10**8))
    with pytest.raises(RuntimeError) as e:
        t.save_checkpoint()
    assert e.value is broken
    assert not [p for p in run.iterdir() if "checkpoint" in p.name]

    def interrupted(obj, f, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    monkeypatch.setattr(shutil, "disk_usage", _disk_with(0))
    with pytest.raises(KeyboardInterrupt):  # an interrupt is never a full disk, even on a full one
        t.save_checkpoint()
    assert not [p for p in run.iterdir() if "checkpoint" in p.name]


def test_an_unwritable_output_dir_fails_before_the_model_loads(tiny_dir, tmp_path, monkeypatch):
    """Root ignores permission bits, so the probe write is made to fail as a read-only disk would."""
    import aha.train.grpo as grpo_mod
    run = tmp_path / "readonly"
    real_write = Path.write_bytes

    def read_only(self, data):
        if self.parent == run:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_write(self, data)

    def no_model(*a, **kw):
        raise AssertionError("the model was loaded before output_dir was checked")

    monkeypatch.setattr(Path, "write_bytes", read_only)
    monkeypatch.setattr(grpo_mod, "setup_model", no_model)
    with pytest.raises(PermissionError, match=f"^output_dir {run} is not writable: Read-only file system$"):
        grpo(tiny_dir, run)


# ------------------------------------------------------------------ JSONL logs
def test_a_torn_last_line_is_skipped_by_read_metrics_and_cut_before_appending(tmp_path, caplog, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="aha.metrics"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert any("torn last line" in r.getMessage() for r in caplog.records)
    logger = JsonlLogger(path)
    logger.log(3, {"loss": 0.3})
    real_write = os.write

    def half_written(fd, data):  # the disk fills in the middle of the line
        if fd == logger.fd:
            real_write(fd, data[:len(data) // 2])
            return len(data) // 2
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_written)
    with pytest.raises(OSError, match=f"^no space left on device while writing {path}$"):
        logger.log(4, {"loss": 0.2})
    monkeypatch.undo()
    logger.close()
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "loss": 0.3}\n'


def test_resume_does_not_repeat_rows_logged_after_the_checkpoint(tiny_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    kw = dict(max_steps=4, save_steps=2, log_completions_steps=1, num_completions_to_print=2,
              report_to=["jsonl", "tensorboard"])
    crashing = grpo(tiny_dir, run, **kw)
    real_step = crashing.step

    def crash_in_step_4():
        if crashing.step_count == 3:
            raise Crash("killed in step 4, after step 3 was logged")
        return real_step()

    crashing.step = crash_in_step_4
    with pytest.raises(Crash):
        crashing.train()
    assert logged_steps(run / "metrics.jsonl") == [1, 2, 3]
    grpo(tiny_dir, run, resume=True, **kw).train()
    assert logged_steps(run / "metrics.jsonl") == [1, 2, 3, 4]
    assert logged_steps(run / "completions.jsonl") == [s for s in (1, 2, 3, 4) for _ in range(8)]  # whole groups
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4]


# ------------------------------------------------------------------ stop signals
def test_a_second_signal_stops_at_once(tmp_path):
    class Idle(Trainer):
        def step(self):
            return {}

    t = Idle(SFTConfig(output_dir=str(tmp_path / "idle")), eval_fn=None)
    t.step_count, t.saved_step = 6, 4
    t._on_signal(signal.SIGINT, None)
    assert t._stop_signal == signal.SIGINT
    with pytest.raises(SystemExit) as e:
        t._on_signal(signal.SIGINT, None)
    assert e.value.code == 130
    assert str(e.value) == ("stopped at once by a second SIGINT during step 7; "
                            "steps since the last checkpoint are lost (last checkpoint: step 4)")


def test_sigterm_finishes_the_step_checkpoints_and_resumes_exactly(tiny_dir, tmp_path):
    max_steps = 8
    (tmp_path / "slow_rewards.py").write_text(
        "import time\n\n\n"
        "def digit_share(prompts, completions, **kw):\n"
        f"    time.sleep({SLOW_REWARD_S})\n"
        "    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]\n")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    run = tmp_path / "run"
    cfg = dict(max_steps=max_steps, num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
               learning_rate=1e-2, progress_bar=False, report_to=["jsonl"], log_completions_steps=0, seed=0,
               threads=torch.get_num_threads())
    argv = [f"{k}={json.dumps(v)}" for k, v in cfg.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-m", "aha.cli", "train", f"model={tiny_dir}", f"dataset={data}",
                             "reward_funcs=slow_rewards:digit_share", f"output_dir={run}", *argv],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        metrics = run / "metrics.jsonl"
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run logged no two steps in time"
            time.sleep(POLL_S)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    stopped = int(last.split("after step ")[1].split(";")[0])
    assert last == (f"aha: stopped by SIGTERM after step {stopped}; checkpoint written to "
                    f"{run / f'checkpoint-{stopped}'}; resume with resume=true")
    assert 2 <= stopped < max_steps
    assert [p.name for p in list_checkpoints(run)] == [f"checkpoint-{stopped}"]
    assert logged_steps(metrics) == list(range(1, stopped + 1))

    resumed = grpo(tiny_dir, run, resume=True, **cfg)
    assert resumed.step_count == 0
    resumed.train()
    assert resumed.step_count == max_steps and logged_steps(metrics) == list(range(1, max_steps + 1))
    full = grpo(tiny_dir, tmp_path / "full", **cfg)
    full.train()
    assert_same(params(full.model), params(resumed.model))


# ------------------------------------------------------------------ rewards around the trainer
def test_a_reward_that_never_returns_is_cut_and_the_run_finishes(tiny_dir, tmp_path):
    def hangs(prompts, completions, **kw):
        threading.Event().wait()

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share, hangs], train_dataset=PROMPTS,
                    args=grpo_args(tmp_path / "run", reward_timeout=0.3))
    start = time.monotonic()
    metrics = t.train()
    assert time.monotonic() - start < 60 and t.step_count == 2
    assert metrics["reward/call_timeouts"] == 1 and metrics["reward/hangs/none_frac"] == 1.0
    assert metrics["reward/digit_share/none_frac"] == 0.0  # the other function still trains the model


def test_a_gold_column_that_is_null_everywhere_is_refused_before_the_model_loads(tmp_path):
    from aha.rewards import math_reward
    rows = [{"prompt": f"{a}+1=", "answer": None} for a in range(4)]
    with pytest.raises(ValueError, match=r"column 'answer' is null in all 4 rows; reward function math has nothing"):
        GRPOTrainer(model="no/such-model", reward_funcs=[math_reward], train_dataset=rows,
                    args=grpo_args(tmp_path / "run"))


def test_reward_modules_resolve_from_the_current_directory_or_are_named(tmp_path, monkeypatch):
    from aha.train.grpo import resolve_reward_funcs
    (tmp_path / "myrew_for_test.py").write_text("def exact(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    (fn,) = resolve_reward_funcs(["myrew_for_test:exact"])
    assert fn(["p"], ["c"]) == [1.0]
    with pytest.raises(ValueError, match=r"'nosuchmodule_x:f': no module 'nosuchmodule_x' on the Python path or in "
                                         r"the current directory"):
        resolve_reward_funcs(["nosuchmodule_x:f"])
    with pytest.raises(ValueError, match=r"'myrew_for_test:missing': module 'myrew_for_test' .* has no function "
                                         r"'missing'"):
        resolve_reward_funcs(["myrew_for_test:missing"])


def test_a_second_run_into_the_same_output_dir_is_refused_not_appended(tiny_dir, tmp_path):
    run = tmp_path / "run"
    grpo(tiny_dir, run).train()
    rows = (run / "metrics.jsonl").read_text()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"output_dir .*run holds an earlier run \(checkpoint-2, completions"
                                              r"|output_dir .*run holds an earlier run \(checkpoint-2, config.yaml"):
        grpo(tiny_dir, run).train()
    assert (run / "metrics.jsonl").read_text() == rows  # nothing appended
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=grpo_args(run, overwrite_output_dir=True))
    t.train()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and (run / "notes.txt").read_text() == "mine"  # the old run's files only are replaced


def test_a_reward_that_always_raises_stops_the_run_with_its_error(tiny_dir, tmp_path):
    def broken(prompts, completions, **kw):
        return [c.strip() for c in [completions]]  # a list has no strip(): fails on every call

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share, broken], train_dataset=PROMPTS,
                    args=grpo_args(tmp_path / "run", max_steps=6, reward_fail_steps=2))
    with pytest.raises(RuntimeError, match=r"reward function broken raised or timed out on 2 consecutive steps "
                                           r"\(last: AttributeError\(\"'list' object has no attribute 'strip'\"\)\)") as e:
        t.train()
    assert isinstance(e.value.__cause__, AttributeError) and t.step_count == 1  # stopped in step 2, before its update


def test_a_step_that_trains_nothing_logs_nan_not_zero(tiny_dir, tmp_path):
    def constant(prompts, completions, **kw):
        return [1.0] * len(completions)  # every group has zero spread: no advantage, nothing to train

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[constant], train_dataset=PROMPTS,
                    args=grpo_args(tmp_path / "run", max_steps=1))
    m = t.train()
    assert m["train/trained_frac"] == 0.0
    for key in ("entropy", "clip/high", "perf/train_tokens_per_s"):
        assert math.isnan(m[key]), key
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert row["entropy"] is None and row["perf/train_tokens_per_s"] is None


def test_resuming_with_another_model_names_it_and_keeps_the_run_config(tiny_dir, tmp_path):
    from aha.models.tiny import make_tiny
    from aha.tasks import task_corpus
    from aha.tasks.arithmetic import make_addition
    run = tmp_path / "run"
    grpo(tiny_dir, run, max_steps=1, save_steps=1).train()
    config = (run / "config.yaml").read_text()
    other = make_tiny(tmp_path / "other", task_corpus(make_addition("train", 50, seed=0)), size="small", seed=0)
    t = GRPOTrainer(model=str(other), reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=grpo_args(run, max_steps=2, save_steps=1, resume=True))
    before = params(t.model)
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint-1 is of another model: .*\(the model's: "):
        t.train()
    assert (run / "config.yaml").read_text() == config  # the run's own config, not the one that failed
    assert all(torch.equal(before[n], p) for n, p in params(t.model).items())  # nothing half-copied


# ------------------------------------------------------------------ the run directory: ownership, inputs, lock
def test_overwrite_deletes_only_what_a_run_wrote_and_never_an_input(tiny_dir, tmp_path):
    from aha.train.rundir import RUN_MARKER, check_inputs
    folder = tmp_path / "mine"  # the user's own folder: their config and their model, no aha run
    shutil.copytree(tiny_dir, folder / "model")
    (folder / "model" / "NOTES.md").write_text("base weights, keep")
    (folder / "config.yaml").write_text("learning_rate: 0.5\n")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    t = GRPOTrainer(model=str(folder / "model"), reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=grpo_args(folder, overwrite_output_dir=True))
    with pytest.raises(ValueError, match=r"model .*mine/model lies inside output_dir .*mine, in model, which the run "
                                         r"writes or deletes"):
        t.train()
    with pytest.raises(FileExistsError, match=r"output_dir .*mine holds config.yaml, model, which no aha run is known "
                                              rf"to have written \(no {RUN_MARKER}\): aha neither deletes"):
        grpo(tiny_dir, folder, overwrite_output_dir=True).train()  # the model elsewhere: still not aha's to delete
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert (folder / "model" / "NOTES.md").read_text() == "base weights, keep"
    (folder / "metrics.jsonl").write_text("{}\n")  # a dataset named like a run's log: appended to, or deleted
    with pytest.raises(ValueError, match=r"dataset .*metrics.jsonl lies inside output_dir .*, in metrics.jsonl"):
        check_inputs(folder, [("model", "smollm2-135m-instruct"), ("dataset", folder / "metrics.jsonl")])
    (folder / "data").mkdir()
    (folder / "data" / "train.jsonl").write_text("{}\n")
    check_inputs(folder, [("dataset", folder / "data" / "train.jsonl")])  # nothing of the run's: it may stay


def test_a_second_run_into_an_output_dir_in_use_is_refused_naming_the_holder(tiny_dir, tmp_path):
    from aha.train.rundir import LOCK_FILE, OutputDirInUseError
    run = tmp_path / "run"
    grpo(tiny_dir, run, max_steps=1, save_steps=1).train()
    first = grpo(tiny_dir, run, max_steps=3, save_steps=1, resume=True)
    second = grpo(tiny_dir, run, max_steps=3, save_steps=1, resume=True)
    real_step, refused = first.step, []

    def step_while_another_starts():
        if first.step_count == 1:  # the first resumed run is mid-way: a second one on the same folder
            with pytest.raises(OutputDirInUseError, match=rf"output_dir {run} is in use by another aha run \(pid "
                                                          rf"{os.getpid()} on .* since .*\); wait for it to end"):
                second.train()
            refused.append(second.step_count)
        return real_step()

    first.step = step_while_another_starts
    first.train()
    assert refused == [0] and logged_steps(run / "metrics.jsonl") == [1, 2, 3]  # one run's rows, once each
    assert not (run / LOCK_FILE).exists()  # released at the end of train()
    second.train()  # the folder is free again (nothing left to train: a warning, no error)


def test_a_lock_left_by_a_killed_run_is_no_lock(tmp_path):
    from aha.train.rundir import LOCK_FILE, OutputDirInUseError, lock_run_dir
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from aha.train.rundir import lock_run_dir\n"
                               "with lock_run_dir(Path(sys.argv[1])):\n    print('locked', flush=True)\n"
                               "    time.sleep(600)\n", str(run)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(holder) == "locked\n"
        with pytest.raises(OutputDirInUseError, match=rf"in use by another aha run \(pid {holder.pid} on "):
            with lock_run_dir(run):
                pass
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the lock file stays behind
        holder.wait(timeout=SUBPROCESS_TIMEOUT_S)
    assert (run / LOCK_FILE).exists()
    with lock_run_dir(run):  # the kernel released the dead process's lock
        assert str(os.getpid()) in (run / LOCK_FILE).read_text()
    assert not (run / LOCK_FILE).exists()


# ------------------------------------------------------------------ resume: settings and length
def test_resume_refuses_settings_it_cannot_honour_and_honours_the_rest(tiny_dir, tmp_path):
    import yaml

    from aha.config import ConfigError, parse_args
    run = tmp_path / "run"
    grpo(tiny_dir, run, max_steps=1, save_steps=1).train()
    config = (run / "config.yaml").read_text()
    t = grpo(tiny_dir, run, max_steps=2, resume=True, learning_rate=0.5, num_generations=2, weight_decay=0.1)
    before = params(t.model)
    with pytest.raises(ConfigError, match=r"cannot resume .*run with other settings than its own \(.*checkpoint-1/"
                                          r"trainer_state.json\): learning_rate: 0.01 -> 0.5; weight_decay: 0.0 -> "
                                          r"0.1; num_generations: 4 -> 2\. A resume may change how long"):
        t.train()
    assert (run / "config.yaml").read_text() == config and t.step_count == 0  # nothing written, nothing restored
    assert_same(before, params(t.model))
    own = parse_args(GRPOConfig, [str(run / "config.yaml"), "resume=true", "max_steps=3", "save_total_limit=5",
                                  "logging_steps=2"])  # the run's own settings, derived ones included
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, args=own)
    t.train()
    assert t.step_count == 3 and logged_steps(run / "metrics.jsonl") == [1, 2, 3]  # logs every 2 steps, and the last
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["max_steps"], saved["logging_steps"], saved["learning_rate"]) == (3, 2, 0.01)  # honoured, recorded


def test_resume_compares_what_the_user_set_not_what_aha_derives_from_it(tiny_dir, tmp_path, monkeypatch):
    from aha.config.resume import config_record, resume_changes
    monkeypatch.chdir(Path(tiny_dir).parent)
    saved = config_record(GRPOConfig(model=tiny_dir, task="arithmetic", num_generations=4, reward_weights=[1.0, 0.5]))
    same = GRPOConfig(model=f"./{Path(tiny_dir).name}", task="arithmetic", num_generations=4, reward_weights=[1.0, 0.5],
                      resume=True, max_steps=7, output_dir=str(tmp_path / "moved"), report_to=["jsonl"])
    assert resume_changes(saved, same) == []  # one path spelt two ways; a longer run, logged elsewhere
    assert resume_changes(saved, GRPOConfig(num_generations=4, reward_weights=[1.0, 0.5])) == []  # model= in code
    other = GRPOConfig(model=tiny_dir, task="gsm8k", num_generations=4, per_device_train_batch_size=4,
                       reward_weights=[1.0], seed=1)
    assert resume_changes(saved, other) == [  # generation_batch_size and reward_weights follow from these
        "per_device_train_batch_size: 8 -> 4", "seed: 42 -> 1", "task: 'arithmetic' -> 'gsm8k'"]


def test_resume_past_max_steps_says_so_and_changes_nothing(tiny_dir, tmp_path, caplog):
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=4, save_steps=2)
    t.train()
    t.save_model()

    def files():
        return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}

    before = files()
    resumed = grpo(tiny_dir, run, max_steps=2, resume=True)
    with pytest.raises(ValueError, match=rf"{run}/checkpoint-4 is at step 4, past max_steps=2: nothing to train, and "
                                         r"nothing was changed\. To train on, resume with max_steps above 4") as e:
        resumed.train()
    assert type(e.value).__name__ == "NothingToTrainError"  # `aha train` exits 2 with the message
    assert files() == before  # no config.yaml rewrite, no checkpoint, no model, no lock file left
    with caplog.at_level(logging.WARNING, logger="aha.train"):
        assert grpo(tiny_dir, run, max_steps=4, resume=True).train() == {}  # a finished run: nothing to do
    assert any("already at max_steps=4: nothing to train" in r.getMessage() for r in caplog.records)
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-2", "checkpoint-4"]


# ------------------------------------------------------------------ run files a script or a tool can disturb
def test_save_model_into_output_dir_writes_beside_the_run_and_removes_nothing(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    run = tmp_path / "run"
    t = grpo(tiny_dir, run, max_steps=2, save_steps=1)
    t.train()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert {"config.yaml", "metrics.jsonl", ".aha-run.json"} <= before.keys()
    assert t.save_model(t.args.output_dir) == run  # the line TRL's scripts end with
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-1", "checkpoint-2"]
    assert {n: (run / n).read_bytes() for n in before} == before  # every run file as it was
    assert {p.name for p in run.iterdir()} - before.keys() - {"checkpoint-1", "checkpoint-2"} >= {
        "config.json", "model.safetensors"}
    assert not [p.name for p in run.iterdir() if p.name.startswith(".") and p.name not in before]  # no temp left
    assert_same(params(t.model), params(AutoModelForCausalLM.from_pretrained(run)))
    fresh = run / "final"
    fresh.mkdir()
    assert t.save_model(fresh) == fresh and (fresh / "config.json").is_file()  # an empty folder: replaced whole
    (run / "model").mkdir()
    (run / "model" / "stale.txt").write_text("an older save")
    t.save_model()
    assert not (run / "model" / "stale.txt").exists()  # the run's model/ is swapped whole, as before


def test_save_model_beside_other_files_removes_an_older_saves_weights_it_does_not_overwrite(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    t = grpo(tiny_dir, tmp_path / "run", max_steps=1)
    target = tmp_path / "out"
    target.mkdir()
    # an adapter (PEFT would load it in place of the merged weights) and a sharded save (its index wins)
    stale = ["adapter_config.json", "adapter_model.safetensors", "model-00001-of-00002.safetensors",
             "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"]
    others = ["metrics.jsonl", "config.yaml", "notes.txt", "my_model.bin"]
    for name in stale + others:
        (target / name).write_text(f"an older {name}")
    (target / "checkpoint-1").mkdir()
    assert t.save_model(target) == target
    assert [n for n in stale if (target / n).exists()] == []
    assert {n: (target / n).read_text() for n in others} == {n: f"an older {n}" for n in others}
    assert (target / "checkpoint-1").is_dir() and (target / "model.safetensors").is_file()
    assert_same(params(t.model), params(AutoModelForCausalLM.from_pretrained(target)))


def wander(where: str) -> str:
    """
    Changes the working directory of the process.

    Args:
        where: The folder to go to.
    """
    os.chdir(where)
    return "moved"


def turns(completions, **kw):
    return [float(len(c)) for c in completions]


def test_a_tool_that_changes_directory_cannot_split_the_run_folder(tiny_dir, tmp_path, monkeypatch):
    from scripted import ScriptedAgentEngine
    away = tmp_path / "away"
    away.mkdir()
    monkeypatch.chdir(tmp_path)
    call = f'<tool_call>{{"name": "wander", "arguments": {{"where": "{away}"}}}}</tool_call>'
    script = lambda c: call if "<|im_start|>tool" not in c else "ok"  # noqa: E731
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[turns], tools=[wander],
                    train_dataset=[{"prompt": [{"role": "user", "content": "go"}]}] * 4,
                    engine_factory=lambda m, tk, b: ScriptedAgentEngine(m, tk, b, script=script),
                    args=grpo_args("run", save_steps=1, num_generations=2, per_device_train_batch_size=4,
                                   max_completion_length=256))
    t.train()
    t.save_model()
    assert os.getcwd() == str(away) and list(away.iterdir()) == []  # the tool moved, the run stayed
    assert {"checkpoint-1", "checkpoint-2", "model", "metrics.jsonl", "config.yaml", ".aha-run.json"} <= {
        p.name for p in (tmp_path / "run").iterdir()}
    assert not (tmp_path / "run" / ".aha-lock").exists() and t.args.output_dir == str(tmp_path / "run")


def _agent_run(tiny_dir, run, factory=None, tools=None, **kw):
    from scripted import ScriptedAgentEngine
    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in range(2, 8)]
    return GRPOTrainer(model=tiny_dir, reward_funcs=[turns], train_dataset=rows, environment_factory=factory,
                       tools=tools, engine_factory=ScriptedAgentEngine,
                       args=grpo_args(run, **{**dict(num_generations=2, per_device_train_batch_size=4,
                                                     max_completion_length=256), **kw}))


def test_resume_from_python_refuses_another_environment_or_other_tools_naming_both(tiny_dir, tmp_path):
    from scripted import CounterEnv

    class Stepper(CounterEnv):
        """Another environment with the same tools."""

    run = tmp_path / "run"
    _agent_run(tiny_dir, run, CounterEnv, max_steps=1).train()
    theirs, ours = "scripted:CounterEnv", f"{__name__}:{Stepper.__qualname__}"
    with pytest.raises(ValueError, match=rf"environment: '{theirs}' -> '{ours}'"):
        _agent_run(tiny_dir, run, Stepper, resume=True).train()
    with pytest.raises(ValueError, match=rf"tools: \[\] -> \['{__name__}:wander'\]"):
        _agent_run(tiny_dir, run, CounterEnv, tools=[wander], resume=True).train()
    resumed = _agent_run(tiny_dir, run, CounterEnv, resume=True, tool_timeout=5.0)  # a time limit may change
    resumed.train()
    assert resumed.step_count == 2 and resumed.agent.tool_timeout == 5.0


def test_resume_of_an_agent_run_is_bit_exact_and_keeps_the_runs_share_prompts(tiny_dir, tmp_path):
    """share_prompts: auto is decided on the run's first batch (on: its prompts repeat, G = 2) and kept in the
    checkpoint, so the resumed run trains on with it and sends it to remote learners; the weights are bit-exact."""
    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}." + " word" * (10 * t)}], "target": t}
            for t in range(2, 8)]

    def run(path, **kw):
        from scripted import CounterEnv, ScriptedAgentEngine
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[turns], train_dataset=rows, environment_factory=CounterEnv,
                        engine_factory=ScriptedAgentEngine,
                        args=grpo_args(path, num_generations=2, per_device_train_batch_size=4,
                                       max_completion_length=256, **kw))
        t.train()
        return t

    full = run(tmp_path / "full", max_steps=4)
    run(tmp_path / "cut", max_steps=2)
    resumed = run(tmp_path / "cut", max_steps=4, resume=True)
    assert_same(params(full.model), params(resumed.model))
    shared = [json.loads(line)["perf/share_prompts"] for line in (tmp_path / "cut" / "metrics.jsonl").open()]
    assert shared == [1.0] * 4 and resumed.learner.state()["share"] is True  # what remote learners are sent
