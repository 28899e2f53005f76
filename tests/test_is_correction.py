"""The engine-learner mismatch: TRL's truncated/masked importance-sampling correction (vllm_importance_sampling_*)
applied to aha's engine in the one behaviour-weight formula, DeepSeek-V3.2's off-policy sequence mask, the config
names, and in training: mismatch/* logged every step, the correction's effect on a batch with a known mismatch."""

import dataclasses
import math

import pytest
import torch

from aha import algos
from aha.config import ConfigError, GRPOConfig

# One known batch: row 0's ratios pi_prox/mu are 2.0, 0.5, 3.0; row 1's are 1.2, 1.0 and 4.0 on a token outside the
# mask (a tool token or padding: it counts nowhere).
MU = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.5, 0.5, 0.1]]))
PROX = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.6, 0.5, 0.4]]))
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def close(a, b, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


@pytest.mark.parametrize("mode, low, high, weights, hit", [
    # per token, clamped to [low, high]; outside the mask exactly 1
    ("token_truncate", None, 2.5, [[2.0, 0.5, 2.5], [1.2, 1.0, 1.0]], [[0, 0, 1], [0, 0, 0]]),
    ("token_truncate", 0.6, 2.5, [[2.0, 0.6, 2.5], [1.2, 1.0, 1.0]], [[0, 1, 1], [0, 0, 0]]),
    # per token, 0 outside [low, high]
    ("token_mask", 0.6, 2.5, [[2.0, 0.0, 0.0], [1.2, 1.0, 1.0]], [[0, 1, 1], [0, 0, 0]]),
    ("token_mask", None, None, [[2.0, 0.5, 3.0], [1.2, 1.0, 1.0]], [[0, 0, 0], [0, 0, 0]]),
    # per sequence: row 0 2 x 0.5 x 3 = 3.0, row 1 1.2 x 1.0 = 1.2 (its masked token's 4.0 left out)
    ("sequence_truncate", None, 2.5, [[2.5, 2.5, 2.5], [1.2, 1.2, 1.0]], [[1, 1, 1], [0, 0, 0]]),
    ("sequence_truncate", 1.5, None, [[3.0, 3.0, 3.0], [1.5, 1.5, 1.0]], [[0, 0, 0], [1, 1, 0]]),
    ("sequence_mask", None, 2.5, [[0.0, 0.0, 0.0], [1.2, 1.2, 1.0]], [[1, 1, 1], [0, 0, 0]]),
    ("sequence_mask", 0.5, 3.5, [[3.0, 3.0, 3.0], [1.2, 1.2, 1.0]], [[0, 0, 0], [0, 0, 0]]),
])
def test_each_mode_by_hand(mode, low, high, weights, hit):
    w, outside = algos.behaviour_weights(PROX, MU, MASK, mode, low, high)
    close(w, weights, tol=1e-5)
    assert outside.int().tolist() == hit
    assert not w.requires_grad


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown importance sampling mode 'token'; valid: \['sequence_mask'"):
        algos.behaviour_weights(PROX, MU, MASK, "token")


def test_off_policy_sequence_mask_by_hand():
    # mean of log mu - log pi over each row's masked tokens: row 0 (0.6 + 0.8) / 2 = 0.7, row 1 (0.1 + 0.3) / 2 = 0.2
    logp = torch.zeros(2, 3, requires_grad=True)
    sampled = torch.tensor([[0.6, 0.8, 9.0], [0.1, 0.3, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    keep = algos.off_policy_sequence_mask(torch.tensor([[-1.0], [-1.0]]), logp, sampled, mask, 0.5)
    close(keep, [[0, 0, 0], [1, 1, 1]])                       # row 0: A < 0 and 0.7 > 0.5; row 1: 0.2 <= 0.5
    keep = algos.off_policy_sequence_mask(torch.tensor([[1.0], [-1.0]]), logp, sampled, mask, 0.5)
    close(keep, [[1, 1, 1], [1, 1, 1]])                       # A >= 0 is always kept
    per_token = torch.tensor([[1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])  # process advantages: the sign per token
    close(algos.off_policy_sequence_mask(per_token, logp, sampled, mask, 0.5), [[1, 0, 0], [1, 1, 1]])


def test_trl_names_are_taken_with_trls_checks():
    args = GRPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask",
                      vllm_importance_sampling_clip_min=0.5, off_policy_mask_threshold=0.5)
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == ("token_mask", 3.0)
    assert GRPOConfig(vllm_importance_sampling_cap=2.0).vllm_importance_sampling_clip_max == 2.0  # TRL's old name
    assert GRPOConfig(vllm_importance_sampling_cap=None) == GRPOConfig()
    assert not GRPOConfig().vllm_importance_sampling_correction                                 # aha's default: off
    for kw, msg in [(dict(vllm_importance_sampling_clip_min=3.0), "must be below vllm_importance_sampling_clip_max"),
                    (dict(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
                          vllm_importance_sampling_clip_max=None), "truncates to bounds"),
                    (dict(vllm_importance_sampling_mode="sequence"), "vllm_importance_sampling_mode"),
                    (dict(off_policy_mask_threshold=0.0), "off_policy_mask_threshold"),
                    (dict(vllm_importance_sampling_correction=True, loss_type="vespo"), "turn the correction off")]:
        with pytest.raises(ConfigError, match=msg):
            GRPOConfig(**kw)


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _trainer(tiny_dir, path, shift=0.0, **kw):
    """A trainer whose engine reports each token's log-prob `shift` above its own (a known mismatch)."""
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir=str(path), max_steps=3, num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                      log_completions_steps=0, log_groups_steps=0, seed=0, **kw)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args, train_dataset=PROMPTS)
    generate = t.engine.generate

    def shifted(*a, **k):
        out = generate(*a, **k)
        return dataclasses.replace(out, logprobs=[[x + shift for x in row] for row in out.logprobs])
    t.engine.generate = shifted
    return t


def test_mismatch_is_logged_every_step_and_the_default_loss_is_unchanged(tiny_dir, tmp_path):
    """The engine samples with the learner's weights: on the CPU in float32 its log-probs are the learner's to
    rounding, and with the correction off (aha's default) they change nothing in the loss."""
    from aha.metrics import read_metrics
    t = _trainer(tiny_dir, tmp_path / "run")
    t.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 3
    for r in rows:
        assert 0 <= r["mismatch/kl"] < 1e-6 and abs(r["mismatch/is_ratio_mean"] - 1) < 1e-4
        assert 0 <= r["mismatch/logp_diff_max"] < 1e-3
        assert "mismatch/corrected_frac" not in r and "offpolicy/is_weight_mean" not in r


def test_a_known_mismatch_is_measured_and_corrected(tiny_dir, tmp_path):
    """The engine reports mu = 2 pi on every token: pi/mu = 0.5, KL(mu || pi) per token by k3 = e^-ln2 - 1 + ln 2
    = 0.1931, |log pi - log mu| = ln 2. token_truncate within bounds halves every token's loss, so the gradient halves;
    token_mask above 0.6 drops every token (no gradient, all corrected)."""
    out = {}
    for name, kw in [("off", {}), ("truncate", dict(vllm_importance_sampling_mode="token_truncate")),
                     ("mask", dict(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.6))]:
        t = _trainer(tiny_dir, tmp_path / name, shift=math.log(2), vllm_importance_sampling_correction=bool(kw),
                     **kw)
        out[name] = t.step()
    for m in out.values():
        assert m["mismatch/kl"] == pytest.approx(0.5 - 1 + math.log(2), abs=1e-5)
        assert m["mismatch/is_ratio_mean"] == pytest.approx(0.5, abs=1e-5)
        assert m["mismatch/logp_diff_max"] == pytest.approx(math.log(2), abs=1e-5)
    assert out["off"]["grad_norm"] > 0
    assert out["truncate"]["grad_norm"] == pytest.approx(0.5 * out["off"]["grad_norm"], rel=1e-4)
    assert out["truncate"]["mismatch/corrected_frac"] == 0
    assert out["mask"]["grad_norm"] == 0 and out["mask"]["mismatch/corrected_frac"] == 1


@pytest.mark.parametrize("mode", algos.IS_MODES)
def test_three_steps_of_each_mode_log_finite_losses(tiny_dir, tmp_path, mode):
    from aha.metrics import read_metrics
    t = _trainer(tiny_dir, tmp_path / "run", shift=0.01, vllm_importance_sampling_correction=True,
                 vllm_importance_sampling_mode=mode, off_policy_mask_threshold=0.5, num_iterations=2)
    t.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 3 and all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows)
    assert all(0 <= r["mismatch/corrected_frac"] <= 1 and 0 <= r["offpolicy/seq_masked_frac"] <= 1 for r in rows)
