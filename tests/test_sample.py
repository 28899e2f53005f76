"""Rejection sampling: which completions are kept, and the JSONL it writes."""

import json

from aha.config import SampleConfig
from aha.sample import run_sample, select
from aha.tasks import Task, register_task


def test_select_by_hand():
    texts, lengths = ["a", "a", "bb", "c"], [1, 1, 2, 1]
    correct, scores = [True, True, True, False], [1.0, 1.0, 2.0, 9.0]
    assert select(texts, lengths, correct, scores, "best") == [2]            # highest reward, verified
    assert select(texts, lengths, correct, scores, "all_correct") == [0, 2]  # duplicates dropped
    assert select(texts, lengths, correct, scores, "shortest_correct") == [0]
    assert select(texts, lengths, [False] * 4, scores, "best") == []


def _digit_task():
    def has_digit(prompts, completions, **kw):
        return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "id": i} for i in range(6)]
    return register_task(Task(name="test-digits", load=lambda split, n=None, seed=0: rows,
                              rewards=lambda: [has_digit], correct=lambda: has_digit,
                              max_completion_length=6))


def test_rejection_sampling_writes_verified_rows_and_mixes(tiny_dir, tmp_path):
    _digit_task()
    mix = tmp_path / "mix.jsonl"
    mix.write_text("".join(json.dumps({"prompt": f"m{i}", "completion": "x"}) + "\n" for i in range(50)))
    stats = run_sample(SampleConfig(model=tiny_dir, task="test-digits", n=8, keep="all_correct",
                                    mix_dataset=str(mix), mix_ratio=0.5, output_dir=str(tmp_path / "s"),
                                    progress_bar=False))
    rows = [json.loads(line) for line in (tmp_path / "s" / "data.jsonl").read_text().splitlines()]
    kept = [r for r in rows if "reward" in r]
    assert stats["rows_kept"] == len(kept) > 0
    assert all(any(ch.isdigit() for ch in r["completion"]) for r in kept)
    assert stats["rows_mixed_in"] == len(rows) - len(kept) == len(kept)   # ratio 0.5
    per_prompt = (tmp_path / "s" / "per_prompt.jsonl").read_text().splitlines()
    assert len(per_prompt) == 6 and 0 < stats["acceptance_rate"] <= 1



def test_rejection_sampling_scores_and_writes_completions_cut_at_the_next_turn(tiny_dir, tmp_path, monkeypatch):
    """Every decoded completion goes on with a turn of its own ("\\nUser: ..."): the verifier sees it cut at the
    task's stop, and the SFT rows hold the cut text, not the invented turn."""
    import aha.models
    seen, decoded = [], []

    def no_turn(prompts, completions, **kw):
        seen.extend(completions)
        return [0.0 if "User:" in c else 1.0 for c in completions]
    register_task(Task(name="test-turns@plain_base", load=lambda split, n=None, seed=0: [
        {"prompt": f"User: {i}+{i}=\nAssistant:", "answer": str(2 * i), "id": i} for i in range(3)],
        rewards=lambda: [no_turn], correct=lambda: no_turn, max_completion_length=4))  # @plain_base: stop "\nUser:"
    load_tokenizer = aha.models.load_tokenizer

    def with_a_turn(model):
        tok = load_tokenizer(model)
        decode = tok.batch_decode
        monkeypatch.setattr(tok, "batch_decode", lambda ids, **kw: decoded.extend(
            f"{t}\n\nUser: 9+9=\nAssistant: 18" for t in decode(ids, **kw)) or decoded[-len(ids):], raising=False)
        return tok
    monkeypatch.setattr(aha.models, "load_tokenizer", with_a_turn)
    stats = run_sample(SampleConfig(model=tiny_dir, task="test-turns@plain_base", n=2, keep="all_correct",
                                    output_dir=str(tmp_path / "s"), progress_bar=False))
    rows = [json.loads(line) for line in (tmp_path / "s" / "data.jsonl").read_text().splitlines()]
    assert stats["acceptance_rate"] == 1.0 and rows and all("User:" not in r["completion"] for r in rows)
    assert len(decoded) == 6 and all("\nUser: 9+9=" in t for t in decoded)  # what the model "wrote"
    assert len(seen) == 12 and all("User:" not in c for c in seen)  # verifier and training rewards: one call each
