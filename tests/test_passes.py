"""aha.train.passes: the forward/backward passes aha chooses when max_tokens_per_micro_batch and share_prompts are
left unset (the defaults), against hand-worked batches, the gradient of one pass, and the README's configurations."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest
import torch

from aha import GRPOConfig, GRPOTrainer
from aha.config import parse_args
from aha.train import passes
from aha.train.passes import Passes, choose, share_prompts

GiB = 2**30


def model_of(**shape):
    """A module whose config has the given shape (float32 parameters)."""
    m = torch.nn.Linear(2, 2)
    m.config = NS(**{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
                     "vocab_size": 1000, **shape})
    return m


def batch_of(prompt_lens: list[int], completion_lens: list[int], G: int):
    """Rows in groups of G: row i's prompt is group i // G's (one token value per group)."""
    return NS(prompt_ids=[[i // G + 1] * n for i, n in enumerate(prompt_lens)],
              completion_ids=[[7] * n for n in completion_lens], group_size=G)


def config(**kw):
    return GRPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=8, **kw)


def test_a_cpu_cuts_long_batches_into_1024_token_passes_and_leaves_short_ones():
    m, args = model_of(), config()
    short = batch_of([20] * 8, [30, 5, 200, 40, 8, 9, 10, 11], 4)          # longest 220 <= LONG (256)
    long = batch_of([20] * 8, [30, 5, 300, 40, 8, 9, 10, 11], 4)           # longest 320
    assert choose(args, short, m, 24 * GiB, "cpu", False) == Passes(0, False)
    assert choose(args, long, m, 24 * GiB, "cpu", False) == Passes(passes.CPU_PASS_TOKENS, False)
    assert choose(args, long, m, 24 * GiB, "cuda", True) == Passes(0, True)  # a GPU wants big passes: it fits


def test_a_pass_that_does_not_fit_memory_is_cut_to_the_tokens_that_do():
    """Hand-computed with bytes_per_token's formula: 2 layers x (8 x 64 + 4 x 256 + 4 heads x width) x 4 bytes
    of activations per token and 2 x 1000 x 4 bytes of logits per completion position."""
    m, args = model_of(), config()
    b = batch_of([10] * 8, [100] * 8, 4)                                    # width 110
    act, logit = 2 * (8 * 64 + 4 * 256 + 4 * 110) * 4, 2 * 1000 * 4
    assert (act, logit) == passes.bytes_per_token(m, 110, 4) == (15_808, 8_000)
    one_pass = 20_375_040                       # 15,808 x 8 rows x 110 tokens + 8,000 x 8 rows x 101 positions
    assert passes.pass_bytes(m, b.prompt_ids, b.completion_ids, False, 4) == one_pass
    assert passes.pass_bytes(m, b.prompt_ids, b.completion_ids, True, 4) == 15_808 * (2 * 10 + 8 * 101) + 6_464_000
    memory = 4 * one_pass - 4                                               # a quarter of it: just too small
    assert choose(args, b, m, memory, "cuda", False) == Passes(int((memory / 4) // (act + logit)), False)
    assert choose(args, b, m, 4 * one_pass, "cuda", False) == Passes(0, False)
    assert choose(args, b, m, memory, "cpu", False).tokens == int((memory / 4) // (act + logit))  # under 1,024 too


def test_prompts_are_shared_whenever_they_repeat():
    assert share_prompts(config(), batch_of([20] * 8, [10] * 8, 4))
    assert share_prompts(config(), batch_of([20] * 8, [500] * 8, 4))                    # short against completions
    distinct = NS(prompt_ids=[[i] * 20 for i in range(8)], completion_ids=[[7]] * 8, group_size=4)
    assert not share_prompts(config(), distinct)                                        # nothing repeats
    assert not share_prompts(config(gradient_checkpointing=True), batch_of([20] * 8, [1] * 8, 4))
    assert not share_prompts(config(share_prompts=False), batch_of([20] * 8, [1] * 8, 4))
    assert share_prompts(config(share_prompts=True), batch_of([2] * 8, [100] * 8, 4))


def test_a_shared_pass_counts_each_prompt_once_against_the_token_budget():
    """Hand-checked, as completion_logprobs pads a shared pass: distinct prompts x longest prompt + rows x (longest
    completion + 1). Groups of 4 with 20-token prompts and 30-token completions: one group is 20 + 4 x 31 = 144
    tokens, where counting the prompt on every row would make it 4 x 50 = 200."""
    from aha.train.learner import Learner
    b = batch_of([20] * 8, [30] * 8, 4)
    cut = lambda budget, share: Learner.micro_batches(  # noqa: E731
        NS(args=NS(per_device_train_batch_size=8), passes=Passes(budget, share)), b, list(range(8)))
    assert cut(144, True) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # 20 + 3 x 31 = 113, a 4th row makes 144; then rows 3-5 span two prompts: 2 x 20 + 3 x 31 = 133 (a 4th: 164)
    assert cut(143, True) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert cut(144, False) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # 3 x 50 = 150 > 144
    assert cut(288, True) == [[0, 1, 2, 3, 4, 5, 6, 7]]         # 2 x 20 + 8 x 31 = 288


def test_a_users_token_budget_wins():
    m, long = model_of(), batch_of([40] * 8, [300, 2, 2, 2, 2, 2, 2, 2], 4)
    assert choose(config(max_tokens_per_micro_batch=0), long, m, 24 * GiB, "cpu", False) == Passes(0, False)
    assert choose(config(max_tokens_per_micro_batch=77), long, m, 24 * GiB, "cuda", True) == Passes(77, True)
    assert choose(config(), long, m, 24 * GiB, "cpu", False) == Passes(passes.CPU_PASS_TOKENS, False)


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def test_the_automatic_passes_give_the_gradient_of_one_pass(tiny_dir, tmp_path, monkeypatch):
    """With the CPU rule's thresholds lowered so that the tiny model's batches count as long, the automatic choice
    cuts length-sorted passes (reference and policy), records it each step, and the first update's gradient is the
    one of a single pass (max_tokens_per_micro_batch=0); a user's 0 is kept."""
    import aha.train.learner as learner_mod
    real_step, real_lp, grads, calls = learner_mod.optimizer_step, learner_mod.completion_logprobs, [], []

    def capture(cfg, model, opt, sched, *rest):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real_step(cfg, model, opt, sched, *rest)

    def count(model, prompts, completions, *a, **k):
        calls[-1].append((len(prompts), len(prompts) * (max(map(len, prompts)) + max(map(len, completions)))))
        return real_lp(model, prompts, completions, *a, **k)

    monkeypatch.setattr(learner_mod, "optimizer_step", capture)
    monkeypatch.setattr(learner_mod, "completion_logprobs", count)
    monkeypatch.setattr(passes, "LONG", 4)
    monkeypatch.setattr(passes, "CPU_PASS_TOKENS", 60)
    data = [{"prompt": "1+" * k + "1="} for k in range(1, 12)]
    for name, kw in (("one", dict(max_tokens_per_micro_batch=0)), ("auto", {})):
        calls.append([])
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=data, args=GRPOConfig(
            output_dir=str(tmp_path / name), max_steps=1, beta=0.04, num_generations=4, per_device_train_batch_size=8,
            max_completion_length=16, report_to=["jsonl"], progress_bar=False, log_completions_steps=0, seed=3,
            share_prompts=False, **kw)).train()
    one, auto = grads
    assert max(g.abs().max().item() for g in one.values()) > 1e-3
    for n in one:
        torch.testing.assert_close(one[n], auto[n], rtol=1e-4, atol=1e-7)
    assert len(calls[0]) == 2 and len(calls[1]) > 2                      # reference + policy: one pass each, or cut
    assert all(tokens <= 60 or n == 1 for n, tokens in calls[1]) and calls[0][0][1] > 60
    rows = [json.loads(line) for line in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "perf/pass_tokens" in r)
    assert step["perf/pass_tokens"] == 60 and step["perf/share_prompts"] == 0
    rows = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert next(r for r in rows if "perf/pass_tokens" in r)["perf/pass_tokens"] == 0


README_CONFIGS = ["grpo_arithmetic.yaml", "recipe_arithmetic.yaml", "recipe_prm_arithmetic.yaml",
                  "grpo_smollm2_mix.yaml", "grpo_smollm2_steps.yaml", "grpo_smollm2_lora.yaml"]


def grpo_stages(name: str) -> list[GRPOConfig]:
    """The GRPO configs a shipped example runs (a recipe's GRPO stages)."""
    from importlib.resources import files
    import yaml
    path = files("aha") / "examples" / name
    raw = yaml.safe_load(path.read_text())
    if "stages" not in raw:
        return [parse_args(GRPOConfig, [str(path), "output_dir=unused"])]
    return [GRPOConfig(**{k: v for k, v in s.items() if k not in ("type", "name", "model", "prm_model")})
            for s in raw["stages"] if s.get("type") == "grpo"]


@pytest.mark.parametrize("name", README_CONFIGS)
def test_the_readme_configurations_keep_their_passes(name):
    """Their recorded runs were made with one pass per per_device_train_batch_size sequences: on the 24 GiB 2-core
    machines they were measured on, the automatic token budget is the same (no cut) for every batch their lengths
    allow, with share_prompts as set or either way where aha chooses it (completions up to max_completion_length; the chat prompts of SmolLM2-135M up to 96 tokens, of the models
    built in code up to 32: 23-24 measured), shared prompts or not, for SmolLM2-135M's shape or, for the models built
    in code, the "demo" size (larger than the examples' "small") with a 4,096-token vocabulary (theirs: 1,024 or
    fewer)."""
    smollm2 = model_of(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, intermediate_size=1536,
                       vocab_size=49152)
    built = model_of(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=768,
                     vocab_size=4096)
    m, prompts = (smollm2, (8, 48, 96)) if "smollm2" in name else (built, (8, 24, 32))
    for cfg in grpo_stages(name):
        G, n = cfg.num_generations, cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
        for P in prompts:
            for C in (1, cfg.max_completion_length):
                for share in (False, True) if cfg.share_prompts is None else (cfg.share_prompts,):
                    assert choose(cfg, batch_of([P] * n, [C] * n, G), m, 24 * GiB, "cpu", share).tokens == 0, \
                        (name, P, C, share)


def test_the_demos_keep_the_passes_of_their_recorded_runs(tmp_path, monkeypatch):
    """The recorded runs of the arithmetic demos (default, aha moment, process) ran without shared prompts; aha
    would share them now, so the demo's GRPOConfig says so, and an override still wins."""
    import aha.train.grpo as grpo
    from aha.demo import default
    seen = []

    class Stop(Exception):
        pass

    def capture(model, reward_funcs, args, **kw):
        seen.append(args)
        raise Stop

    monkeypatch.setattr(grpo, "GRPOTrainer", capture)
    cfg = default.DemoConfig(**default.DEFAULTS)
    task = NS(max_completion_length=32, reward_weights=None)
    for overrides in ({}, {"share_prompts": True}):
        with pytest.raises(Stop):
            default.train_grpo(cfg, tmp_path, tmp_path, task, [], [], [], eval_fn=lambda *a: None, **overrides)
    assert [a.share_prompts for a in seen] == [False, True]
