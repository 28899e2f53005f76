"""The key/value cache kept across an episode's turns (HFEngine.keep_caches, used by the turn loop) against
prefilling every context again: the same greedy tokens, log-probs equal to rounding, only the added tokens
prefilled, and the caches of rows that ended freed."""

import gc
import weakref

import pytest
import torch

from aha.data.toolcalls import ToolCall, ToolChat
from aha.envs import Toolbox
from aha.models.tiny import build_model, train_tokenizer
from aha.rollout import HFEngine, SamplingParams
from aha.rollout import hf as engine_module
from aha.rollout.turns import Episode, run_turns

PROMPTS = [[5, 9, 14, 3], [7], [21, 8, 8, 30, 2, 11, 4]]  # unequal lengths: left padding, kept prefixes unequal
LOGPROB_TOL = 1e-4
"""Kept keys and values were computed by decode steps, a re-prefill computes them in one prefill; the kernels round
differently. Measured on these tiny float32 models: at most 9.2e-6 apart (3 prompts x 3 samples, 7 rounds of 10
tokens, llama and qwen2). Under CPU bf16 autocast the kept keys and values are bf16 and the two paths differ by the
bf16 rounding of decode against prefill: 2e-5 to 1e-4 at the usual init, 2e-2 with these peaky weights, where a
near tie (two tokens within 0.03 nats) can then go either way."""


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog 0123456789 <tool_call> add"] * 20)


def model_of(tok, arch="llama"):
    # a wide init makes logits peaky, so float rounding between the two paths cannot flip an argmax
    return build_model(tok, "tiny", arch, seed=3, overrides={"initializer_range": 0.3}).eval()


class Refill(HFEngine):
    """The engine without kept caches: every call prefills its whole contexts."""

    keep_caches = None


def prefilled(monkeypatch) -> list[int]:
    """A list that gets the tokens each prefill (a LayerCache forward of more than one token) computes."""
    seen, forward = [], engine_module.LayerCache.forward

    def counting(self, ids, pos):
        if ids.shape[1] > 1:
            seen.append(ids.shape[1] * ids.shape[0])
        return forward(self, ids, pos)
    monkeypatch.setattr(engine_module.LayerCache, "forward", counting)
    return seen


def rounds(engine, keep: bool, n: int = 3, R: int = 4, T: int = 6):
    """A first call with n samples of each prompt, then R calls that each extend every row's context by three
    'tool' tokens and generate again; inside keep_caches where `keep`. Each call's Rollout."""
    params, outs = SamplingParams(temperature=0, max_new_tokens=T, logprobs=True), []
    with engine.keep_caches() if keep else torch.no_grad():
        out = engine.generate(PROMPTS, n, params)
        contexts, outs = [PROMPTS[i // n] + c for i, c in enumerate(out.completion_ids)], [out]
        for r in range(R):
            contexts = [c + [11, 12, 13 + r] for c in contexts]
            outs.append(engine.generate(contexts, 1, params))
            contexts = [c + o for c, o in zip(contexts, outs[-1].completion_ids)]
    return outs


def assert_same(kept, refilled):
    for a, b in zip(kept, refilled):
        assert a.completion_ids == b.completion_ids and a.truncated == b.truncated
        assert all(abs(x - y) <= LOGPROB_TOL for u, v in zip(a.logprobs, b.logprobs) for x, y in zip(u, v))


def poison_new_buffers(monkeypatch):
    """Key/value buffers start as NaN, not as whatever memory held: a column read before it is written shows.
    (GraphCache's are zeros by design: its static step reads unwritten columns, masked.)"""
    init = engine_module.LayerCache.__init__

    def poisoned(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for x in self.k + self.v:
            x.fill_(0.0 if isinstance(self, engine_module.GraphCache) else float("nan"))
    monkeypatch.setattr(engine_module.LayerCache, "__init__", poisoned)


def static_shapes(monkeypatch):
    """The engine decodes through GraphCache's static step, run eagerly (its CUDA graphs need a GPU)."""
    monkeypatch.setattr(HFEngine, "_cache", lambda self, mask, T, total, packed: engine_module.GraphCache(
        self.model, mask, T, capture=False, packed=packed))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("max_batch, chunk, admit, graph", [(512, 256, 1.0, False), (4, 2, 1.0, False),
                                                            (4, 256, 0.5, False), (4, 256, 1.0, True)])
def test_kept_caches_give_the_re_prefill_tokens_and_logprobs(tok, arch, max_batch, chunk, admit, graph, monkeypatch):
    """max_batch 4: rows in several batches (admit 1) or joining as cohorts (admit 0.5), so kept caches are read
    into any of them; chunk 2: the cache grows while decoding; graph: GraphCache's static step, whose finished rows
    stay in the batch. Two EOS tokens from the middle of the outputs: some rows end early and leave the batch
    (their caches kept as they leave), others run to the budget."""
    monkeypatch.setattr(engine_module, "CACHE_CHUNK", chunk)
    monkeypatch.setattr(engine_module, "ADMIT_FRACTION", admit)
    if graph:
        static_shapes(monkeypatch)
    model = model_of(tok, arch)
    plain = rounds(Refill(model, [10**6], tok.pad_token_id), keep=False)
    eos = sorted({plain[1].completion_ids[0][2], plain[2].completion_ids[5][3]})
    refills = prefilled(monkeypatch)
    refilled = rounds(Refill(model, eos, tok.pad_token_id, max_batch), keep=False)
    assert any(refilled[r].truncated[i] != refilled[r].truncated[j] for r in range(5) for i in range(9)
               for j in range(9))  # some rows end early, some run on
    keeps = prefilled(monkeypatch)
    poison_new_buffers(monkeypatch)
    assert_same(rounds(HFEngine(model, eos, tok.pad_token_id, max_batch), keep=True), refilled)
    assert sum(keeps) < sum(refills) / 2


def test_each_round_prefills_only_the_tokens_added_since_the_last(tok, monkeypatch):
    model = model_of(tok)
    seen = prefilled(monkeypatch)
    rounds(HFEngine(model, [10**6], tok.pad_token_id), keep=True, n=3, R=4, T=6)
    # the prompts once, padded to the longest (3 x 7); then each row's last token (sampled, never fed) and the
    # three added, the 9 rows' counts equal: 9 x 4 a round
    assert seen == [3 * 7] + [9 * 4] * 4


def test_the_caches_of_rows_that_ended_are_freed(tok):
    model = model_of(tok)
    engine = HFEngine(model, [10**6], tok.pad_token_id, max_batch=2)
    params = SamplingParams(temperature=0, max_new_tokens=4)
    with engine.keep_caches():
        out = engine.generate(PROMPTS, 1, params)
        assert len(engine.kept) == 2  # at most max_batch rows' caches: the third row's is not kept
        first = weakref.ref(next(iter(engine.kept.by_tail.values()))[0][1].k[0])
        engine.generate([PROMPTS[0] + out.completion_ids[0] + [11, 12]], 1, params)  # only the first row goes on
        gc.collect()
        assert len(engine.kept) == 1 and first() is None  # the last call's caches, read or not, are gone
        engine.update_weights(model, 1)
        assert len(engine.kept) == 0  # computed by the old weights
    assert engine.kept is None


@pytest.mark.parametrize("max_batch", [512, 2])  # every row admitted at once; the last row admitted in a later batch
def test_the_last_calls_caches_are_freed_once_every_row_is_admitted(tok, max_batch):
    engine = HFEngine(model_of(tok), [10**6], tok.pad_token_id, max_batch=max_batch)
    params, alive = SamplingParams(temperature=0, max_new_tokens=4), []
    with engine.keep_caches():
        out = engine.generate(PROMPTS, 1, params)
        refs = [weakref.ref(x) for same in engine.kept.by_tail.values() for _, hit in same for x in hit.k + hit.v]
        contexts = [p + c + [11, 12] for p, c in zip(PROMPTS, out.completion_ids)]

        def report(i, rollout):  # runs inside generate, once each prompt's rows end
            gc.collect()
            alive.append(sum(r() is not None for r in refs))
        engine.generate(contexts, 1, params, on_group=report)
    assert refs and len(alive) == len(PROMPTS)
    assert alive[-1] == 0  # the last prompt ends after every row started: the old store is gone before the call returns


def test_a_kept_cache_is_found_by_the_longest_prefix_that_leaves_a_token_to_prefill():
    kept, tail = engine_module.KeptCaches(8), engine_module.KeptCaches.TAIL
    for tokens in ([1, 2, 3, 4, 5], [1, 2, 3], [9, 9], [0] * 10 + list(range(1, tail + 1)), [1, 2, 3]):
        kept.put(tokens, [torch.tensor(len(tokens))], [])
    assert len(kept) == 4  # the same tokens twice are kept once
    length = lambda context: getattr(kept.find(context), "length", None)  # noqa: E731
    assert length([1, 2, 3, 4, 5, 6]) == 5 and length([1, 2, 3, 4, 5]) == 3 and length([1, 2, 3, 7]) == 3
    assert length([1, 2]) is None and length([9, 9]) is None and length([9, 9, 1]) == 2
    assert length([5] * 10 + list(range(1, tail + 2))) is None  # the same last tokens after another start
    assert length([0] * 10 + list(range(1, tail + 2))) == 10 + tail


def add(a: int, b: int) -> int:
    """
    Adds two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class CallsTwice(ToolChat):
    """Every model turn that ends with EOS calls add(1, 2), until the episode has had two tool turns."""

    def parse(self, ids, prefix_ids, tools):
        rounds = self.tokenizer.decode(prefix_ids).count("<|im_start|>tool")
        return "", [ToolCall("add", {"a": 1, "b": 2})] if rounds < 2 else []


def test_the_turn_loop_keeps_each_episodes_cache_between_rounds(tok, monkeypatch):
    model, chat, runs = model_of(tok), CallsTwice(tok), []
    eos = list(range(0, len(tok), 3))  # a third of the vocabulary ends a turn: turns of a few tokens
    for engine in (Refill(model, eos, tok.pad_token_id), HFEngine(model, eos, tok.pad_token_id)):
        seen = prefilled(monkeypatch)
        prompt = [{"role": "user", "content": "add one and two"}]
        box = Toolbox([add], 5.0)
        eps = [Episode(prompt, chat.prompt_ids(prompt, box.schemas), box) for _ in range(4)]
        out = run_turns(engine, chat, eps, 2, SamplingParams(0.0, max_new_tokens=300, logprobs=True), None, None)
        runs.append((out, seen))
    (plain, refills), (kept, keeps) = runs
    assert [e["calls"] for e in kept.episodes] == [2] * 4 and kept.loss_mask == plain.loss_mask
    assert_same([kept], [plain])
    added = [[t["end"] - t["start"] + 1 for t in e["turns"] if t["role"] == "tool"] for e in kept.episodes]
    # two groups, each prompt prefilled once; then a round's rows, each the tokens added to it (its tool turn and
    # the last token of its model turn), left-padded to the most added
    assert keeps == [2 * len(eps[0].prompt_ids)] + [4 * max(a[r] for a in added) for r in (0, 1)]
    assert sum(keeps) < sum(refills) / 2
