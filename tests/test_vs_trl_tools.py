"""benchmarks/vs_trl_tools.py's scripted policy: aha's turn loop runs exactly the turns a prompt names, and TRL's
replaced parse_response takes the same decisions in TRL's message form."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import vs_trl_tools  # noqa: E402
from agent_speed import build, echo  # noqa: E402

from aha.envs import Toolbox  # noqa: E402
from aha.rollout import SamplingParams  # noqa: E402
from aha.rollout.turns import Episode, run_turns  # noqa: E402


@pytest.mark.parametrize("turns", [1, 3])
def test_every_episode_runs_the_turns_its_prompt_names(turns):
    tok, model = build("tiny")
    vs_trl_tools.FixedTurns.turn_tokens = 4
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    rule, box = vs_trl_tools.Scripted(tok), Toolbox([echo], 5.0)
    episodes = [Episode(row["prompt"], rule.prompt_ids(row["prompt"], box.schemas), box)
                for row in vs_trl_tools.dataset(turns, 2) for _ in range(2)]  # 2 prompts x G 2
    engine = vs_trl_tools.FixedTurns(model, [eot], tok.pad_token_id)
    out = run_turns(engine, rule, episodes, 2, SamplingParams(0.0, max_new_tokens=200), None, None)
    roles = [[t["role"] for t in e["turns"]] for e in out.episodes]
    # k model turns with a tool turn between each two: assistant, tool, assistant, ... assistant
    assert roles == [["assistant", "tool"] * (turns - 1) + ["assistant"]] * 4
    assert [e["calls"] for e in out.episodes] == [turns - 1] * 4
    assert [e["finish"] for e in out.episodes] == ["stop"] * 4
    assert rule.count["model_turns"] == 4 * turns
    assert rule.count["model_tokens"] == sum(map(sum, out.loss_mask))  # every model token, tool tokens not
    vs_trl_tools.check_turns([dict(rule.count)] * 2, turns, episodes=4)
    with pytest.raises(RuntimeError, match=f"expected {4 * turns} model turns"):
        vs_trl_tools.check_turns([dict(rule.count), {"model_turns": 4 * turns - 1}], turns, episodes=4)


def test_trl_parse_calls_echo_until_the_last_turn():
    tok, _ = build("tiny")
    rule = vs_trl_tools.Scripted(tok)
    parse = vs_trl_tools.trl_parse(rule)
    prompt = vs_trl_tools.dataset(2, 1)[0]["prompt"]
    first = rule.prompt_ids(prompt, Toolbox([echo], 5.0).schemas)
    turn = tok("the fox<|im_end|>", add_special_tokens=False)["input_ids"]
    assert parse(tok, turn, prefix=first) == {
        "role": "assistant", "content": "the fox",
        "tool_calls": [{"type": "function", "function": {"name": "echo", "arguments": {"x": 0}}}]}
    after_tool = first + turn + rule.tool_suffix_ids([{"role": "tool", "name": "echo", "content": "echo 0"}])
    assert parse(tok, turn, prefix=after_tool) == {"role": "assistant", "content": "the fox"}
    assert rule.count == {"model_turns": 2, "model_tokens": 2 * len(turn)}
