"""The experience box and the token-level batch: single-turn results unchanged, tool tokens out of the loss."""

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from aha.config import ConfigError, GRPOConfig
from aha.batch import GRPOBatch
from aha.train.grpo import GRPOTrainer
from scripted import PARITY_CASES as CASES
from scripted import ScriptedEngine

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
GOLDEN = Path(__file__).parent / "data" / "single_turn_golden.json"
"""Metrics of 3-step runs on scripted completions, written by benchmarks/single_turn_parity.py --scripted with the
trainer as it was before batches became token-level (commit 250b814)."""
UNCOMPARED = ("perf/", "dist/", "sync/", "behaviour/")
"""Timings, and the behaviour metrics (their own module's tests pin them)."""


def ids_mod3(prompts, completions, completion_ids, **kw):
    return [float(sum(ids) % 3) for ids in completion_ids]


def args(path, **kw):
    base = dict(output_dir=str(path), max_steps=3, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=12, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=1, log_groups_steps=1, seed=0)
    return GRPOConfig(**{**base, **kw})


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_turn_metrics_are_those_before_token_level_batches(tiny_dir, tmp_path, case):
    """Every loss type, advantage estimator and KL estimator, on the same completions, gives the metrics it gave
    when a batch held one advantage per sequence and no loss mask. On the machine that wrote them they are equal to
    the bit (benchmarks/single_turn_parity.py compares sampled runs too); another CPU's kernels sum in another
    order, hence the tolerance."""
    torch.set_num_threads(1)
    try:
        GRPOTrainer(model=tiny_dir, reward_funcs=[ids_mod3], args=args(tmp_path, **CASES[case]),
                    train_dataset=PROMPTS, engine_factory=ScriptedEngine).train()
    finally:
        torch.set_num_threads(2)
    got = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    want = json.loads(GOLDEN.read_text())[case]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        keys = {k for k in w if not k.startswith(UNCOMPARED)}
        assert keys <= set(g), keys - set(g)
        for k in sorted(keys):
            if isinstance(w[k], float) and math.isnan(w[k]):
                assert math.isnan(g[k]), k
            else:
                assert g[k] == pytest.approx(w[k], rel=1e-4, abs=1e-6), (case, g["step"], k)


def test_the_step_never_asks_where_its_batch_comes_from():
    """The single process and the Ray pipeline answer the same calls: no branch on the pipeline in the step."""
    source = inspect.getsource(GRPOTrainer.step)
    assert "pipeline" not in source and "distributed" not in source


def test_an_engine_is_chosen_by_name(tiny_dir, tmp_path, monkeypatch):
    from aha.rollout import engines
    with pytest.raises(ConfigError, match=r"unknown engine 'vllm'; valid: \['hf'\]"):
        GRPOConfig(engine="vllm")
    monkeypatch.setitem(engines.ENGINES, "scripted", "scripted:ScriptedEngine")  # one registry line
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[ids_mod3], train_dataset=PROMPTS,
                    args=args(tmp_path, engine="scripted", max_steps=1))
    assert isinstance(t.engine, ScriptedEngine)
    assert t.step()["completion/len_max"] >= 1


# ------------------------------------------------------------------ token level
def _learner(tiny_dir, **kw):
    from transformers import AutoModelForCausalLM

    from aha.train.learner import Learner
    cfg = GRPOConfig(report_to=["none"], num_generations=2, per_device_train_batch_size=4, max_completion_length=8,
                     **kw)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    return Learner(cfg, model, 0, torch.Generator().manual_seed(0), 1)


def _episode_batch(adv=(1.0, -1.0, 0.5, -0.5), garbage: float = 0.0) -> GRPOBatch:
    """Four episodes: model tokens, then 3 tool tokens (mask 0), then model tokens again. `garbage` lands on the
    tool tokens' advantages and behaviour log-probs only."""
    comps = [[20, 21, 2, 40, 41, 42, 22, 2], [30, 2, 40, 41, 42, 31, 32, 2], [23, 24, 25, 2], [33, 2, 40, 41, 42, 34]]
    masks = [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0, 0, 1]]
    loss_mask = [torch.tensor(m) for m in masks]
    batch = GRPOBatch(rows=[{"prompt": "a"}, {"prompt": "b"}], prompt_ids=[[10, 11]] * 2 + [[12, 13]] * 2,
                      completion_ids=comps, texts=[""] * 4, truncated=torch.zeros(4, dtype=torch.bool),
                      rewards_per_func=torch.zeros(4, 1), rewards=torch.zeros(4), advantages=torch.tensor(adv),
                      versions=torch.zeros(4, dtype=torch.long), loss_mask=loss_mask)
    batch.token_advantages = [t + garbage * (1 - m) for t, m in zip(batch.token_advantages, loss_mask)]
    return batch


def _grads(learner, batch) -> dict:
    grads = {}
    real = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: grads.update(
        {n: p.grad.clone() for n, p in learner.model.named_parameters()}) or real(*a, **k)
    learner.update(batch)
    return grads


@pytest.mark.parametrize("kw", [dict(loss_type="dapo"), dict(loss_type="grpo", beta=0.05),
                                dict(loss_type="dr_grpo", importance_sampling_level="sequence")])
def test_tool_tokens_carry_no_gradient(tiny_dir, kw):
    """Perturbation: whatever advantage a tool token carries, the update's gradient is the same to the bit, and
    the loss's gradient with respect to a tool token's log-prob is exactly 0."""
    import aha.train.learner as learner_mod
    seen = []
    real = learner_mod.completion_logprobs

    def keep_grad(*a, **k):
        logp, mask, ent = real(*a, **k)
        if logp.requires_grad:
            logp.retain_grad()
            seen.append(logp)
        return logp, mask, ent
    base = _grads(_learner(tiny_dir, **kw), _episode_batch())
    learner_mod.completion_logprobs = keep_grad
    try:
        moved = _grads(_learner(tiny_dir, **kw), _episode_batch(garbage=123.0))
    finally:
        learner_mod.completion_logprobs = real
    assert max(g.abs().max().item() for g in base.values()) > 0  # a real gradient
    assert all(torch.equal(base[n], moved[n]) for n in base)
    grad = torch.cat([s.grad for s in seen])                                       # [4,8] rows in pass order
    assert (grad == 0).sum() >= 9 + 6  # the 9 tool tokens and the 6 padding positions (at least)
    assert (grad != 0).sum() > 0


def test_denominators_and_token_means_count_model_tokens_only(tiny_dir, monkeypatch):
    import aha.train.learner as learner_mod
    seen, real = [], learner_mod.algos.aggregate
    monkeypatch.setattr(learner_mod.algos, "aggregate", lambda name, loss, mask, **d: seen.append(
        (d, mask.detach().clone())) or real(name, loss, mask, **d))
    learner = _learner(tiny_dir, loss_type="dapo", beta=0.05)
    batch = _episode_batch()
    sums, metrics = learner.update(batch)
    model_tokens = sum(int(m.sum()) for m in batch.loss_mask)                      # 5 + 5 + 4 + 3 = 17
    assert model_tokens == 17 and [d["num_tokens"] for d, _ in seen] == [17]
    assert sums.tokens == 17 and float(seen[0][1].sum()) == 17
    assert metrics["entropy"] == pytest.approx(sums.entropy / 17) and metrics["kl"] == pytest.approx(sums.kl / 17)
    assert 0 <= metrics["clip/low"] <= 1 and batch.model_tokens.tolist() == [5, 5, 4, 3]


def test_a_batch_broadcasts_each_advantage_over_its_model_tokens():
    batch = _episode_batch(adv=(2.0, -1.0, 0.5, 0.0))
    assert batch.token_advantages[0].tolist() == [2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 2.0, 2.0]
    assert batch.token_advantages[2].tolist() == [0.5] * 4
    joined = GRPOBatch.cat([batch, batch.groups([1])])
    assert len(joined.loss_mask) == 6 and torch.equal(joined.loss_mask[5], batch.loss_mask[3])
