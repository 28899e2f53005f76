"""The Ray layer (aha.dist) on one machine: equivalence with the single process, the staleness bound, faults.

One local Ray instance (127.0.0.1) serves the whole module; every test checks that the actors it started
are gone afterwards, and the module checks that Ray's own processes are gone after shutdown.
"""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from aha.config import ConfigError, GRPOConfig
from aha.train.grpo import GRPOTrainer
from aha.train.loop import PromptSampler
from scripted import CounterEnv, ScriptedAgentEngine, ScriptedEngine

ray = pytest.importorskip("ray")

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def slow_digit_share(prompts, completions, **kw):
    time.sleep(0.6)  # long enough that a kill lands while a call is in flight
    return digit_share(prompts, completions)


def slow_engine(model, tokenizer, max_batch=512):
    return ScriptedEngine(model, tokenizer, max_batch, delay=0.6)


def args(path, **kw):
    base = dict(output_dir=str(path), max_steps=3, num_generations=4, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_completion_length=8, learning_rate=1e-2, progress_bar=False,
                report_to=["jsonl"], log_completions_steps=0, seed=0, dist_timeout=120)
    return GRPOConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def ray_local():
    from aha.dist.cluster import connect
    connect(None, 8)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _ray_children():
        time.sleep(0.2)
    assert not _ray_children(), _ray_children()  # nothing of Ray outlives the module


def _ray_children() -> list[str]:
    return [p.name() for p in _ray_processes() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _gone(pids, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.2)
    return False


def _pids(pipeline) -> list[int]:
    return ray.get([w.pid.remote() for w in pipeline.rollout + pipeline.reward + pipeline.learners],
                   timeout=120)  # actors that start under load (as dist_timeout in these tests)


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _record(trainer):
    """Record every trained batch (its prompts, versions and the learner version it met) on the local learner."""
    seen, real = [], trainer.learner.update

    def update(batch):
        seen.append({"prompts": [r["prompt"] for r in batch.rows], "versions": batch.versions.clone(),
                     "at": trainer.learner.version})
        return real(batch)
    trainer.learner.update = update
    return seen


def test_distributed_needs_workers_for_staleness():
    with pytest.raises(ConfigError, match="max_staleness=1 .* num_rollout_workers"):
        GRPOConfig(max_staleness=1)
    assert not GRPOConfig().distributed and GRPOConfig(num_learners=2).distributed


def test_rollout_workers_train_exactly_as_one_process(tiny_dir, tmp_path, ray_local):
    """num_rollout_workers=2, max_staleness=0 and reward workers: the same rollouts give bitwise the same weights."""
    one = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "one"), train_dataset=PROMPTS,
                      engine_factory=ScriptedEngine)
    start = _weights(one.model)
    one.train()
    dist = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=ScriptedEngine,
                       args=args(tmp_path / "dist", num_rollout_workers=2, num_reward_workers=1))
    pids = _pids(dist.pipeline)
    metrics = dist.train()
    a, b = _weights(one.model), _weights(dist.model)
    assert any(not torch.equal(a[n], start[n]) for n in a)  # it did train
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert metrics["dist/staleness_max"] == 0 and metrics["dist/groups_trained"] == 2
    assert metrics["sync/bytes"] > 0 and 0 < metrics["dist/rollout_busy"]
    assert _gone(pids)


def test_two_learners_match_one_process_on_the_same_batches(tiny_dir, tmp_path, ray_local):
    """num_learners=2 (gloo), whole replicas or FSDP2 shards: gradients summed over ranks with whole-minibatch
    denominators = one process.
    Only float summation order differs (the micro-batches are split differently); Adam divides by sqrt(v),
    which turns a rounding difference in a near-zero gradient into a visible one on a few weights, so the
    bound is on the whole update: the two runs' weights differ by < 1e-4 of the update's norm."""
    cases = [(dict(loss_type="dapo"), "replicate"), (dict(loss_type="grpo", beta=0.05, num_iterations=2), "replicate"),
             (dict(loss_type="grpo", beta=0.05, num_iterations=2), "fsdp"),
             (dict(loss_type="grpo", beta=0.05, share_prompts=True), "replicate")]
    for k, (kw, sharding) in enumerate(cases):
        one = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                          engine_factory=ScriptedEngine, args=args(tmp_path / f"one{k}", **kw))
        start = _weights(one.model)
        one.train()
        dist = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                           engine_factory=ScriptedEngine,
                           args=args(tmp_path / f"two{k}", num_learners=2, learner_sharding=sharding, **kw))
        pids = _pids(dist.pipeline)
        held = ray.get([w.local_elements.remote() for w in dist.pipeline.learners], timeout=60)
        whole = sum(p.numel() for p in dist.model.parameters())
        assert held == [whole] * 2 if sharding == "replicate" else max(held) < 0.6 * whole, (held, whole)
        dist.train()
        a, b = _weights(one.model), _weights(dist.model)
        update = torch.cat([(a[n] - start[n]).flatten() for n in a]).norm()
        gap = torch.cat([(b[n] - a[n]).flatten() for n in a]).norm()
        assert update > 0.1 and gap < 1e-4 * update, (gap, update)
        assert _gone(pids)


def test_staleness_is_bounded_and_stale_tokens_are_reweighted(tiny_dir, tmp_path, ray_local):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path / "async", max_steps=4, num_rollout_workers=2, max_staleness=1))
    seen = _record(t)
    metrics = t.train()
    lags = [int((s["at"] - s["versions"]).max()) for s in seen]
    assert max(lags) <= 1 and lags[0] == 0 and 1 in lags, lags  # step 0 is fresh; later ones overlap
    assert metrics["offpolicy/is_weight_max"] <= t.args.off_policy_is_cap
    assert 0 < metrics["offpolicy/is_weight_mean"] and 0 <= metrics["offpolicy/is_clipped_frac"] <= 1
    assert metrics["offpolicy/stale_token_frac"] == pytest.approx(1.0)


def _expected_prompts(n_steps, B=2, rows=PROMPTS):
    sampler = PromptSampler(len(rows), seed=0)
    return [[rows[i]["prompt"] for i in sampler.take(B)] for _ in range(n_steps)]


AGENT_ROWS = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in range(2, 12)]


def counter_reached(completions, environments, target, **kw):
    """Reads the environments: on Ray it runs on the rollout worker, beside them."""
    return [0.5 * (e.counter >= t) for e, t in zip(environments, target)]


def few_turns(completions, **kw):
    """Needs no environment: on Ray it runs on a reward worker."""
    return [-0.1 * len(c) for c in completions]


def agent_trainer(path, tiny_dir, engine=ScriptedAgentEngine, **kw):
    return GRPOTrainer(model=tiny_dir, reward_funcs=[counter_reached, few_turns], train_dataset=AGENT_ROWS,
                       environment_factory=CounterEnv, engine_factory=engine,
                       args=args(path, max_completion_length=1024, **kw))


def slow_agent_engine(model, tokenizer, max_batch=512):
    return ScriptedAgentEngine(model, tokenizer, max_batch, delay=0.6)


def test_rollout_workers_run_episodes_exactly_as_one_process(tiny_dir, tmp_path, ray_local):
    """Multi-turn: the environments live on the rollout workers (their get_reward and `environments=` rewards are
    scored there, the rest on a reward worker), and the same episodes give bitwise the same weights."""
    one = agent_trainer(tmp_path / "one", tiny_dir)
    start = _weights(one.model)
    m1 = one.train()
    dist = agent_trainer(tmp_path / "dist", tiny_dir, num_rollout_workers=2, num_reward_workers=1)
    pids, resets = _pids(dist.pipeline), CounterEnv.resets
    m2 = dist.train()
    a, b = _weights(one.model), _weights(dist.model)
    assert any(not torch.equal(a[n], start[n]) for n in a)
    assert all(torch.equal(a[n], b[n]) for n in a)
    for k in ("tools/calls_per_episode", "tools/env_tokens_per_episode", "reward/CounterEnv/mean",
              "reward/counter_reached/mean", "reward/few_turns/mean", "loss"):
        assert m1[k] == m2[k], k
    assert m2["tools/calls_per_episode"] == 3 and CounterEnv.resets == resets  # none ran in this process
    assert _gone(pids)


def test_a_hanging_tool_is_cut_on_a_rollout_worker(tiny_dir, tmp_path, ray_local):
    import aha.envs as envs

    class Stuck:
        def reset(self, **kw):
            return None

        def wait(self, seconds: int) -> str:
            """
            Waits.

            Args:
                seconds: How long.
            """
            time.sleep(seconds)
            return "done"
    script = lambda c: ('<tool_call>{"name": "wait", "arguments": {"seconds": 300}}</tool_call>'  # noqa: E731
                        if "<|im_start|>tool" not in c else "ok")
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[few_turns], train_dataset=AGENT_ROWS, environment_factory=Stuck,
                    engine_factory=lambda m, tk, b: ScriptedAgentEngine(m, tk, b, script=script),
                    args=args(tmp_path / "stuck", max_steps=1, max_completion_length=1024, num_rollout_workers=1,
                              tool_timeout=1.0))
    assert isinstance(t.agent, envs.Agent)
    start = time.monotonic()
    m = t.train()
    assert m["tools/timeouts"] == 8 and time.monotonic() - start < 100


class KillAt:
    """A TrainerCallback that SIGKILLs one process when a step ends (a worker dying mid-run)."""

    def __init__(self, step, pid):
        self.step, self.pid, self.killed = step, pid, False

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True


@pytest.mark.parametrize("which", ["rollout", "reward", "episodes"])
def test_a_killed_worker_is_restarted_and_nothing_is_lost(tiny_dir, tmp_path, ray_local, which):
    """The worker dies with a call in flight (the next step's, max_staleness=1): Ray restarts it, the driver
    re-issues its groups, and every step trains exactly the prompts the sampler drew, once. `episodes`: a rollout
    worker running multi-turn episodes (its environments die with it; the restarted one builds new ones)."""
    kw = dict(max_steps=4, num_rollout_workers=2, num_reward_workers=1, max_staleness=1)
    if which == "episodes":
        t, rows = agent_trainer(tmp_path / which, tiny_dir, engine=slow_agent_engine, **kw), AGENT_ROWS
    else:
        engine = slow_engine if which == "rollout" else ScriptedEngine
        reward = digit_share if which == "rollout" else slow_digit_share
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[reward], train_dataset=PROMPTS, engine_factory=engine,
                        args=args(tmp_path / which, **kw))
        rows = PROMPTS
    victim = ray.get((t.pipeline.reward if which == "reward" else t.pipeline.rollout)[0].pid.remote())
    kill = KillAt(1, victim)
    t.callback_objects.append(kill)
    seen = _record(t)
    t.train()
    assert kill.killed and _gone([victim])
    assert [s["prompts"] for s in seen] == _expected_prompts(4, rows=rows)
    rows = [__import__("json").loads(line) for line in (tmp_path / which / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["dist/groups_reissued"] for r in rows) >= 1
    assert sum(r["dist/groups_trained"] for r in rows) == 4 * 2
    assert max(int((s["at"] - s["versions"]).max()) for s in seen) <= 1  # the restarted worker synced first


def test_a_dead_learner_fails_the_run_with_its_rank(tiny_dir, tmp_path, ray_local):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=ScriptedEngine,
                    args=args(tmp_path / "dead", num_learners=2))
    pids = _pids(t.pipeline)
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="learner rank 1 died"):
        t.train()
    assert time.monotonic() - start < 60
    assert _gone(pids)


DRIVER = """
import time
from aha.config import GRPOConfig
from aha.rollout import Rollout
from aha.train.grpo import GRPOTrainer

PROMPTS = [{{"prompt": f"{{a}}+{{b}}=", "answer": str(a + b)}} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


class SlowEngine:  # defined here, in __main__, so Ray ships it by value to the workers
    def __init__(self, model, tokenizer, max_batch=512):
        self.version = 0

    def update_weights(self, model, version):
        self.version = version

    def generate(self, prompt_ids, n, params, generator=None):
        time.sleep(0.3)
        out = [[(p[-1] + j) % 50 + 3] * 4 for p in prompt_ids for j in range(n)]
        return Rollout(completion_ids=out, truncated=[True] * len(out), version=self.version)


cfg = GRPOConfig(output_dir={out!r}, max_steps=6, save_steps=1, num_generations=4, per_device_train_batch_size=8,
                 max_completion_length=4, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                 log_completions_steps=0, num_rollout_workers=1, ray_address={address!r}, resume={resume},
                 dist_timeout=120)
t = GRPOTrainer(model={model!r}, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=SlowEngine, args=cfg)
t.train()
print("finished at", t.step_count)
"""


def test_a_killed_driver_resumes_from_its_last_checkpoint(tiny_dir, tmp_path, ray_local):
    out = tmp_path / "driver"

    def script(resume):
        return DRIVER.format(address=ray_local, model=tiny_dir, out=str(out), resume=resume)
    proc = subprocess.Popen([sys.executable, "-c", script(False)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint-2" / "trainer_state.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the driver did not write checkpoint-2: {proc.communicate()[0].decode()[-3000:]}")
        time.sleep(0.1)
    proc.kill()  # the driver dies mid-run, without a chance to clean up
    proc.wait(timeout=30)
    done = subprocess.run([sys.executable, "-c", script(True)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "finished at 6" in done.stdout
    steps = [__import__("json").loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 6  # rows after the checkpoint were cut, none twice


def test_the_command_line_runs_the_distributed_path(tiny_dir, tmp_path, ray_local):
    """`aha train ... num_rollout_workers=2 num_learners=2 max_staleness=1` trains through the Ray layer."""
    import json

    from aha.cli import main
    out = tmp_path / "cli"
    code = main(["train", f"model={tiny_dir}", "task=arithmetic", f"output_dir={out}", "max_steps=2",
                 "num_generations=4", "per_device_train_batch_size=8", "max_completion_length=8", "eval_steps=0",
                 "progress_bar=false", "log_completions_steps=0", "num_rollout_workers=2", "num_learners=2",
                 "max_staleness=1", "dist_timeout=120"])
    assert code in (0, None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["dist/staleness_max"] == 1
    assert (out / "model" / "config.json").is_file()


def test_ray_listens_on_loopback_only(ray_local):
    """Every socket the local Ray instance's processes (GCS, raylet, agents, workers) listen on is bound to
    127.0.0.1. Other children of the test process (trackers' services of earlier tests) are not Ray's."""
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    listening = [(p.name(), c.laddr.ip) for p in _ray_processes()
                 for c in _connections(p) if c.status == psutil.CONN_LISTEN]
    assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, ip in listening), listening


def _ray_processes() -> list:
    def is_ray(p):
        try:
            return "ray" in " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
    return [p for p in psutil.Process().children(recursive=True) if is_ray(p)]


def _connections(proc):
    try:
        return proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def test_lora_ships_only_the_adapters_to_rollout_workers(tiny_dir, tmp_path, ray_local):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path / "lora", use_lora=True, lora_r=4, beta=0.04, num_rollout_workers=1,
                              num_learners=2, max_steps=2))
    adapters = sum(p.numel() * p.element_size() for p in t.model.parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    metrics = t.train()
    assert metrics["sync/bytes"] == adapters  # one worker loaded one version: the trainable (LoRA) weights only
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


def test_sharded_learners_checkpoint_and_resume(tiny_dir, tmp_path, ray_local):
    """FSDP2 learners: the driver's checkpoint gathers their whole state; a resumed run hands it back to them
    and goes on where the uninterrupted run would (same weights to 1e-4 of the update, as above)."""
    kw = dict(num_learners=2, learner_sharding="fsdp", beta=0.05, save_steps=2, max_steps=3)
    full = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=ScriptedEngine,
                       args=args(tmp_path / "full", **kw))
    start = _weights(full.model)
    full.train()
    cut = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=ScriptedEngine,
                      args=args(tmp_path / "cut", **{**kw, "max_steps": 2}))
    cut.train()
    resumed = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                          engine_factory=ScriptedEngine, args=args(tmp_path / "cut", resume=True, **kw))
    resumed.train()
    assert resumed.step_count == 3
    a, b = _weights(full.model), _weights(resumed.model)
    update = torch.cat([(a[n] - start[n]).flatten() for n in a]).norm()
    assert torch.cat([(b[n] - a[n]).flatten() for n in a]).norm() < 1e-4 * update


def test_workers_that_cannot_be_placed_fail_clearly_and_leave_nothing(tiny_dir, tmp_path, ray_local):
    with pytest.raises(TimeoutError, match="could not place 12 one-CPU actors .* the cluster has 8 CPUs"):
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path / "big", num_rollout_workers=12, dist_timeout=2))
    groups = ray.util.placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups), [g["state"] for g in groups]
