"""The GRPO loop end to end on a tiny model built in code: learning signal, metrics, resume, LoRA."""

import asyncio
import math
import threading

import pytest
import torch

from aha.config import GRPOConfig
from aha.rollout import HFEngine
from aha.train.grpo import GRPOTrainer

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    """Graded reward: share of digits in the completion (varies inside every group from step 1)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, seed=0)
    return GRPOConfig(**{**base, **kw})


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_smoke_trains_and_every_metric_is_finite(tiny_dir, tmp_path):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, beta=0.04, num_iterations=2),
                    train_dataset=PROMPTS)
    before = params(t.model)
    metrics = t.train()
    after = params(t.model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    # behaviour/* are NaN when their split is empty (no correct completion; prompts with no words): test_behaviour
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v) and not k.startswith("behaviour/")}
    assert not bad, bad
    for key in ("reward/mean", "reward/std", "reward/digit_share/mean", "reward/zero_std_frac", "kl", "entropy",
                "clip/low", "clip/high", "completion/len_mean", "completion/len_min", "completion/len_max",
                "completion/truncated_frac", "lr", "grad_norm", "perf/step_s", "perf/gen_tokens_per_s",
                "perf/train_tokens_per_s"):
        assert key in metrics, key
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_the_training_phase_is_split_into_its_parts(tiny_dir, tmp_path):
    """perf/train_s is the update and the weights' publication; its parts are the update's phases."""
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, beta=0.04, num_iterations=2, max_steps=1))  # old and reference passes run
    m = t.step()
    parts = [m[f"perf/train_{phase}_s"] for phase in ("old", "reference", "policy", "optimizer")]
    assert all(x > 0 for x in parts) and sum(parts) <= m["perf/train_s"]


def test_metrics_are_normalised_as_documented(tiny_dir, tmp_path):
    seen = {}

    def record(prompts, completions, completion_ids, **kw):
        values = [float(sum(ids) % 3) for ids in completion_ids]  # spread inside groups: something trains
        seen.update(values=values, lengths=[len(ids) for ids in completion_ids])
        return values

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[record], args=args(tmp_path, max_steps=1), train_dataset=PROMPTS)
    m = t.step()
    v, lengths = torch.tensor(seen["values"]), torch.tensor(seen["lengths"], dtype=torch.float)
    assert m["reward/mean"] == pytest.approx(v.mean().item(), abs=1e-6)
    assert m["reward/std"] == pytest.approx(v.std().item(), abs=1e-6)
    assert m["completion/len_mean"] == pytest.approx(lengths.mean().item(), abs=1e-6)
    assert m["completion/len_max"] == lengths.max().item()
    groups = v.view(-1, 4)
    assert m["reward/zero_std_frac"] == pytest.approx((groups.std(-1) == 0).float().mean().item())
    assert m["train/trained_frac"] > 0 and 0.0 <= m["clip/low"] <= 1.0 and 0.0 <= m["clip/high"] <= 1.0


def test_trl_style_rewards_columns_async_none_and_chat(tiny_dir, tmp_path):
    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in PROMPTS]
    got = {}

    def uses_answer(prompts, completions, answer, **kwargs):
        got["completion"], got["answer"], got["kwargs"] = completions[0], answer[0], set(kwargs)
        got["step"] = kwargs["trainer_state"].global_step, kwargs["trainer_state"].max_steps
        got["epoch"] = kwargs["trainer_state"].epoch
        kwargs["log_metric"]("answer_len", sum(map(len, answer)) / len(answer))  # TRL's way to report a number
        return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]

    async def sometimes_none(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [None if i % 2 else 0.5 for i in range(len(completions))]

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[uses_answer, sometimes_none], args=args(tmp_path, max_steps=1),
                    train_dataset=chat)
    m = t.step()
    assert isinstance(got["completion"], list) and got["completion"][0]["role"] == "assistant"
    assert got["answer"] in {r["answer"] for r in PROMPTS} and "completion_ids" in got["kwargs"]
    assert got["step"] == (0, 1)  # TRL's trainer_state: optimizer steps completed, and the total
    assert got["epoch"] == 0.0
    answers = [r["answer"] for r in t.last_batch.rows]
    assert m["reward/logged/answer_len"] == pytest.approx(sum(map(len, answers)) / len(answers))
    assert m["reward/sometimes_none/none_frac"] == 0.5
    assert m["reward/sometimes_none/mean"] == 0.5  # the None values are left out, not counted as 0


def test_a_raising_reward_does_not_kill_the_run(tiny_dir, tmp_path):
    calls = {"n": 0}

    def flaky(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("verifier crashed")
        return [float("nan") if i == 0 else 1.0 * (i % 2) for i in range(len(completions))]

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[flaky, digit_share], args=args(tmp_path, max_steps=3),
                    train_dataset=PROMPTS)
    m1 = t.step()
    m2 = t.step()
    assert m1["reward/errors"] == 0 and m2["reward/errors"] == 1
    assert m1["reward/nan"] == 1 and m2["reward/nan"] == 0  # the NaN is counted (step 2's call raised)
    assert m1["reward/flaky/none_frac"] == pytest.approx(1 / 8)  # the NaN is excluded, not a 0
    assert math.isfinite(m2["reward/mean"])


def _run(tiny_dir, tmp_path, name, **kw):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / name, **kw), train_dataset=PROMPTS)
    t.train()
    return t


def _crash_in_step_3_then_resume(tiny_dir, path, **kw) -> GRPOTrainer:
    """A run in `path` killed during its third step, and the trainer that resumes it (not yet trained)."""
    crashing = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(path, **kw), train_dataset=PROMPTS)
    real_step = crashing.step

    def step_then_crash():
        if crashing.step_count == 3:
            raise KeyboardInterrupt("simulated crash")
        return real_step()

    crashing.step = step_then_crash
    with pytest.raises(KeyboardInterrupt):
        crashing.train()
    return GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(path, resume=True, **kw),
                       train_dataset=PROMPTS)


def test_resume_matches_an_uninterrupted_run(tiny_dir, tmp_path):
    kw = dict(max_steps=4, save_steps=2, lr_scheduler_type="cosine", warmup_steps=1, num_iterations=2, beta=0.02)
    full = _run(tiny_dir, tmp_path, "a", **kw)

    resumed = _crash_in_step_3_then_resume(tiny_dir, tmp_path / "b", **kw)
    assert resumed.step_count == 0
    resumed.train()
    assert resumed.step_count == 4
    a, b = params(full.model), params(resumed.model)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=1e-7)


def test_half_written_checkpoint_is_ignored(tiny_dir, tmp_path):
    from aha.train.checkpoint import latest_checkpoint
    t = _run(tiny_dir, tmp_path, "c", max_steps=1)
    run = tmp_path / "c" / "run"
    (run / ".checkpoint-7.tmp").mkdir()
    (run / "checkpoint-9").mkdir()  # no trainer_state.json: not complete
    assert latest_checkpoint(run).name == "checkpoint-1"
    assert t.step_count == 1


@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_skipping_zero_advantage_sequences_changes_nothing(tiny_dir, tmp_path, quantile):
    """The same weights and clip fractions with and without the skip; with top_entropy_quantile < 1 nothing is
    skipped (a pass's entropy threshold is taken over all its tokens)."""
    def half_constant(prompts, completions, **kw):  # even groups all 1 (zero std), odd groups graded
        return [1.0 if (i // 4) % 2 == 0 else digit_share(None, [c])[0] for i, c in enumerate(completions)]

    runs = []
    for skip in (True, False):  # two optimizer steps per batch: the second one's ratios clip at epsilon 1e-3
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[half_constant],
                        args=args(tmp_path / str(skip), skip_zero_advantage=skip, max_steps=2, epsilon=1e-3,
                                  per_device_train_batch_size=4, generation_batch_size=8,
                                  top_entropy_quantile=quantile), train_dataset=PROMPTS)
        m = t.train()
        runs.append((params(t.model), m))
    (a, ma), (b, mb) = runs
    assert ma["train/trained_frac"] == (1.0 if quantile < 1 else 0.5) and mb["train/trained_frac"] == 1.0
    # the loss and its gradient's norm, which Adam's normalised step would not show a scaling error in
    assert (ma["loss"], ma["grad_norm"]) == pytest.approx((mb["loss"], mb["grad_norm"]), rel=1e-5)
    for n in a:  # the skipped rows change the products' shapes, so their sums round differently; Adam divides the
        # near-cancelled gradients by their own size: 1.4e-5 apart on an AMD Zen 5, of steps of about lr = 1e-2
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=1e-4)
    assert ma["clip/low"] + ma["clip/high"] > 0  # something clipped, and counted over the same tokens
    assert (ma["clip/low"], ma["clip/high"]) == pytest.approx((mb["clip/low"], mb["clip/high"]), rel=1e-6)


def test_a_batch_split_over_optimizer_steps_uses_its_sampling_log_probs(tiny_dir, tmp_path, monkeypatch):
    """With more completions per step than one optimizer step takes, the later steps' ratios are against the
    log-probs the batch was sampled with, not the current weights (which would make every ratio 1)."""
    import aha.train.learner as learner_mod
    real, gaps = learner_mod.algos.policy_loss, []

    def spy(logp, old_logp, adv, mask, *rest, **kw):
        gaps.append(float(((logp.detach() - old_logp).abs() * mask).max()))
        return real(logp, old_logp, adv, mask, *rest, **kw)

    monkeypatch.setattr(learner_mod.algos, "policy_loss", spy)
    _run(tiny_dir, tmp_path, "split", max_steps=1, learning_rate=0.1, per_device_train_batch_size=4,
         generation_batch_size=8, skip_zero_advantage=False)
    assert len(gaps) == 2                # one pass per optimizer step
    assert gaps[0] < 1e-5                # nothing moved yet
    assert gaps[1] > 1e-3                # the first step moved the weights; the ratio sees it


def test_micro_batches_equal_one_big_batch(tiny_dir, tmp_path, monkeypatch):
    """Gradient accumulation over micro-batches gives the same gradient as one pass (loop vs vectorised)."""
    import aha.train.learner as learner_mod
    real, grads = learner_mod.optimizer_step, []

    def capture(cfg, model, opt, sched, *rest):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real(cfg, model, opt, sched, *rest)

    monkeypatch.setattr(learner_mod, "optimizer_step", capture)
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        grads.clear()
        _run(tiny_dir, tmp_path, f"big-{loss_type}", max_steps=1, loss_type=loss_type, per_device_train_batch_size=8)
        _run(tiny_dir, tmp_path, f"small-{loss_type}", max_steps=1, loss_type=loss_type,
             per_device_train_batch_size=2, gradient_accumulation_steps=4)
        big, small = grads
        assert max(g.abs().max().item() for g in big.values()) > 1e-3  # a real gradient, not all zeros
        for n in big:
            torch.testing.assert_close(big[n], small[n], rtol=1e-4, atol=1e-7)


def test_micro_batches_cut_sorted_sequences_at_the_token_budget():
    """Hand-checked: widths are (longest prompt + longest completion) x sequences, a pass never exceeds the
    budget unless one sequence alone does, and per_device_train_batch_size still caps the count."""
    from types import SimpleNamespace
    from aha.train.learner import Learner
    from aha.train.passes import Passes
    batch = SimpleNamespace(prompt_ids=[[1] * 4] * 6, completion_ids=[[2] * n for n in (2, 3, 6, 6, 20, 40)])
    cut = lambda size, budget: Learner.micro_batches(  # noqa: E731
        SimpleNamespace(args=SimpleNamespace(per_device_train_batch_size=size), passes=Passes(budget, False)),
        batch, list(range(6)))
    assert cut(8, 0) == [[0, 1, 2, 3, 4, 5]]
    assert cut(4, 0) == [[0, 1, 2, 3], [4, 5]]
    # widths 6, 7, 10, 10, 24, 44: [0..3] pads 4 x 10 = 40; adding 4 would pad 5 x 24 = 120
    assert cut(8, 40) == [[0, 1, 2, 3], [4], [5]]
    assert cut(3, 40) == [[0, 1, 2], [3], [4], [5]]
    assert cut(8, 100) == [[0, 1, 2, 3], [4, 5]]  # 5 x 24 = 120 > 100; 2 x 44 = 88 fits


def test_ranks_take_every_world_th_sequence_or_with_shared_prompts_whole_groups():
    from types import SimpleNamespace
    from aha.train.learner import Learner
    from aha.train.passes import Passes
    every = [5, 4, 0, 1, 3, 9, 8, 11]  # sorted minibatch; groups of 4: 1, 1, 0, 0, 0, 2, 2, 2
    part = lambda share, rank: Learner._part(  # noqa: E731
        SimpleNamespace(world=2, passes=Passes(0, share)), every, 4, rank)
    assert part(False, 0) == [5, 0, 3, 8] and part(False, 1) == [4, 1, 9, 11]
    assert part(True, 0) == [5, 4, 9, 8, 11] and part(True, 1) == [0, 1, 3]  # groups 1 and 2; group 0


def test_a_token_budget_changes_the_passes_not_the_gradient(tiny_dir, tmp_path, monkeypatch):
    """max_tokens_per_micro_batch: the same gradient (policy, reference and old-policy passes all cut by
    length), fewer padded tokens, and no pass over the budget unless a single sequence is."""
    import aha.train.learner as learner_mod
    real_step, real_lp, grads, widths = learner_mod.optimizer_step, learner_mod.completion_logprobs, [], []

    def capture(cfg, model, opt, sched, *rest):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real_step(cfg, model, opt, sched, *rest)

    def padded(model, prompts, completions, *a, **k):
        widths[-1].append((len(prompts), len(prompts) * (max(map(len, prompts)) + max(map(len, completions)))))
        return real_lp(model, prompts, completions, *a, **k)

    monkeypatch.setattr(learner_mod, "optimizer_step", capture)
    monkeypatch.setattr(learner_mod, "completion_logprobs", padded)
    data = [{"prompt": "1+" * k + "1="} for k in range(1, 12)]  # prompts of 11 different lengths
    for budget in (0, 100):
        widths.append([])
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=data,
                    args=args(tmp_path / f"budget-{budget}", max_steps=1, beta=0.04, num_iterations=2,
                              max_tokens_per_micro_batch=budget, max_completion_length=16,
                              share_prompts=False)).train()  # every row's prompt in its pass (shared: the next test)
    whole, cut = grads[:2], grads[2:]
    assert max(g.abs().max().item() for g in whole[0].values()) > 1e-3
    for n in whole[0]:  # the first optimizer step: same weights, passes cut differently
        torch.testing.assert_close(whole[0][n], cut[0][n], rtol=1e-4, atol=1e-7)
    # the second starts from weights that differ by the first step's float rounding: compare as a whole
    diff = sum((whole[1][n] - cut[1][n]).pow(2).sum() for n in whole[1]).sqrt()
    assert diff < 1e-5 * sum(g.pow(2).sum() for g in whole[1].values()).sqrt()
    assert all(tokens <= 100 or n == 1 for n, tokens in widths[1])
    assert len(widths[1]) > len(widths[0]) and sum(t for _, t in widths[1]) < sum(t for _, t in widths[0])


@pytest.mark.parametrize("kw", [dict(), dict(use_lora=True, lora_r=4), dict(max_tokens_per_micro_batch=200)])
def test_shared_prompts_change_the_passes_not_the_gradient(tiny_dir, tmp_path, monkeypatch, kw):
    """share_prompts: the policy, reference and old-policy passes run each group's prompt once; the first
    update's gradient is the one of a pass per sequence (float summation order apart)."""
    import aha.train.learner as learner_mod
    import aha.train.logprobs as lp_mod
    real_step, real_shared, grads, shared = learner_mod.optimizer_step, lp_mod._shared_prompt_logits, [], []

    def capture(cfg, model, opt, sched, *rest):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real_step(cfg, model, opt, sched, *rest)

    def count(model, prompts, *a):
        shared.append(len({tuple(p) for p in prompts}) / len(prompts))
        return real_shared(model, prompts, *a)

    monkeypatch.setattr(learner_mod, "optimizer_step", capture)
    monkeypatch.setattr(lp_mod, "_shared_prompt_logits", count)
    for share in (False, True):
        _run(tiny_dir, tmp_path, f"share-{share}", max_steps=1, beta=0.04, num_iterations=2,
             per_device_train_batch_size=8, gradient_accumulation_steps=2, share_prompts=share, **kw)
    off, on = grads[0], grads[2]  # each run's first optimizer step, from the same weights
    assert max(g.abs().max().item() for g in off.values()) > 1e-3
    for n in off:
        torch.testing.assert_close(off[n], on[n], rtol=1e-4, atol=1e-6)
    # whole groups of 4 per pass, two to a pass: two prompts for eight rows (old-policy, reference, policy)
    assert len(shared) >= 3 and min(shared) == 0.25


@pytest.mark.parametrize("kw", [
    dict(advantage_estimator="dr_grpo", loss_type="dr_grpo"),
    dict(advantage_estimator="rloo", loss_type="grpo", mask_truncated_completions=True),
    dict(advantage_estimator="batch", importance_sampling_level="sequence", num_iterations=2),
    dict(epsilon_high=0.28, delta=1.5, beta=0.01, kl_estimator="k2", num_iterations=2),
    dict(gradient_checkpointing=True, beta=0.04, use_lora=True, lora_r=2),
    dict(dtype="bfloat16", beta=0.04, kl_estimator="k1"),
])
def test_variants_run(tiny_dir, tmp_path, kw):
    t = _run(tiny_dir, tmp_path, "v", max_steps=1, **kw)
    assert t.step_count == 1


def test_lora_uses_the_base_as_reference_and_saves_a_plain_model(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    t = _run(tiny_dir, tmp_path, "lora", use_lora=True, lora_r=4, beta=0.04, learning_rate=5e-2)
    assert t.ref_model is None  # no second copy: adapters are disabled instead
    assert all("lora_" in n for n, p in t.model.named_parameters() if p.requires_grad)
    out = t.save_model(tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        merged_logits = reloaded(ids).logits
        assert not torch.allclose(merged_logits, base(ids).logits)
        torch.testing.assert_close(merged_logits, t.model(ids).logits, rtol=1e-4, atol=1e-4)


def test_weight_interpolation_ends_between_the_start_and_the_trained_weights(tiny_dir, tmp_path):
    import json
    from transformers import AutoModelForCausalLM
    start = params(AutoModelForCausalLM.from_pretrained(tiny_dir))
    TIED = "model.embed_tokens.weight"  # the head's weight too: interpolated once, not twice
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, weight_interpolation=0.25, eval_steps=2),
                    eval_fn=lambda model, tok: {"head_sum": float(model.lm_head.weight.detach().sum())})
    t.train()
    trained = torch.load(tmp_path / "run" / "checkpoint-2" / "trainable.pt")  # the checkpoint keeps them as trained
    end = params(t.model)
    assert end.keys() == trained.keys() == start.keys()
    for n in start:
        torch.testing.assert_close(end[n], start[n] + 0.25 * (trained[n] - start[n]), rtol=0, atol=1e-7)
    moved = [n for n in start if not torch.equal(start[n], trained[n])]
    assert moved and all(not torch.equal(end[n], trained[n]) for n in moved)
    logs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logs[-2]["eval/head_sum"] == pytest.approx(float(trained[TIED].sum()), rel=1e-6)
    assert logs[-1]["eval_interpolated/head_sum"] == pytest.approx(float(end[TIED].sum()), rel=1e-6)
    saved = params(AutoModelForCausalLM.from_pretrained(t.save_model()))
    assert all(torch.equal(saved[n], end[n]) for n in end)


def test_weight_interpolation_is_checked(tiny_dir, tmp_path):
    from aha.config import ConfigError
    with pytest.raises(ConfigError, match="weight_interpolation must be in"):
        args(tmp_path, weight_interpolation=1.5)
    with pytest.raises(ConfigError, match="weight_interpolation needs full fine-tuning"):
        args(tmp_path, weight_interpolation=0.5, use_lora=True)
    from peft import LoraConfig  # adapters given as an object, not by the config: refused before anything is written
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, weight_interpolation=0.5),
                    peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match="weight_interpolation needs full fine-tuning"):
        t.train()
    assert not any((tmp_path / "run").iterdir())


def test_datasets_dataset_and_jsonl_path(tiny_dir, tmp_path):
    import json

    import datasets
    ds = datasets.Dataset.from_list(PROMPTS)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "ds", max_steps=1), train_dataset=ds)
    assert len(t.rows) == len(PROMPTS) and t.rows[0]["answer"] == PROMPTS[0]["answer"]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "js", max_steps=1),
                    train_dataset=str(path))
    assert t.step()["reward/mean"] >= 0


def test_completions_log_holds_whole_groups_with_gold_total_and_advantage(tiny_dir, tmp_path):
    import json

    def digits(prompts, completions, **kw):
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digits, "format"], train_dataset=PROMPTS,
                    args=args(tmp_path, max_steps=1, log_completions_steps=1, reward_weights=[1.0, 0.5]))
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and [r["group"] for r in rows] == [0] * 4 + [1] * 4  # N = B x G: every completion
    b = t.last_batch
    for i, r in enumerate(rows):
        assert r["answer"] == b.rows[i // 4]["answer"] and r["completion"] == b.texts[i]
        assert r["reward"] == pytest.approx(r["rewards"]["digits"] + 0.5 * r["rewards"]["format"], abs=1e-6)
        assert r["advantage"] == pytest.approx(float(b.advantages[i]), abs=1e-6)


def test_a_streaming_dataset_is_read_lazily_even_an_endless_one(tiny_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    drawn = []

    def endless():
        i = 0
        while True:
            drawn.append(i)
            yield {"prompt": f"{i % 10}+{i % 7}=", "answer": str(i % 10 + i % 7)}
            i += 1

    stream = datasets.IterableDataset.from_generator(endless)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=3), train_dataset=stream)
    t.train()
    assert t.step_count == 3 and t.sampler.state()["index"] == 3 * 2  # 2 prompts a step, read as needed
    assert len(drawn) < 3 * 2 + 1100  # the shuffle buffer (1,000 rows) plus what was trained: never "all"
    assert t.rows == {}  # nothing kept after its step


def test_a_streaming_run_resumes_where_an_uninterrupted_one_goes(tiny_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    stream = datasets.IterableDataset.from_list(PROMPTS)  # finite: epochs reshuffle with seed + epoch

    def run(out, steps, **kw):
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=stream,
                        args=args(tmp_path, output_dir=str(tmp_path / out), max_steps=steps, save_steps=2, **kw))
        t.train()
        return {n: p.detach().clone() for n, p in t.model.named_parameters()}

    whole = run("whole", 4)
    run("split", 2)
    resumed = run("split", 4, resume=True)
    assert all(torch.equal(whole[n], resumed[n]) for n in whole)


def constant_when_even(prompts, completions, **kw):
    """No spread at all in groups whose first operand is even (every completion gets 1.0), graded otherwise."""
    return [1.0 if int(p.split("+")[0]) % 2 == 0 else digit_share(None, [c])[0] for p, c in zip(prompts, completions)]


def test_dynamic_sampling_trains_only_groups_with_spread(tiny_dir, tmp_path):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[constant_when_even], train_dataset=PROMPTS,
                    args=args(tmp_path / "dyn", max_steps=3, dynamic_sampling=True, dynamic_sampling_max_rounds=8))
    trained, real = [], t.learner.update

    def update(batch):
        trained.append([r["prompt"] for r in batch.rows])
        return real(batch)
    t.learner.update = update
    metrics = t.train()
    assert all(len(p) == 2 and all(int(x.split("+")[0]) % 2 for x in p) for p in trained), trained
    rows = [__import__("json").loads(line) for line in (tmp_path / "dyn" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["sampling/dropped_groups"] for r in rows) >= 1 and metrics["sampling/groups"] == 2
    assert metrics["reward/zero_std_frac"] == 0  # the trained batch's groups all carry a signal


def test_dynamic_sampling_stops_after_its_rounds(tiny_dir, tmp_path):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[lambda prompts, completions, **kw: [1.0] * len(completions)],
                    train_dataset=PROMPTS, args=args(tmp_path / "flat", max_steps=1, dynamic_sampling=True,
                                                     dynamic_sampling_max_rounds=2))
    metrics = t.train()  # no group ever has spread: 1 + 2 rounds, then the batch is filled with flat groups
    assert metrics["sampling/rounds"] == 2 and metrics["sampling/groups"] == 0
    assert metrics["sampling/dropped_groups"] == 2 + 2 + 2 - 2 and metrics["reward/zero_std_frac"] == 1
    assert metrics["loss"] == 0 and metrics["train/trained_frac"] == 0  # nothing carried a gradient


def test_streamed_rewards_give_the_same_batch(tiny_dir, tmp_path):
    """stream_rewards scores each group while the rest decode: same completions, rewards and advantages."""
    batches = []
    for stream in (False, True):
        t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                        args=args(tmp_path / str(stream), stream_rewards=stream, temperature=1.0))
        batches.append(t.next_batch())
    (a, ma), (b, mb) = batches
    assert a.completion_ids == b.completion_ids
    assert torch.equal(a.rewards, b.rewards) and torch.equal(a.advantages, b.advantages)
    assert ma["reward/mean"] == mb["reward/mean"] and ma["reward/digit_share/std"] == mb["reward/digit_share/std"]
    assert mb["perf/reward_s"] > 0 and mb["perf/generate_s"] > 0


def test_a_finished_group_is_scored_while_the_engine_still_generates(tiny_dir, tmp_path):
    """The engine reports group 0, then waits for its reward before it generates the rest: that returns only if
    the group was scored during generation (without streaming the wait runs out and the test fails)."""
    scored, waited = threading.Event(), []

    class Stalling(HFEngine):
        def generate(self, prompt_ids, n, params, generator=None, on_group=None):
            out = super().generate(prompt_ids, n, params, generator)
            on_group(0, type(out)(out.completion_ids[:n], out.truncated[:n], out.version))
            waited.append(scored.wait(timeout=30))
            for i in range(1, len(prompt_ids)):
                on_group(i, type(out)(out.completion_ids[i * n:(i + 1) * n], out.truncated[i * n:(i + 1) * n],
                                      out.version))
            return out

    def reward(prompts, completions, **kw):
        scored.set()
        return digit_share(prompts, completions)

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[reward], train_dataset=PROMPTS, engine_factory=Stalling.for_model,
                    args=args(tmp_path, stream_rewards=True))
    batch, _ = t.next_batch()
    assert waited == [True] and len(batch.completion_ids) == 8


def test_an_engine_error_mid_rollout_reaches_the_caller_with_streaming(tiny_dir, tmp_path):
    class Broken(HFEngine):
        def generate(self, prompt_ids, n, params, generator=None, on_group=None):
            on_group(0, super().generate(prompt_ids[:1], n, params, generator))
            raise ValueError("engine failed mid-rollout")

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS, engine_factory=Broken.for_model,
                    args=args(tmp_path, stream_rewards=True))
    with pytest.raises(ValueError, match="engine failed mid-rollout"):
        t.next_batch()


def test_a_scorer_that_outlives_its_bound_fails_the_step_with_streaming(tiny_dir, tmp_path, monkeypatch):
    """stream_rewards: after generation the main thread waits for the scoring thread at most groups x reward
    functions x reward_timeout + SCORER_GRACE_S, then fails the step instead of hanging."""
    import time

    import aha.rollout.experience as experience_mod
    monkeypatch.setattr(experience_mod, "SCORER_GRACE_S", 0.0)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, stream_rewards=True, reward_timeout=0.05))
    monkeypatch.setattr(t.experience, "score", lambda *a, **k: time.sleep(5))  # stuck past any reward call's bound
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="reward_timeout=0.05"):
        t.next_batch()
    assert time.perf_counter() - t0 < 4.0  # 2 groups x 1 function x 0.05 s after generation, not the 5 s sleep


def test_resume_with_sync_ref_model_matches_an_uninterrupted_run(tiny_dir, tmp_path):
    """With sync_ref_model the reference moves during training: the checkpoint holds it (reference.pt), so a
    resumed run ends with the same policy and reference as an uninterrupted one; without the sync no file is added."""
    kw = dict(max_steps=4, save_steps=2, beta=0.5, sync_ref_model=True, ref_model_sync_steps=1,
              ref_model_mixup_alpha=0.9)
    full = _run(tiny_dir, tmp_path, "a", **kw)

    resumed = _crash_in_step_3_then_resume(tiny_dir, tmp_path / "b", **kw)
    initial_ref = params(resumed.ref_model)  # restored from the checkpoint only when it trains
    resumed.train()
    assert resumed.step_count == 4
    assert any(not torch.equal(initial_ref[n], p) for n, p in params(resumed.ref_model).items())  # it moved
    for name, (a, b) in {"policy": (full.model, resumed.model), "reference": (full.ref_model, resumed.ref_model)}.items():
        pa, pb = params(a), params(b)
        assert pa.keys() == pb.keys()
        for n in pa:
            assert torch.equal(pa[n], pb[n]), f"{name} {n}: max abs diff {(pa[n] - pb[n]).abs().max().item()}"
    assert (tmp_path / "b" / "run" / "checkpoint-2" / "reference.pt").is_file()

    _run(tiny_dir, tmp_path, "c", max_steps=1, beta=0.5)  # no sync: the reference is the initial model, not saved
    assert (tmp_path / "c" / "run" / "checkpoint-1").is_dir()
    assert not (tmp_path / "c" / "run" / "checkpoint-1" / "reference.pt").exists()


def test_learner_state_carries_the_reference_only_with_sync_ref_model(tiny_dir, tmp_path):
    """The Ray layer checkpoints what Learner.state() gives (pulled from the remote learners) and restores them
    with load_state: with sync_ref_model the moved reference travels with it; otherwise nothing is added."""
    kw = dict(max_steps=2, beta=0.5, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.9)
    trained = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "a", **kw),
                          train_dataset=PROMPTS)
    trained.step()
    state = trained.learner.state()
    fresh = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "b", **kw),
                        train_dataset=PROMPTS)
    initial = params(fresh.ref_model)
    assert any(not torch.equal(initial[n], p) for n, p in params(trained.ref_model).items())  # the sync moved it
    fresh.learner.load_state(state)
    for a, b in ((trained.model, fresh.model), (trained.ref_model, fresh.ref_model)):
        pa, pb = params(a), params(b)
        assert all(torch.equal(pa[n], pb[n]) for n in pa)
    plain = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path / "c", beta=0.5),
                        train_dataset=PROMPTS)
    assert "reference" not in plain.learner.state()


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_masked_truncated_completions_still_count_in_the_sequence_denominator(tiny_dir, monkeypatch, loss_type):
    """As TRL: mask_truncated_completions zeroes a truncated completion's tokens, and the per-sequence (grpo) and
    fixed-length (dr_grpo) losses still divide by every sequence of the minibatch."""
    from transformers import AutoModelForCausalLM
    import aha.train.learner as learner_mod
    from aha.batch import GRPOBatch
    from aha.train.learner import Learner
    seen, real = [], learner_mod.algos.aggregate
    monkeypatch.setattr(learner_mod.algos, "aggregate", lambda name, loss, mask, **d: seen.append(d) or real(
        name, loss, mask, **d))
    cfg = GRPOConfig(report_to=["none"], num_generations=2, per_device_train_batch_size=4, max_completion_length=4,
                     mask_truncated_completions=True, loss_type=loss_type)
    learner = Learner(cfg, AutoModelForCausalLM.from_pretrained(tiny_dir), 0, torch.Generator().manual_seed(0), 1)
    batch = GRPOBatch(rows=[{"prompt": "a"}, {"prompt": "b"}], prompt_ids=[[10, 11]] * 4,
                      completion_ids=[[20, 21, 22, 23], [20, 2], [30, 31, 32, 33], [30, 2]], texts=[""] * 4,
                      truncated=torch.tensor([True, False, True, False]), rewards_per_func=torch.zeros(4, 1),
                      rewards=torch.zeros(4), advantages=torch.tensor([1.0, -1.0, 1.0, -1.0]),
                      versions=torch.zeros(4, dtype=torch.long))
    learner.update(batch)
    assert [d["num_sequences"] for d in seen] == [4]  # 2 of the 4 truncated, masked, and counted
    assert [d["num_tokens"] for d in seen] == [4]     # the tokens in the loss: the two kept completions'


def test_weight_decay_leaves_biases_and_norm_scales_alone(tiny_dir):
    from transformers import AutoModelForCausalLM
    from aha.train.loop import build_optimizer
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    opt, _ = build_optimizer(GRPOConfig(report_to=["none"], weight_decay=0.1), model, 10)
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decay) == (p.dim() >= 2), name  # norm weights (1-D) are not decayed, matrices are
    assert len(build_optimizer(GRPOConfig(report_to=["none"]), model, 10)[0].param_groups) == 1
