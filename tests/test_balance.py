"""balance_by: prompts drawn round-robin over a column's values, resumable, refused where it cannot hold."""

import pytest

from aha.config import GRPOConfig
from aha.data.sampler import BalancedSampler, balance_labels
from aha.train.grpo import GRPOTrainer

LABELS = ["a"] * 6 + ["b"] * 2 + ["c"]  # rows 0-5 a, 6-7 b, 8 c


def test_draws_cycle_through_the_values_and_each_values_rows_are_permutations():
    s = BalancedSampler(LABELS, seed=0)
    drawn = s.take(18)                                  # 6 rounds of (a, b, c)
    assert [LABELS[i] for i in drawn] == ["a", "b", "c"] * 6
    a, b, c = drawn[0::3], drawn[1::3], drawn[2::3]
    assert sorted(a) == list(range(6))                  # a's 6 rows, each once in its first pass
    assert sorted(b[:2]) == sorted(b[2:4]) == sorted(b[4:]) == [6, 7]  # b's 2 rows: a fresh permutation each pass
    assert c == [8] * 6                                 # the rare value is drawn as often as the common one
    assert BalancedSampler(LABELS, seed=0).take(18) == drawn  # seeded
    assert BalancedSampler(LABELS, 0, shuffle=False).take(6) == [0, 6, 8, 1, 7, 8]  # in dataset order


def test_a_restored_sampler_draws_what_the_uninterrupted_one_would():
    full = BalancedSampler(LABELS, seed=3).take(20)
    first = BalancedSampler(LABELS, seed=3, column="family")
    head = first.take(7)
    state = first.state()
    assert state == {"index": 7, "n": 9, "balance_by": "family", "values": 3, "labels_sha256": first.labels_sha256}
    assert head + BalancedSampler(LABELS, seed=3, column="family").restored(state).take(13) == full


def test_a_changed_dataset_or_draw_order_is_refused_at_resume():
    s = BalancedSampler(LABELS, seed=0, column="family")
    with pytest.raises(ValueError, match="changed since the checkpoint"):
        BalancedSampler(LABELS + ["d"], 0, column="family").restored(s.state())
    with pytest.raises(ValueError, match="was balance_by changed"):
        s.restored({"epoch": 0, "index": 3, "n": 9})    # a plain shuffled order's position
    relabelled = ["b"] + LABELS[1:6] + ["a", "b", "c"]  # rows 0 and 6 swap values: the same counts, other draws
    with pytest.raises(ValueError, match="other values: the dataset changed since the checkpoint"):
        BalancedSampler(relabelled, 0, column="family").restored(s.state())
    old = {k: v for k, v in s.state().items() if k != "labels_sha256"}  # a checkpoint from before the digest
    assert BalancedSampler(LABELS, 0, column="family").restored(old).index == 0


def test_a_nan_label_is_refused_naming_the_column_and_the_row():
    rows = [{"family": "a"}, {"family": float("nan")}]
    with pytest.raises(ValueError, match=r"balance_by='family': dataset row 1's value is NaN, which equals no value"):
        balance_labels(rows, "family")


def test_a_long_run_keeps_one_permutation_per_value():
    s = BalancedSampler(LABELS, seed=0)
    drawn = s.take(3000)                                # 1000 passes over c, 500 over b, about 167 over a
    assert len(s._perms) == 3 and drawn == BalancedSampler(LABELS, seed=0).take(3000)
    assert drawn[-3:] == BalancedSampler(LABELS, seed=0, index=2997).take(3)  # any position, from scratch


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _args(tmp_path, **kw):
    return GRPOConfig(**{**dict(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=2,
                                per_device_train_batch_size=6, max_completion_length=4, progress_bar=False,
                                report_to=["jsonl"], log_completions_steps=0, seed=0), **kw})


def test_the_trainer_draws_each_family_equally_when_balance_by_names_the_column(tiny_dir, tmp_path):
    rows = [{"prompt": f"{i}+1=", "family": "common"} for i in range(40)] + [{"prompt": "7*7=", "family": "rare"}]
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=_args(tmp_path, balance_by="family"),
                    train_dataset=rows)
    batch, _ = t.next_batch()                           # 3 prompts: common, rare, common
    assert [r["family"] for r in batch.rows] == ["common", "rare", "common"]
    with pytest.raises(ValueError, match="dataset row 41 has no column 'family'"):
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=_args(tmp_path, balance_by="family"),
                    train_dataset=rows + [{"prompt": "1+1="}])


def test_balance_by_is_refused_for_a_streaming_dataset(tiny_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    stream = datasets.IterableDataset.from_generator(lambda: ({"prompt": "1+1=", "family": "x"} for _ in range(4)))
    with pytest.raises(ValueError, match="balance_by='family' needs a dataset of known rows"):
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=_args(tmp_path, balance_by="family"),
                    train_dataset=stream)


def test_a_resumed_run_draws_on_from_the_balanced_position(tiny_dir, tmp_path):
    rows = [{"prompt": f"{i}+1=", "family": "common"} for i in range(40)] + [{"prompt": "7*7=", "family": "rare"}]
    whole = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=rows,
                        args=_args(tmp_path / "whole", balance_by="family", max_steps=3))
    whole.train()
    first = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=rows,
                        args=_args(tmp_path / "split", balance_by="family", max_steps=2, save_steps=2))
    first.train()
    resumed = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=rows,
                          args=_args(tmp_path / "split", balance_by="family", max_steps=3, resume=True))
    resumed.train()
    assert isinstance(resumed.sampler, BalancedSampler)
    assert resumed.sampler.state() == whole.sampler.state() == {"index": 9, "n": 41, "balance_by": "family",
                                                                 "values": 2,
                                                                 "labels_sha256": whole.sampler.labels_sha256}
