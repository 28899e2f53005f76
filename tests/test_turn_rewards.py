"""One score per model turn on an agent's episodes: each a step on its turn's last model token, and grpo_process's
token advantages over them (hand-computed)."""

import pytest

from aha import GRPOConfig, GRPOTrainer


def increment(step: int) -> int:
    """
    Add to a counter that starts at 0 (each call starts it again: the script only needs a result).

    Args:
        step: Value to add.
    """
    return step


def first_turn_only(completions, **kwargs):
    """Episode 0 of the group: [1, 0, 0, 0] (the script's 3 calls, then its answer); episode 1: [0, 0, 0, 0]."""
    assert all(sum(m["role"] == "assistant" for m in c) == 4 for c in completions)
    return [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def _trainer(tiny_dir, tmp_path, reward):
    from scripted import ScriptedAgentEngine
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=1024, progress_bar=False, report_to=["jsonl"], log_completions_steps=0,
                      advantage_estimator="grpo_process", seed=0)
    return GRPOTrainer(model=tiny_dir, reward_funcs=[reward], tools=[increment], args=args,
                       train_dataset=[{"prompt": [{"role": "user", "content": "Count to 4."}]}],
                       engine_factory=ScriptedAgentEngine)


def test_turn_scores_sit_on_each_turns_last_model_token_with_process_advantages(tiny_dir, tmp_path):
    batch, metrics = _trainer(tiny_dir, tmp_path, first_turn_only).next_batch()
    # The pool is the group's 8 turn scores (no outcome: the only function gave steps): one 1 and seven 0s.
    # mean 1/8; unbiased std sqrt((0.875^2 + 7 * 0.125^2) / 7) = sqrt(0.125) = 0.353553; with eps 1e-4:
    # r~(1) = 0.875 / 0.353653 = 2.474183, r~(0) = -0.125 / 0.353653 = -0.353455.
    up, zero = 0.875 / (0.125 ** 0.5 + 1e-4), -0.125 / (0.125 ** 0.5 + 1e-4)
    expected = [[up + 3 * zero, 3 * zero, 2 * zero, zero], [4 * zero, 3 * zero, 2 * zero, zero]]
    for i in range(2):
        turns = [t for t in batch.episodes[i]["turns"] if t["role"] == "assistant"]
        last = [t["end"] - 1 for t in turns]
        assert [tok for _, tok, _, _ in batch.steps[i]] == last        # each score on its turn's last model token
        adv = batch.token_advantages[i]                                 # A(t): the steps ending at or after t
        assert adv[last].tolist() == pytest.approx(expected[i], abs=1e-5)
        assert adv[turns[1]["start"]].item() == pytest.approx(expected[i][1], abs=1e-5)  # a turn's first token too
        mask = batch.loss_mask[i].bool()
        assert (adv[~mask] == 0).all() and mask[last].all()             # tool tokens carry nothing
    assert metrics["process/steps_per_completion"] == 4.0


def test_a_wrong_number_of_turn_scores_and_character_steps_on_episodes_are_refused(tiny_dir, tmp_path):
    t = _trainer(tiny_dir, tmp_path, lambda completions, **kw: [[1.0, 0.0]] * len(completions))
    with pytest.raises(ValueError, match="2 turn scores for episode 0, which has 4 model turns"):
        t.next_batch()
    t = _trainer(tiny_dir, tmp_path / "b", lambda completions, **kw: [[(3, 1.0)]] * len(completions))
    with pytest.raises(ValueError, match="one score per model turn"):
        t.next_batch()
