"""Process rewards: step rewards as a reward kind, their token positions, DeepSeekMath's process-supervision
advantage, and the trainer on them (outcome-only runs unchanged)."""

import json
import math

import pytest
import torch

from aha import algos
from aha.config import GRPOConfig
from aha.rewards import score_completions
from aha.rewards.steps import Step, clean_steps, delimited_ends, is_steps, step_mean, step_tokens
from aha.train.grpo import GRPOTrainer
from scripted import ScriptedEngine

NAN = float("nan")


def z(x, values, eps=algos.ADV_EPS):
    """(x - mean) / (unbiased std + eps) of a pool, by hand."""
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return (x - m) / (sd + eps)


# ---------------------------------------------------------------- the advantage, by hand
def test_process_advantage_two_groups_uneven_steps():
    """G=2, T=4. Group 0: completion 0 has steps at tokens 0 (score 1) and 2 (score 0) and outcome 1 at its last
    token 3; completion 1 one step at token 1 (score 0) and outcome 0 at token 2. Pool {1, 0 | 1, 0, 0}: mean 0.4,
    unbiased std sqrt(1.2 / 4) = 0.5477, so a 1 is +1.0954 and a 0 is -0.7303.
    Completion 0: A = [1.0954 - 0.7303 + 1.0954, -0.7303 + 1.0954, same, 1.0954] = [1.4606, 0.3651, 0.3651, 1.0954].
    Completion 1: A = [-0.7303 * 2, -0.7303 * 2, -0.7303, 0] (nothing ends after its outcome at token 2).
    Group 1: outcomes 1 and 1 and one step of 1: every value equal, so every advantage is exactly 0."""
    pool = [1, 0, 1, 0, 0]
    one, zero = z(1, pool), z(0, pool)
    assert z(1, pool, eps=0) == pytest.approx(1.0954, abs=1e-4) and z(0, pool, eps=0) == pytest.approx(-0.7303, abs=1e-4)
    adv, metrics = algos.process_advantages(
        outcome=torch.tensor([1.0, 0.0, 1.0, 1.0]), last=torch.tensor([3, 2, 1, 3]),
        seq=torch.tensor([0, 0, 1, 3]), token=torch.tensor([0, 2, 1, 0]), score=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        length=4, group_size=2)
    want = torch.tensor([[one + zero + one, zero + one, zero + one, one],
                         [2 * zero, 2 * zero, zero, 0.0],
                         [0.0, 0.0, 0.0, 0.0],
                         [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)
    assert metrics["reward/zero_std_frac"] == 0.5  # group 1's pool is all equal


def test_steps_ending_on_one_token_add_up_and_a_missing_outcome_is_no_step():
    """G=2: completion 0 has no outcome (NaN) and two steps on token 1 (scores 1 and 0); completion 1 outcome 0 at
    token 0. Pool {0 | 1, 0}: mean 1/3, std 0.5774: z(1) = +1.1545, z(0) = -0.5773. Completion 0: token 1 carries
    1.1545 - 0.5773 = 0.5773, and so does token 0 (steps at or after it); completion 1: -0.5773 on token 0 only."""
    pool = [0, 1, 0]
    adv, _ = algos.process_advantages(torch.tensor([NAN, 0.0]), torch.tensor([2, 0]), seq=torch.tensor([0, 0]),
                                      token=torch.tensor([1, 1]), score=torch.tensor([1.0, 0.0]), length=3,
                                      group_size=2)
    s = z(1, pool) + z(0, pool)
    torch.testing.assert_close(adv, torch.tensor([[s, s, 0.0], [z(0, pool), 0.0, 0.0]]), rtol=0, atol=1e-6)


def test_outcome_only_is_exactly_grpo():
    """No step rewards: every token up to a completion's last one carries grpo's advantage, bit for bit (NaN
    rewards and equal groups included); tokens after the last carry 0."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=g)
    rewards[[3, 9, 10]] = NAN
    rewards[16:20] = 0.5                                           # an equal group
    last = torch.randint(0, 7, (24,), generator=g)
    none = torch.zeros(0, dtype=torch.long)
    adv, m = algos.process_advantages(rewards, last, none, none, torch.zeros(0), length=7, group_size=4)
    want, m_want = algos.compute_advantages("grpo", rewards, 4)
    upto = torch.arange(7) <= last.unsqueeze(-1)                   # [N,T]
    assert torch.equal(adv, torch.where(upto, want.unsqueeze(-1).expand(24, 7), torch.zeros(24, 7)))
    assert m == m_want
    assert algos.is_process("grpo_process") and not algos.is_process("grpo")
    assert torch.equal(algos.compute_advantages("grpo_process", rewards, 4)[0], want)


# ---------------------------------------------------------------- steps and their tokens
def _bpe(vocab: list[str], merges: list[tuple[str, str]], byte_level: bool = False):
    """A fast tokenizer built in code: BPE with these merges and no pre-tokenizer, so merges cross step boundaries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE({v: i for i, v in enumerate(vocab)}, merges))
    tok.decoder = decoders.Fuse()  # pieces joined as they are (the default joins them with spaces)
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_step_ends_map_to_the_token_holding_their_last_character():
    """Tokens "ab" "c=" "3" of "abc=3" (merges across step boundaries): a step "a" ends inside token 0, "abc"
    inside token 1 ("c="), "abc=" at its end, "abc=3" on token 2; an end of 0 is token 0, one past the text the
    last token."""
    tok = _bpe(["a", "b", "c", "=", "3", "ab", "c="], [("a", "b"), ("c", "=")])
    ids = tok("abc=3", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["ab", "c=", "3"] and tok.decode(ids) == "abc=3"
    assert step_tokens(tok, ids, [1, 2, 3, 4, 5, 0, 99]) == [0, 0, 1, 1, 2, 0, 2]
    assert step_tokens(tok, ids, []) == []
    with pytest.raises(ValueError, match="empty completion"):
        step_tokens(tok, [], [3])


def test_a_character_split_over_byte_tokens_belongs_to_its_last_byte():
    """"xé": byte-level tokens "x", "Ã" (0xC3), "©" (0xA9); the prefix "x" + 0xC3 decodes to "x\\ufffd". A step
    ending after "é" (end 2) is on token 2, where "é" is complete; one ending after "x" on token 0."""
    tok = _bpe(["x", "Ã", "©"], [], byte_level=True)
    ids = tok("xé", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 and tok.decode(ids) == "xé" and tok.decode(ids[:2]).endswith("\ufffd")
    assert step_tokens(tok, ids, [1, 2]) == [0, 2]


def test_step_values_and_helpers():
    assert is_steps([(3, 1.0), [5, 0]]) and is_steps([]) and not is_steps([0.5, 1.0]) and not is_steps(0.5)
    assert not is_steps([(True, 1.0)]) and not is_steps([(1.5, 1.0)]) and not is_steps([(1, 2, 3)])
    steps = clean_steps([(9, 0.0), (4, "1"), (6, float("inf"))], text_len=8)
    assert [s.end for s in steps] == [4, 6, 8] and steps[0].score == 1.0 and math.isnan(steps[1].score)
    assert step_mean(steps) == 0.5 and math.isnan(step_mean([])) and math.isnan(step_mean([Step(2, NAN)]))
    with pytest.raises(ValueError, match="ends at character -1"):
        clean_steps([(-1, 1.0)])
    assert delimited_ends("a=1\nb=2\n\nc=3\n") == [3, 7, 12]
    assert delimited_ends("a=1\n\nb=2", "\n\n") == [3, 8] and delimited_ends("") == []


# ---------------------------------------------------------------- scoring
def steps_by_line(prompts, completions, **kw):
    """One step per line: 1.0 when the line holds "ok"."""
    return [[(end, float("ok" in c[:end].rsplit("\n", 1)[-1])) for end in delimited_ends(c)] for c in completions]


def test_scoring_takes_step_lists_beside_numbers():
    """A step function's matrix entry is its mean usable score; steps_out has (end, score, function) triples; an
    unusable score is counted in reward/nan and kept as NaN; no step written is "not applicable" (NaN, no error)."""
    def mixed(prompts, completions, **kw):
        return [[(2, 1.0), (5, "bad")], 0.25, [], None]

    out: list = []
    comps = ["ok\nno", "ok\nok", "x", ""]
    rewards, m = score_completions([steps_by_line, mixed], [""] * 4, comps, {}, steps_out=out)
    torch.testing.assert_close(rewards[:, 0], torch.tensor([0.5, 1.0, 0.0, NAN]), equal_nan=True)
    torch.testing.assert_close(rewards[:, 1], torch.tensor([1.0, 0.25, NAN, NAN]), equal_nan=True)
    assert out[0][:2] == [(2, 1.0, 0), (5, 0.0, 0)] and out[0][2] == (2, 1.0, 1) and math.isnan(out[0][3][1])
    assert out[1] == [(2, 1.0, 0), (5, 1.0, 0)] and out[3] == [] and m["reward/nan"] == 1
    assert m["reward/errors"] == 0


@pytest.mark.parametrize("value, what", [([[0.5]] * 2, r"shape \(2, 1\)"), ([[(1, 1.0)], [(1, 2, 3)]], "list"),
                                         ([[(-2, 1.0)], []], "ends at character -2")])
def test_malformed_steps_are_a_clear_error(value, what):
    with pytest.raises(ValueError, match=what):
        score_completions([lambda prompts, completions, **kw: value], [""] * 2, ["ab", "cd"], {})


# ---------------------------------------------------------------- the trainer
PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def ids_mod3(prompts, completions, completion_ids, **kw):
    return [float(sum(ids) % 3) for ids in completion_ids]


def first_chars(prompts, completions, **kw):
    """A step at each of the first three characters, scoring 1 when the character is in the first half of 'a-z'."""
    return [[(k + 1, float(c[k] < "n")) for k in range(min(3, len(c)))] for c in completions]


def run(path, tiny_dir, rewards, **kw):
    args = GRPOConfig(**{**dict(output_dir=str(path), max_steps=2, num_generations=4, per_device_train_batch_size=8,
                                max_completion_length=12, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                                log_completions_steps=0, log_groups_steps=1, seed=0), **kw})
    torch.set_num_threads(1)
    try:
        trainer = GRPOTrainer(model=tiny_dir, reward_funcs=rewards, args=args, train_dataset=PROMPTS,
                              engine_factory=ScriptedEngine)
        trainer.train()
    finally:
        torch.set_num_threads(2)
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()], trainer


def test_outcome_only_runs_are_unchanged_under_grpo_process(tiny_dir, tmp_path):
    """Same seed, outcome rewards only: grpo_process and grpo log the same numbers."""
    a, _ = run(tmp_path / "grpo", tiny_dir, [ids_mod3], advantage_estimator="grpo")
    b, _ = run(tmp_path / "process", tiny_dir, [ids_mod3], advantage_estimator="grpo_process")
    for x, y in zip(a, b):
        keys = {k for k in x if not k.startswith(("perf/", "time", "sync/"))}
        assert keys == {k for k in y if not k.startswith(("perf/", "time", "sync/"))}
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}


def test_step_rewards_train_token_by_token(tiny_dir, tmp_path):
    """Under grpo_process the step rewards give tokens of one completion different advantages (groups.jsonl records
    them with each step's token and score), process/* metrics are logged, and the weights move; under grpo the same
    rewards count as one number per completion (the mean step score times its weight)."""
    rows, trainer = run(tmp_path / "p", tiny_dir, [ids_mod3, first_chars], advantage_estimator="grpo_process",
                        reward_weights=[1.0, 0.5])
    assert all(r["process/steps_per_completion"] > 0 and 0 <= r["process/step_reward_mean"] <= 1
               and r["process/scored_frac"] == 1.0 for r in rows)
    groups = [json.loads(line) for line in (tmp_path / "p" / "groups.jsonl").read_text().splitlines()]
    seqs = [c for g in groups for c in g["completions"] if c["steps"]]
    varied = [c for c in seqs if "advantage" in c["tokens"]]
    assert varied, "no completion's tokens got different advantages"
    for c in seqs:
        assert [s["reward"] for s in c["steps"]] == ["first_chars"] * len(c["steps"])
        assert [s["end"] for s in c["steps"]] == list(range(1, len(c["steps"]) + 1))  # first_chars' ends
        assert all(0 <= s["token"] < len(c["tokens"]["piece"]) for s in c["steps"])
    for c in varied:
        adv = c["tokens"]["advantage"]
        assert c["advantage"] == adv[0] and len(adv) == len(c["tokens"]["piece"])
    outcome, _ = run(tmp_path / "o", tiny_dir, [ids_mod3, first_chars], advantage_estimator="grpo",
                     reward_weights=[1.0, 0.5])
    assert outcome[0]["reward/first_chars/mean"] == rows[0]["reward/first_chars/mean"]
    assert outcome[0]["reward/mean"] == rows[0]["reward/mean"]


def test_steps_scored_in_several_places_are_the_steps_scored_in_one(tiny_dir, tmp_path):
    """The Ray path: reward columns scored elsewhere (score_rollout per worker, its function indices its own) are
    joined by from_parts into the batch one process makes: same rewards, same steps (function indices remapped)."""
    from aha.rollout.experience import score_rollout
    trainer = GRPOTrainer(model=tiny_dir, reward_funcs=[first_chars, ids_mod3, first_chars],
                          args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=4,
                                          per_device_train_batch_size=8, max_completion_length=12,
                                          progress_bar=False, report_to=[]),
                          train_dataset=PROMPTS, engine_factory=ScriptedEngine)
    x = trainer.experience
    rows, ids = x.prompts.take(2)
    out, texts = x.generation.run(rows, ids, x.generator)
    one, _ = x.score(rows, ids, out, texts, 0)
    parts = [([2, 0], score_rollout([first_chars, first_chars], rows, out, texts, None, 10.0)),
             ([1], score_rollout([ids_mod3], rows, out, texts, None, 10.0))]
    joined, _ = x.from_parts(rows, ids, out, texts, parts)
    assert torch.equal(one.rewards_per_func, joined.rewards_per_func)
    assert one.steps is not None and [sorted(s) for s in one.steps] == [sorted(s) for s in joined.steps]
    assert {j for seq in one.steps for _, _, j, _ in seq} == {0, 2}


def test_batches_joined_keep_the_steps_of_the_parts_that_have_them():
    """Groups scored apart (stream_rewards, dynamic sampling) are joined with GRPOBatch.cat: a group whose
    completions wrote no step keeps the others' steps, with none of its own."""
    from aha.batch import GRPOBatch

    def part(steps):
        return GRPOBatch(rows=[{"prompt": "p"}], prompt_ids=[[1], [1]], completion_ids=[[2, 3], [4]],
                         texts=["ab", "c"], truncated=torch.zeros(2, dtype=torch.bool),
                         rewards_per_func=torch.zeros(2, 1), rewards=torch.zeros(2), advantages=torch.zeros(2),
                         versions=torch.zeros(2, dtype=torch.long), steps=steps)

    joined = GRPOBatch.cat([part(None), part([[(1, 0, 0, 1.0)], []])])
    assert joined.steps == [[], [], [(1, 0, 0, 1.0)], []]
    assert GRPOBatch.cat([part(None), part(None)]).steps is None
