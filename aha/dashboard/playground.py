"""The Learn GRPO playground: a real, small GRPO run on the demo's task with the epsilon, beta, G and learning
rate a person picked on the page.

The page can start only this fixed job, and only one at a time: a child process (its own process group) that
trains on column addition for a bounded number of steps, killed on cancel or when its wall-clock cap passes.
It writes a normal run directory (metrics.jsonl, groups.jsonl), which the dashboard reads like any other run.
Run as `python -m aha.dashboard.playground OUT_DIR PARAMS_JSON`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .explain import BadInput, _number

PROMPTS_PER_STEP = 4
"""B of a playground step (small, so a step takes about a second on one CPU core)."""
TRAIN_PROMPTS = 2000
"""Training problems drawn from the task."""
GRACE_S = 5.0
"""After SIGTERM, seconds before the job's process group is killed."""
LIMITS = {"epsilon": (0.01, 0.9, 0.2), "beta": (0.0, 1.0, 0.0), "num_generations": (2, 16, 4),
          "learning_rate": (1e-6, 1e-1, 5e-4)}
"""Parameter -> (lowest, highest, default) accepted from the page."""


def check_params(body: dict, max_steps: int) -> dict:
    """The page's request -> the job's parameters, each bounded; BadInput names the first bad one."""
    params = {k: _number(body, k, lo, hi, default) for k, (lo, hi, default) in LIMITS.items()}
    params["num_generations"] = int(params["num_generations"])
    params["max_steps"] = int(_number(body, "max_steps", 1, max_steps, min(10, max_steps)))
    return params


class Playground:
    """One playground job at a time under `root` (run-1, run-2, ...), each added to the run registry."""

    def __init__(self, root: Path, registry, model: str | None, max_steps: int, time_s: float):
        self.root, self.registry, self.model = Path(root), registry, model
        self.max_steps, self.time_s = max_steps, time_s
        self.lock = threading.Lock()
        self.jobs: list[dict] = []
        self.proc: subprocess.Popen | None = None

    def start(self, body: dict) -> dict:
        params = check_params(body, self.max_steps)
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                raise BadInput("a playground run is already going: cancel it or wait for it to end")
            run_id = f"playground/run-{len(self.jobs) + 1}-{int(time.time())}"
            out = self.root / run_id.split("/")[1]
            out.mkdir(parents=True, exist_ok=True)
            job = {"id": run_id, "params": params, "state": "running", "started": time.time()}
            log = open(out / "playground.log", "wb")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "aha.dashboard.playground", str(out), json.dumps({**params, "model": self.model})],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())
            log.close()
            self.jobs.append(job)
            self.registry.add(run_id, out)
            threading.Thread(target=self._watch, args=(self.proc, job), daemon=True).start()
            return job

    def _watch(self, proc: subprocess.Popen, job: dict) -> None:
        try:
            code = proc.wait(timeout=self.time_s)
            if job["state"] == "running":
                job["state"] = "finished" if code == 0 else f"failed (exit {code}; see playground.log)"
        except subprocess.TimeoutExpired:
            job["state"] = f"stopped at its time cap ({self.time_s:.0f} s)"
            self._kill(proc)

    def _kill(self, proc: subprocess.Popen) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=GRACE_S)
                return
            except subprocess.TimeoutExpired:
                continue

    def cancel(self) -> dict:
        with self.lock:
            proc, job = self.proc, self.jobs[-1] if self.jobs else None
        if proc is None or proc.poll() is not None or job is None:
            return {"cancelled": False, "reason": "no playground run is going"}
        job["state"] = "cancelled"
        self._kill(proc)
        return {"cancelled": True, "id": job["id"]}

    def status(self) -> dict:
        running = self.proc is not None and self.proc.poll() is None
        return {"running": running, "jobs": list(self.jobs), "max_steps": self.max_steps, "time_s": self.time_s,
                "limits": LIMITS}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill(self.proc)


def _base_model(root: Path, seed: int) -> str:
    """A tiny model built in code for the arithmetic task (once per playground directory)."""
    from ..models.tiny import make_tiny
    from ..tasks import get_task, task_corpus
    path = root / "base"
    if not (path / "config.json").is_file():
        make_tiny(path, task_corpus(get_task("arithmetic").load("train", TRAIN_PROMPTS, seed)), size="tiny", seed=seed)
    return str(path)


def run_job(out: Path, params: dict) -> None:
    """The job itself: GRPO on column addition (the demo's task) with the page's parameters."""
    import torch

    from ..config import GRPOConfig
    from ..tasks import get_task
    from ..train.grpo import GRPOTrainer
    torch.set_num_threads(1)
    task, G = get_task("arithmetic"), params["num_generations"]
    model = params.get("model") or _base_model(out.parent, 0)
    cfg = GRPOConfig(output_dir=str(out), model=model, learning_rate=params["learning_rate"],
                     max_steps=params["max_steps"], num_generations=G, per_device_train_batch_size=PROMPTS_PER_STEP * G,
                     epsilon=params["epsilon"], beta=params["beta"], max_completion_length=task.max_completion_length,
                     reward_weights=task.reward_weights, report_to=["jsonl"], progress_bar=False, log_groups_steps=1,
                     log_completions_steps=0, seed=0, threads=1)
    GRPOTrainer(model=model, reward_funcs=task.rewards(), args=cfg,
                train_dataset=task.load("train", TRAIN_PROMPTS, 0)).train()


if __name__ == "__main__":
    run_job(Path(sys.argv[1]), json.loads(sys.argv[2]))
