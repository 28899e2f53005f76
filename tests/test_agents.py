"""Agents with TRL's contract: tools, environments, the turn loop, and what the batch and the logs make of episodes."""

import asyncio
import json
import time

import pytest
import torch
from transformers import AutoTokenizer

from aha import GRPOConfig, GRPOTrainer
from aha.data.toolcalls import TOOL_TEMPLATE, ToolCall, ToolChat, parse_hermes
from aha.envs import Agent, Toolbox
from aha.examples.trl_agents import async_add, multiply
from aha.rollout import SamplingParams
from aha.rollout.turns import Episode, run_turns, sample_episodes
from scripted import CounterEnv, ScriptedAgentEngine


def boom(x: int) -> str:
    """
    Always fails.

    Args:
        x: Anything.
    """
    raise RuntimeError("the tool broke")


def sleepy(seconds: float) -> str:
    """
    Sleeps.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


async def async_sleepy(seconds: float) -> str:
    """
    Sleeps without blocking.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "awake"


class Unprintable:
    def __str__(self):
        raise ValueError("no text")


def odd(x: int) -> object:
    """
    Returns something str() cannot take.

    Args:
        x: Anything.
    """
    return Unprintable()


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def args(path, **kw):
    base = dict(output_dir=str(path), max_steps=2, num_generations=2, per_device_train_batch_size=4,
                max_completion_length=1024, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=1, log_groups_steps=1, seed=0)
    return GRPOConfig(**{**base, **kw})


CHAT_ROWS = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in range(2, 8)]


# ------------------------------------------------------------------ tool calls, one by one
def test_hermes_calls_are_parsed_and_bad_ones_say_why():
    content, calls = parse_hermes('Sure.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n'
                                  '</tool_call>\n<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert content == "Sure." and calls == [ToolCall("multiply", {"a": 3, "b": 4}), ToolCall("x", {"a": 1})]
    assert "malformed tool call JSON" in parse_hermes("<tool_call>{'a': 1}</tool_call>")[1][0].error
    assert "JSON object" in parse_hermes('<tool_call>[1, 2]</tool_call>')[1][0].error
    assert "no closing" in parse_hermes('<tool_call>{"name": "multiply"')[1][0].error


@pytest.mark.parametrize("call, outcome, says", [
    (ToolCall("multiply", {"a": 3, "b": 4}), "ok", "12"),
    (ToolCall("async_add", {"a": 3, "b": 4.0}), "ok", "7"),                        # a whole float is an integer
    (ToolCall("", "{bad", "malformed tool call JSON (x)"), "malformed", "malformed tool call JSON"),
    (ToolCall("divide", {"a": 1}), "unknown", "Tool divide not found"),
    (ToolCall("multiply", {"a": "3", "b": 4}), "bad_arguments", "argument 'a' of multiply must be integer"),
    (ToolCall("multiply", {"a": 3}), "bad_arguments", "missing ['b']"),
    (ToolCall("multiply", {"a": 3, "b": 4, "c": 5}), "bad_arguments", "unexpected ['c']"),
    (ToolCall("multiply", [3, 4]), "bad_arguments", "must be a JSON object"),
    (ToolCall("boom", {"x": 1}), "raised", "the tool broke"),
    (ToolCall("odd", {"x": 1}), "bad_result", "cannot be written as text"),
    (ToolCall("sleepy", {"seconds": 5}), "timeout", "ran past tool_timeout=0.2 s"),
    (ToolCall("async_sleepy", {"seconds": 5}), "timeout", "ran past tool_timeout=0.2 s"),
])
def test_every_bad_tool_call_is_a_tool_message_and_counted(call, outcome, says):
    box = Toolbox([multiply, async_add, boom, odd, sleepy, async_sleepy], timeout_s=0.2)
    t0 = time.monotonic()
    result = box.call(call)
    assert time.monotonic() - t0 < 2.0  # never a hang
    assert result.outcome == outcome and says in result.content, result
    if outcome != "ok":
        assert result.content.startswith("{'error': ")  # TRL's form
    assert result.message()["role"] == "tool"
    assert result.non_string == (outcome == "ok")  # multiply and async_add return ints: given as their str()


def test_a_tool_without_a_docstring_is_refused_by_name():
    def nodoc(a: int) -> int:
        return a
    with pytest.raises(ValueError, match="tool 'nodoc'.*docstring"):
        Agent([nodoc])


# ------------------------------------------------------------------ the turn loop
def _conversation():
    return [{"role": "user", "content": "What is 3 * 4 + 7?"},
            {"role": "assistant", "content": "", "tool_calls": [ToolCall("multiply", {"a": 3, "b": 4}).message()]},
            {"role": "tool", "name": "multiply", "content": "12"},
            {"role": "assistant", "content": "Now add.", "tool_calls": [ToolCall("async_add", {"a": 12, "b": 7}).message()]},
            {"role": "tool", "name": "async_add", "content": "19"},
            {"role": "assistant", "content": "The answer is 19."}]


def _replay(tok, conversation, chat, tools):
    """An engine whose k-th model turn is the template's own rendering of the conversation's k-th assistant
    message, tokenized as the tokenizer splits it (its end-of-turn token included)."""
    turns = []
    for k, m in enumerate(conversation):
        if m["role"] == "assistant":
            before = chat.render(conversation[:k], tools, generation_prompt=True)
            text = chat.render(conversation[:k + 1], tools)[len(before):]
            turns.append(text[:text.rindex("<|im_end|>")])
    return lambda context: turns[context.count("<|im_start|>assistant") - 1]


def test_assembled_tokens_are_the_templates_rendering_of_the_whole_conversation(tok):
    conversation, box, own = _conversation(), Toolbox([multiply, async_add], 5.0), tok.chat_template
    for template in (None, TOOL_TEMPLATE):  # aha's template, and a tokenizer whose own template has tools
        tok.chat_template = template or tok.chat_template
        chat = ToolChat(tok)
        assert (chat.template is None) == (template is not None)
        engine = ScriptedAgentEngine(None, tok, script=_replay(tok, conversation, chat, box.schemas))
        ep = Episode(conversation[:1], chat.prompt_ids(conversation[:1], box.schemas), box)
        out = run_turns(engine, chat, [ep], 1, SamplingParams(max_new_tokens=400), None, None)
        whole = chat.encode(chat.render(conversation, box.schemas))
        assert out.prompt_ids[0] + out.completion_ids[0] == whole[:whole.index(tok.eos_token_id, len(whole) - 3) + 1]
        mask = out.loss_mask[0]
        assert [t["role"] for t in out.episodes[0]["turns"]] == ["assistant", "tool", "assistant", "tool", "assistant"]
        tool_spans = [(t["start"], t["end"]) for t in out.episodes[0]["turns"] if t["role"] == "tool"]
        assert all(mask[i] == 0 for s, e in tool_spans for i in range(s, e)) and sum(mask) == len(mask) - sum(
            e - s for s, e in tool_spans)
        assert out.episodes[0]["messages"][-1]["content"] == "The answer is 19." and not out.truncated[0]
        assert out.episodes[0]["outcomes"] == {"ok": 2}
    tok.chat_template = own


def _episodes(tok, n, agent, rows, **kw):
    chat = ToolChat(tok)
    envs = agent.environments([None] * n)
    eps = []
    for env, row in zip(envs, rows):
        prompt = agent.reset(env, row)
        eps.append(Episode(prompt, chat.prompt_ids(prompt, agent.schemas[None]), agent.toolbox(env, None)))
    return chat, eps, envs


def test_a_scripted_three_call_episode_replays_identically(tok):
    runs = []
    for _ in range(2):
        agent = Agent(environment_factory=CounterEnv)
        chat, eps, envs = _episodes(tok, 2, agent, CHAT_ROWS[:2])
        out = run_turns(ScriptedAgentEngine(None, tok), chat, eps, 2, SamplingParams(max_new_tokens=400), None, None)
        runs.append((out, [e.counter for e in envs]))
    (a, ca), (b, cb) = runs
    assert a.completion_ids == b.completion_ids and a.loss_mask == b.loss_mask and a.episodes == b.episodes
    assert ca == cb and all(e["calls"] == 3 and e["finish"] == "stop" for e in a.episodes)
    assert [t["role"] for t in a.episodes[0]["turns"]] == ["assistant", "tool"] * 3 + ["assistant"]


def test_episodes_end_at_the_budget_and_the_tool_limit_truncated(tok):
    agent = Agent(environment_factory=CounterEnv)
    chat, eps, _ = _episodes(tok, 1, agent, CHAT_ROWS[:1])
    out = run_turns(ScriptedAgentEngine(None, tok), chat, eps, 1, SamplingParams(max_new_tokens=400), None, 1)
    ep = out.episodes[0]
    assert ep["finish"] == "tool_limit" and out.truncated[0] and ep["calls"] == 1  # the second call is not run
    chat, eps, _ = _episodes(tok, 1, agent, CHAT_ROWS[:1])
    out = run_turns(ScriptedAgentEngine(None, tok), chat, eps, 1, SamplingParams(max_new_tokens=60), None, None)
    assert out.episodes[0]["finish"] == "length" and out.truncated[0] and len(out.completion_ids[0]) <= 60


def test_an_episode_is_told_of_every_bad_call_and_goes_on(tok):
    replies = iter(['<tool_call>{"name": "multiply", "arguments": {"a": "x", "b": 1}}</tool_call>',
                    "<tool_call>{oops}</tool_call>", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                    '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>', "I give up."])
    agent = Agent([multiply, boom])
    chat, eps, _ = _episodes(tok, 1, agent, [{"prompt": [{"role": "user", "content": "hi"}]}])
    out = run_turns(ScriptedAgentEngine(None, tok, script=lambda c: next(replies)), chat, eps, 1,
                    SamplingParams(max_new_tokens=3000), None, None)
    ep = out.episodes[0]
    assert ep["outcomes"] == {"bad_arguments": 1, "malformed": 1, "unknown": 1, "raised": 1} and ep["finish"] == "stop"
    seen = tok.decode(out.completion_ids[0])
    assert "must be integer" in seen and "malformed tool call JSON" in seen and "Tool nope not found" in seen
    assert "the tool broke" in seen


# ------------------------------------------------------------------ the trainer
def _agent_trainer(tiny_dir, path, **kw):
    CounterEnv.resets = 0
    seen = {}

    def reads_envs(completions, environments, target, **kwargs):
        seen.update(envs=environments, completions=completions, target=target)
        return [0.5 * (e.counter >= t) for e, t in zip(environments, target)]

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[reads_envs], train_dataset=CHAT_ROWS, environment_factory=CounterEnv,
                    engine_factory=ScriptedAgentEngine, args=args(path, reward_weights=[2.0], **kw))
    return t, seen


def test_an_environment_run_trains_on_model_tokens_only_and_logs_its_turns(tiny_dir, tmp_path):
    t, seen = _agent_trainer(tiny_dir, tmp_path)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    m = t.train()
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
    b = t.last_batch
    assert CounterEnv.resets == 2 * 4 and len(t.agent.pool[None]) == 4  # 4 episodes a step, instances reused
    assert isinstance(seen["envs"][0], CounterEnv) and seen["completions"][0][-1] == {"role": "assistant",
                                                                                       "content": "done"}
    assert seen["completions"][0][1]["role"] == "tool" and seen["target"][0] == b.rows[0]["target"]
    assert b.rewards_per_func.shape[1] == 2  # reads_envs, then CounterEnv's get_reward (weight 1)
    assert torch.allclose(b.rewards, 2.0 * b.rewards_per_func[:, 0] + b.rewards_per_func[:, 1])
    for mask, adv, ids in zip(b.loss_mask, b.token_advantages, b.completion_ids):
        assert len(mask) == len(ids) and 0 < int(mask.sum()) < len(ids) and bool((adv[mask == 0] == 0).all())
    assert m["tools/calls_per_episode"] == 3 and m["tools/turns"] == 4 and m["tools/errors"] == 0
    assert m["completion/len_mean"] == pytest.approx(m["tools/model_tokens_per_episode"])
    assert m["tools/env_tokens_per_episode"] > 0 and m["tools/finish_stop_frac"] == 1.0
    groups = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    last = next(g for g in groups if g["step"] == 2 and g["group"] == 0)["completions"][0]
    assert [t["role"] for t in last["turns"]] == ["assistant", "tool"] * 3 + ["assistant"]
    assert last["tokens"]["model"] == b.loss_mask[0].tolist() and last["finish"] == "stop"
    assert last["prompt"][-1]["content"].endswith(f" Reach {b.rows[0]['target']}.")  # reset's string, joined
    trained = [c for g in groups for c in g["completions"] if c["trained"]]
    assert trained and all(c["tokens"]["loss"][i] == 0 and c["tokens"]["clip"][i] == 0
                           for c in trained for i, k in enumerate(c["tokens"]["model"]) if k == 0)


def test_standalone_tools_and_the_config_names(tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "mytools_for_test.py").write_text(
        "def shout(text: str) -> str:\n    \"\"\"\n    Shouts.\n\n    Args:\n        text: What to shout.\n    \"\"\"\n"
        "    return text.upper()\n")
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": [{"role": "user", "content": "say hi"}]}] * 4

    def shouted(completions, **kw):
        return [float(any(m["role"] == "tool" and m["content"] == "HI" for m in c)) for c in completions]
    script = lambda c: ('<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'  # noqa: E731
                        if "<|im_start|>tool" not in c else "ok")
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[shouted], train_dataset=rows,
                    engine_factory=lambda m, tk, b: ScriptedAgentEngine(m, tk, b, script=script),
                    args=args(tmp_path / "run", tools=["mytools_for_test:shout"], max_steps=1))
    m = t.train()
    assert m["reward/shouted/mean"] == 1.0 and m["tools/non_string"] == 0
    with pytest.raises(ValueError, match="environment 'nosuch_mod:Env': no module"):
        GRPOTrainer(model=tiny_dir, reward_funcs=[shouted], train_dataset=rows,
                    args=args(tmp_path / "run2", environment="nosuch_mod:Env"))


# ------------------------------------------------------------------ TRL's documented examples
@pytest.mark.parametrize("name", ["increment_self_sampling", "increment_dataset", "tools", "rewards",
                                  "multiple_environments"])
def test_trls_agent_examples_train_three_steps_and_save(tiny_dir, tmp_path, name):
    """examples/trl_agents.py: TRL's code with `from aha import GRPOConfig, GRPOTrainer` (only the model, the output
    directory and max_steps=3 changed, the doc's `...` filled), on a tiny model built in code."""
    from aha.examples.trl_agents import EXAMPLES
    trainer = EXAMPLES[name](tiny_dir, str(tmp_path / name))
    assert trainer.step_count == 3
    assert (trainer.save_model() / "config.json").is_file()
    metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all("tools/calls_per_episode" in m for m in metrics)


def test_multiple_environments_offer_only_their_own_tools(tiny_dir, tmp_path):
    from aha.examples.trl_agents import CodingEnv, GameEnv
    agent = Agent(environment_factory={"coding": CodingEnv, "game": GameEnv})
    chat = ToolChat(AutoTokenizer.from_pretrained(tiny_dir))
    names = [agent.environment_name(r) for r in ({"environment": "coding"}, {"environment": "game"})]
    coding, game = (chat.render(agent.reset(e, {"environment": n}), agent.schemas[n], True)
                    for e, n in zip(agent.environments(names), names))
    assert "run_code" in coding and "move" not in coding and "move" in game and "run_code" not in game
    with pytest.raises(ValueError, match="environment='chess'.*not among"):
        agent.environment_name({"environment": "chess"})


def test_an_eval_dataset_of_an_agent_is_scored_on_greedy_episodes(tiny_dir, tmp_path):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[], train_dataset=CHAT_ROWS, eval_dataset=CHAT_ROWS[:3],
                    environment_factory=CounterEnv, engine_factory=ScriptedAgentEngine,
                    args=args(tmp_path, max_steps=1, eval_steps=1, max_completion_length=48))
    m = t.train()
    assert "eval/reward/CounterEnv/mean" in m and 0 <= m["eval/reward/mean"] <= 1


def test_sampled_episodes_are_n_a_row_row_major_and_the_same_for_the_same_seed(tiny_dir):
    from aha.envs.filesystem import FilesystemEnv, make_tasks
    from aha.models import load_model, load_tokenizer
    model, tok, rows = load_model(tiny_dir), load_tokenizer(tiny_dir), make_tasks("test", 2, seed=0)
    agent = Agent(environment_factory=FilesystemEnv)
    runs = [sample_episodes(model, tok, agent, rows, 24, 2, temperature=1.0, n=3, seed=s) for s in (5, 5, 6)]
    (a, envs), (b, _), (c, _) = runs
    assert len(a.completion_ids) == len(envs) == 6 and a.completion_ids == b.completion_ids != c.completion_ids
    assert [e["prompt"] for e in a.episodes] == [r["prompt"] for r in rows for _ in range(3)]
    with pytest.raises(ValueError, match="1 when greedy"):
        sample_episodes(model, tok, agent, rows, 24, n=2)


def test_a_demonstration_trains_the_model_turns_and_only_reads_the_tool_turns(tok):
    from aha.train.sft import tokenize_example
    chat, box = ToolChat(tok), Toolbox([multiply, async_add], 5.0)
    row = chat.demonstration(_conversation(), 1, box.schemas)
    assert [s["train"] for s in row["completion"]] == [True, False, True, False, True]
    prompt, ids, mask = tokenize_example(tok, row["prompt"], row["completion"])
    whole = chat.encode(chat.render(_conversation(), box.schemas))
    assert prompt + ids == whole[:len(prompt) + len(ids)]  # the segments tokenize as the whole conversation does
    assert len(mask) == len(ids) and 0 < sum(mask) < len(mask)
    tool_text = tok.decode([t for t, m in zip(ids, mask) if not m])
    assert "<tool_response>" in tool_text and "multiply" not in tool_text  # results are read, calls are learned


def test_a_tokenizer_with_its_own_response_template_is_parsed_by_transformers(tok, monkeypatch):
    """A tokenizer whose template supports tools and that has a `response_template` has its turns read by
    transformers' parse_response; what that cannot read (malformed JSON) is read in the Hermes form, which says why."""
    monkeypatch.setattr(tok, "chat_template", TOOL_TEMPLATE)
    monkeypatch.setattr(tok, "response_template", {
        "defaults": {"role": "assistant"}, "start_anchor": "<|im_start|>assistant\n",
        "fields": {"tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                                  "content": "json", "transform": {"type": "function", "function": "{content}"}},
                   "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}}}, raising=False)
    chat = ToolChat(tok)
    assert chat.template is None and chat.parses
    prefix = chat.prompt_ids([{"role": "user", "content": "hi"}], None)
    ids = chat.encode('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>')
    calls = []
    real = tok.parse_response
    monkeypatch.setattr(tok, "parse_response", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert chat.parse(ids, prefix, None) == ("Sure.", [ToolCall("add", {"a": 1})]) and calls
    bad = chat.encode("<tool_call>\n{bad}\n</tool_call><|im_end|>")
    assert "malformed tool call JSON" in chat.parse(bad, prefix, None)[1][0].error


def test_step_rewards_on_episodes_are_refused_by_name(tiny_dir, tmp_path):
    """(end, score) step rewards are offsets into a single completion's text: on multi-turn episodes, an error that
    says so and what to give instead (one score per model turn: tests/test_turn_rewards.py)."""
    def steps_per_turn(completions, **kwargs):
        return [[(1, 1.0)] for _ in completions]

    t = GRPOTrainer(model=tiny_dir, reward_funcs=[steps_per_turn], train_dataset=CHAT_ROWS,
                    environment_factory=CounterEnv, engine_factory=ScriptedAgentEngine, args=args(tmp_path))
    with pytest.raises(ValueError, match=r"step rewards as \(end, score\) pairs on multi-turn episodes.*one score "
                                         r"per model turn"):
        t.train()
