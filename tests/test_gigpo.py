"""GiGPO (advantage_estimator: gigpo): episode-level group advantages plus step-level ones from anchor states,
hand-computed; the anchors an episode's turns act from; the estimator on a scripted agent run."""

import pytest
import torch

from aha import GRPOConfig, GRPOTrainer, algos
from aha.envs import Agent
from aha.envs.filesystem import FilesystemEnv
from aha.rollout.experience import turn_anchors

def pair(d):
    """grpo's advantage of two values d apart in a group of two: (d / 2) / (d / sqrt 2 + eps), about +-0.7071."""
    return (d / 2) / (d * 0.5 ** 0.5 + 1e-4)


A = pair(1.0)


def t(*xs):
    return torch.tensor(xs)


def test_the_papers_two_levels_on_a_hand_computed_group():
    # G=2. Episode 0: turns at tokens [0,2) and [3,5), rewards [0, 1]: R = 1. Episode 1: one turn [0,3), reward 0.
    # A_E = [+A, -A]. The first turns share an anchor: returns 0.95 * 1 and 0 -> A_S = [+A, -A]; episode 0's
    # second turn is alone: A_S = 0. Token 2 of episode 0 (a tool result) gets A_E alone.
    adv, m = algos.gigpo_advantages(t(1.0, 0.0), t(0, 0, 1), t(0.0, 1.0, 0.0), t(7, 8, 7), t(0, 3, 0), t(2, 5, 3),
                                    length=5, group_size=2)
    S = pair(0.95)
    expected = torch.tensor([[A + S, A + S, A, A, A], [-A - S, -A - S, -A - S, -A, -A]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert m["gigpo/step_groups"] == 2.0 and m["gigpo/grouped_turn_frac"] == pytest.approx(2 / 3)


def test_discounted_returns_and_anchor_groups_stay_inside_their_prompt_group():
    # Two prompt groups of G=2, every episode two one-token turns, rewards only on the last turn; gamma 0.5.
    # Group 0: R = [1, 0]. Group 1: R = [1, 1] (no episode-level signal). Anchor 5 is used by all four first turns
    # but step groups never cross prompt groups; second turns all act from anchor 6, likewise.
    rewards = t(1.0, 0.0, 1.0, 1.0)
    episode, reward = t(0, 0, 1, 1, 2, 2, 3, 3), t(0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0)
    anchor, start, end = t(5, 6, 5, 6, 5, 6, 5, 6), t(0, 1, 0, 1, 0, 1, 0, 1), t(1, 2, 1, 2, 1, 2, 1, 2)
    adv, _ = algos.gigpo_advantages(rewards, episode, reward, anchor, start, end, 2, 2, gamma=0.5)
    # group 0: first turns return 0.5 and 0 -> +-A; second turns 1 and 0 -> +-A; A_E +-A. Group 1: all equal -> 0.
    S = pair(0.5)
    torch.testing.assert_close(adv, torch.tensor([[A + S, 2 * A], [-A - S, -2 * A], [0.0, 0.0], [0.0, 0.0]]),
                               rtol=0, atol=1e-6)
    # omega weighs the step level: omega 0 is grpo on every token
    flat, _ = algos.gigpo_advantages(rewards, episode, reward, anchor, start, end, 2, 2, omega=0.0)
    torch.testing.assert_close(flat, torch.tensor([[A, A], [-A, -A], [0.0, 0.0], [0.0, 0.0]]), rtol=0, atol=1e-6)


def test_an_excluded_episodes_turns_get_no_step_advantage():
    # G=3, first turns share anchor 7. Episode 0: turns [0,2) and [3,5), rewards [0, 1], R = 1. Episode 1: one turn
    # [0,3), reward 0, R = 0. Episode 2: one turn [0,3), R = NaN (excluded): A_E 0, and its turn has no return, so
    # the first turns' step group is episodes 0 and 1 alone: returns 0.95 and 0 -> A_S = +-pair(0.95) (with episode
    # 2's return taken as 0 the group would be [0.95, 0, 0]). Episode 2's tokens get 0.
    adv, _ = algos.gigpo_advantages(t(1.0, 0.0, float("nan")), t(0, 0, 1, 2), t(0.0, 1.0, 0.0, 0.0), t(7, 8, 7, 7),
                                    t(0, 3, 0, 0), t(2, 5, 3, 3), length=5, group_size=3)
    S = pair(0.95)
    expected = torch.tensor([[A + S, A + S, A, A, A], [-A - S, -A - S, -A - S, -A, -A], [0.0] * 5])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_a_nan_step_score_leaves_its_turn_out_of_its_step_group():
    from types import SimpleNamespace
    from aha.rollout.experience import Experience
    # G=2; function 0 the outcome, function 1 scores turns. Episode 0: turns [0,2) and [3,5), turn 0's score NaN,
    # outcome 1. Episode 1: one turn [0,3), score 0, outcome 0. A_E = +-A. Turn 0 of episode 0 has no return (its
    # reward-to-go holds a NaN), so the first turns' step group holds episode 1 alone: A_S 0 everywhere. (A NaN
    # score taken as 0 would give returns 0.95 and 0: A_S = +-pair(0.95).)
    exp = Experience.__new__(Experience)
    exp.reward_weights = torch.tensor([1.0, 1.0])
    turn = lambda start, end: {"role": "assistant", "text": "x", "start": start, "end": end}  # noqa: E731
    episodes = [{"prompt": "p", "states": None, "turns": [turn(0, 2), results("r"), turn(3, 5)]},
                {"prompt": "p", "states": None, "turns": [turn(0, 3)]}]
    batch = SimpleNamespace(rewards_per_func=torch.tensor([[1.0, float("nan")], [0.0, float("nan")]]),
                            steps=[[(2, 1, 1, float("nan"))], [(3, 2, 1, 0.0)]], episodes=episodes,
                            rewards=torch.tensor([1.0, 0.0]), completion_ids=[[0] * 5, [0] * 3], group_size=2)
    adv, _ = exp.turn_advantages(batch)
    torch.testing.assert_close(adv, torch.tensor([[A] * 5, [-A] * 5]), rtol=0, atol=1e-6)


def _episode(states, *turns):
    return {"prompt": [{"role": "user", "content": "Copy"}], "states": states, "turns": list(turns)}


def model(text):
    return {"role": "assistant", "text": text}


def results(*contents):
    return {"role": "tool", "calls": [{"content": c} for c in contents]}


def test_a_tree_before_a_list_dir_is_another_anchor_than_the_same_tree_after_it():
    env = FilesystemEnv()
    env.reset(fs={"instruction": "x", "start": {"files": {"notes/a.txt": "hi"}, "dirs": []},
                  "goal": {"files": {}, "dirs": []}})
    tree = repr(env.state_key())
    listing = env.list_dir("notes")
    assert repr(env.state_key()) == tree                     # listing changes no file: the same tree
    looked = _episode([tree, tree], model("list"), results(listing), model("act"))
    anchors = turn_anchors(looked)
    assert anchors[0] != anchors[1]                          # before and after the listing
    # another episode that wrote a file and removed it again acts from the same tree, having read "ok" twice
    other = turn_anchors(_episode([tree, tree], model("write"), results("ok", "ok"), model("act")))
    assert other[0] == anchors[0] and other[1] != anchors[1]
    # without a state key, the anchor is everything before the turn
    bare = turn_anchors({"prompt": looked["prompt"], "states": None, "turns": looked["turns"]})
    assert bare[0] != bare[1] and bare[0] == turn_anchors({**looked, "states": None})[0]
    assert "state_key" not in [s["function"]["name"] for s in Agent(environment_factory=FilesystemEnv).schemas[None]]


def increment(step: int) -> int:
    """
    Return the step (the script only needs a result).

    Args:
        step: Value to add.
    """
    return step


def test_gigpo_on_a_scripted_agent_run_gives_first_turns_the_step_level_too(tiny_dir, tmp_path):
    from scripted import ScriptedAgentEngine
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=1024, progress_bar=False, report_to=["jsonl"], log_completions_steps=0,
                      advantage_estimator="gigpo", seed=0)
    trainer = GRPOTrainer(model=tiny_dir, reward_funcs=[lambda completions, **kw: [1.0, 0.0]], tools=[increment],
                          args=args, train_dataset=[{"prompt": [{"role": "user", "content": "Count to 4."}]}],
                          engine_factory=ScriptedAgentEngine)
    batch, metrics = trainer.next_batch()
    # R = [1, 0] -> A_E = +-A. Both first turns act from the prompt alone: returns 0.95^3 * R (four turns each,
    # the reward on the last) -> A_S = +-A. Later turns follow different calls: alone, A_S = 0.
    for i, sign in ((0, 1.0), (1, -1.0)):
        turns = [x for x in batch.episodes[i]["turns"] if x["role"] == "assistant"]
        anchors = turn_anchors(batch.episodes[i])
        adv = batch.token_advantages[i]
        assert adv[turns[0]["start"]:turns[0]["end"]].tolist() == pytest.approx([sign * (A + pair(0.95 ** 3))] * (
            turns[0]["end"] - turns[0]["start"]), abs=1e-5)
        others = turn_anchors(batch.episodes[1 - i])
        for k in range(1, len(turns)):
            assert anchors[k] not in others
            assert adv[turns[k]["end"] - 1].item() == pytest.approx(sign * A, abs=1e-5)
    assert metrics["gigpo/step_groups"] == 7.0  # one shared first-turn anchor, six turns alone
