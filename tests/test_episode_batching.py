"""Episodes that rejoin the running decode batch (HFEngine.generate's on_turn_end, taken by the turn loop) against the
round loop (one engine call a round): the same greedy tokens, loss masks, finishes and turn records, log-probs equal
to rounding, fewer decode steps where turns are of unequal length, and the same samples run to run under a seed."""

import functools
import time

import pytest
import torch

from aha.data.toolcalls import ToolCall, ToolChat
from aha.envs import Toolbox
from aha.models.tiny import build_model, train_tokenizer
from aha.rollout import HFEngine, SamplingParams
from aha.rollout import hf as engine_module
from aha.rollout.turns import Episode, run_turns

LOGPROB_TOL = 1e-4
"""A rejoining turn is prefilled as its own cohort on top of its kept cache, a round's in one batch with the others:
the products run over other rows and paddings, and round differently. Measured on these tiny float32 models: at most
9.8e-6 apart (llama and qwen2, the two settings of the first test; tests/test_kv_turns.py holds a kept cache against
a re-prefill to the same bound)."""


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog 0123456789 <tool_call> add"] * 20)


def model_of(tok, arch="llama"):
    # a wide init makes logits peaky, so float rounding between the two paths cannot flip an argmax
    return build_model(tok, "tiny", arch, seed=3, overrides={"initializer_range": 0.3}).eval()


@pytest.fixture(scope="module")
def model(tok):
    return model_of(tok)


def add(a: int, b: int) -> str:
    """
    Adds two numbers; now and then says so at length.

    Args:
        a: The first.
        b: The second.
    """
    return f"{a + b}" + " and so on" * (30 if (a + b) % 3 == 0 else 0)


class CallsUntil(ToolChat):
    """Every model turn that ends calls add until the episode has had the turns its prompt names ("turns k")."""

    def parse(self, ids, prefix_ids, tools):
        text = self.tokenizer.decode(prefix_ids)
        want, rounds = int(text.split("turns ")[1].split()[0]), text.count("<|im_start|>tool")
        return "", [ToolCall("add", {"a": rounds, "b": len(ids)})] if rounds + 1 < want else []


def episodes(tok, count: int, group: int = 1, box: Toolbox | None = None) -> tuple[ToolChat, list[Episode]]:
    """count episodes, `group` to a prompt; prompt i asks for 1 + i % 4 turns."""
    chat, box = CallsUntil(tok), box or Toolbox([add], 5.0)
    eps = []
    for k in range(count):
        prompt = [{"role": "user", "content": f"add {k // group} turns {1 + k // group % 4} go"}]
        eps.append(Episode(prompt, chat.prompt_ids(prompt, box.schemas), box))
    return chat, eps


def every_fifteenth(tok) -> list[int]:
    """End-of-turn tokens: a fifteenth of the vocabulary, so turns end after 3 to 40 tokens, unequal."""
    return list(range(0, len(tok), 15))


def steps(monkeypatch) -> list:
    """A list that gets one entry per decode step (each step samples once for its whole batch)."""
    seen, sample = [], engine_module.sample_tokens

    def counting(*args, **kwargs):
        seen.append(1)
        return sample(*args, **kwargs)
    monkeypatch.setattr(engine_module, "sample_tokens", counting)
    return seen


def both(engine, tok, count, group, params, max_rounds, monkeypatch, box=None):
    """The rounds' Rollout and decode steps, then the rejoining one's."""
    out = []
    for rejoin in (False, True):
        seen = steps(monkeypatch)
        chat, eps = episodes(tok, count, group, box)
        out.append((run_turns(engine, chat, eps, group, params, None, max_rounds, rejoin=rejoin), len(seen)))
    return out


def assert_same(a, b):
    assert a.completion_ids == b.completion_ids and a.loss_mask == b.loss_mask and a.truncated == b.truncated
    assert a.episodes == b.episodes and a.prompt_ids == b.prompt_ids
    assert all(abs(x - y) <= LOGPROB_TOL for u, v in zip(a.logprobs, b.logprobs) for x, y in zip(u, v))
    assert [len(x) for x in a.logprobs] == [len(x) for x in b.logprobs]


def static_shapes(monkeypatch):
    """The engine decodes through GraphCache's static step, run eagerly (its CUDA graphs need a GPU): its rows
    cannot join a running batch, so a next turn waits for the batch to end."""
    monkeypatch.setattr(HFEngine, "_cache", lambda self, mask, T, total, packed: engine_module.GraphCache(
        self.model, mask, T, capture=False, packed=packed))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("count, group, budget, max_rounds, finishes", [
    (12, 1, 400, None, {"stop", "length"}),    # 1 to 3 model turns of unequal lengths; budgets run out: tool
                                               # results cut to the budget, or dropped where they leave no room
    (8, 2, 180, 1, {"stop", "tool_limit"}),    # two samples a prompt decoded from one prefill; a turn limit
])
def test_rejoining_gives_the_rounds_tokens_masks_and_records(tok, arch, count, group, budget, max_rounds, finishes,
                                                             monkeypatch):
    engine = HFEngine(model_of(tok, arch), every_fifteenth(tok), tok.pad_token_id)
    params = SamplingParams(0.0, max_new_tokens=budget, logprobs=True)
    (rounds, round_steps), (rejoined, rejoin_steps) = both(engine, tok, count, group, params, max_rounds,
                                                           monkeypatch)
    assert_same(rejoined, rounds)
    assert all(len(ids) <= budget for ids in rejoined.completion_ids) and rejoin_steps <= round_steps
    if arch == "qwen2":  # the settings were chosen for the llama model's episodes; qwen2's need only agree
        return
    assert {e["finish"] for e in rounds.episodes} == finishes
    assert rejoin_steps < round_steps  # no episode waits for the longest turn of a round
    if max_rounds is None:
        turn_lengths = {t["end"] - t["start"] for e in rounds.episodes for t in e["turns"] if t["role"] == "assistant"}
        assert len(turn_lengths) > 10 and sorted({e["calls"] for e in rounds.episodes}) == [0, 1, 2]
        assert any(e["truncated_results"] for e in rounds.episodes)
        assert any("dropped_results" in t for e in rounds.episodes for t in e["turns"])


@pytest.mark.parametrize("cache", ["cohorts", "static", "model"])
def test_rejoining_rows_wait_where_the_batch_is_full_or_cannot_take_them(tok, model, cache, monkeypatch):
    """cohorts: max_batch 3 of 8 episodes, rows joining as the batch frees room (and more cohorts than
    MAX_COHORTS merge); static: GraphCache, whose rows are fixed, so next turns start the next batch; model:
    HFCache (layer_cache off), the model's own forward, which keeps no cache (next turns prefill whole)."""
    if cache == "cohorts":
        monkeypatch.setattr(engine_module, "ADMIT_FRACTION", 0.3)
    if cache == "static":
        static_shapes(monkeypatch)
    engine = HFEngine(model, every_fifteenth(tok), tok.pad_token_id, max_batch=3 if cache == "cohorts" else 512,
                      layer_cache=cache != "model")
    params = SamplingParams(0.0, max_new_tokens=200, logprobs=True)
    (rounds, _), (rejoined, _) = both(engine, tok, 8, 1, params, None, monkeypatch)
    assert_same(rejoined, rounds)
    assert sorted({e["calls"] for e in rounds.episodes}) == [0, 1, 2]


def test_a_next_turn_prefills_only_what_its_own_cache_lacks(tok, model, monkeypatch):
    """Each rejoining cohort prefills the tokens after its rows' kept caches: the tool turn and the model turn's last
    token (sampled, never fed); without keep_caches (an engine whose keep_caches is None) whole contexts, the same
    tokens."""
    seen, forward = [], engine_module.LayerCache.forward

    def counting(self, ids, pos):
        if ids.shape[1] > 1:
            seen.append(tuple(ids.shape))
        return forward(self, ids, pos)
    monkeypatch.setattr(engine_module.LayerCache, "forward", counting)
    outs = []
    for engine in (type("Refill", (HFEngine,), {"keep_caches": None}), HFEngine):
        seen.clear()
        chat, eps = episodes(tok, 6)
        outs.append(run_turns(engine(model, every_fifteenth(tok), tok.pad_token_id), chat, eps, 1,
                              SamplingParams(0.0, max_new_tokens=300, logprobs=True), None, None))
        outs.append(list(seen))
    whole, whole_seen, kept, kept_seen = outs
    assert_same(kept, whole)
    tools = [(len(e.prompt_ids), t) for e, rec in zip(eps, kept.episodes) for t in rec["turns"] if t["role"] == "tool"]
    each = lambda seen: sorted(w for rows, w in seen[1:] for _ in range(rows))  # noqa: E731  a width per row
    # the first prefill is the six prompts; then each cohort of rows whose turns ended at one step (here the rows of
    # a cohort add equally many tokens): its tool turn and the model turn's last token, or, without kept caches, its
    # whole context
    assert kept_seen[0] == whole_seen[0] == (6, len(eps[0].prompt_ids)) and len(each(kept_seen)) == len(tools) > 3
    assert each(kept_seen) == sorted(t["end"] - t["start"] + 1 for _, t in tools)
    assert each(whole_seen) == sorted(p + t["end"] for p, t in tools)


def test_samples_are_the_same_run_to_run_whatever_the_tools_timing(tok, model):
    """temperature 1 under one seed: where episodes rejoin follows from their tokens, never from how long a tool
    took (a tool that sleeps an uneven while gives the samples of an instant one)."""

    @functools.wraps(add)  # the same name and schema: the same prompts
    def slow_add(a: int, b: int) -> str:
        time.sleep(0.02 * ((a + b) % 3))
        return add(a, b)
    outs = []
    for box in (Toolbox([add], 5.0), Toolbox([add], 5.0), Toolbox([slow_add], 5.0)):
        chat, eps = episodes(tok, 6, 2, box)
        engine = HFEngine(model, every_fifteenth(tok), tok.pad_token_id)
        outs.append(run_turns(engine, chat, eps, 2, SamplingParams(1.0, max_new_tokens=120, logprobs=True),
                              torch.Generator().manual_seed(7), None))
    assert outs[0].completion_ids == outs[1].completion_ids == outs[2].completion_ids
    assert outs[0].logprobs == outs[1].logprobs == outs[2].logprobs
    assert outs[0].episodes == outs[2].episodes
    assert len({e["calls"] for e in outs[0].episodes}) > 1


def test_each_row_decodes_at_most_its_own_limit(tok, model):
    """limits: per row what max_new_tokens is to a call; greedy, each row as a call of its own with that budget."""
    engine, prompts = HFEngine(model, [10**6], tok.pad_token_id), [[5, 9, 14, 3], [7], [21, 8, 8, 30, 2]]
    out = engine.generate(prompts, 2, SamplingParams(0.0, max_new_tokens=9, logprobs=True), limits=[1, 9, 4, 2, 7, 9])
    assert [len(c) for c in out.completion_ids] == [1, 9, 4, 2, 7, 9] and all(out.truncated)
    for r, limit in enumerate([1, 9, 4, 2, 7, 9]):
        alone = engine.generate([prompts[r // 2]], 1, SamplingParams(0.0, max_new_tokens=limit))
        assert alone.completion_ids[0] == out.completion_ids[r]


def test_bad_turn_arguments_are_errors_that_name_them(tok, model):
    engine, params = HFEngine(model, [10**6], tok.pad_token_id), SamplingParams(0.0, max_new_tokens=4)
    with pytest.raises(ValueError, match="limits"):
        engine.generate([[5, 9]], 2, params, limits=[4])
    with pytest.raises(ValueError, match="limits"):
        engine.generate([[5, 9]], 1, params, limits=[5])
    with pytest.raises(ValueError, match="on_group or on_turn_end"):
        engine.generate([[5, 9]], 1, params, on_group=lambda i, r: None, on_turn_end=lambda rows, turns: [None])
    with pytest.raises(ValueError, match="next turn"):
        engine.generate([[5, 9]], 1, params, on_turn_end=lambda rows, turns: [([5, 9] + [3] * 10, 4)])



@pytest.mark.parametrize("rejoin", [True, False])
def test_training_takes_the_path_rejoin_episodes_names(tiny_dir, tmp_path, monkeypatch, rejoin):
    """GRPOConfig.rejoin_episodes reaches the turn loop: rejoining by default, rounds when false (slow tools)."""
    from aha import GRPOConfig, GRPOTrainer
    from aha.rollout import turns
    from scripted import CounterEnv
    taken = []
    for path, name in ((turns._rejoining, "rejoin"), (turns._rounds, "rounds")):
        monkeypatch.setattr(turns, path.__name__, lambda *a, _run=path, _name=name: (taken.append(_name), _run(*a))[1])
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=16, progress_bar=False, report_to=[], rejoin_episodes=rejoin)
    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}."}]} for t in range(2, 6)]
    GRPOTrainer(model=tiny_dir, reward_funcs=[lambda completions, **k: [0.0] * len(completions)], args=args,
                train_dataset=rows, environment_factory=CounterEnv).train()
    assert taken and set(taken) == {"rejoin" if rejoin else "rounds"}
