"""TRL habits around the loop: transformers TrainerCallback objects, eval_dataset scored with the rewards."""

import json

import pytest
from transformers import TrainerCallback

from aha.config import GRPOConfig
from aha.train.grpo import GRPOTrainer

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def digit_share(prompts, completions, **kw):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=4, num_generations=4, per_device_train_batch_size=8,
                max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                log_completions_steps=0, seed=0, save_steps=2)
    return GRPOConfig(**{**base, **kw})


class Recorder(TrainerCallback):
    def __init__(self, stop_at=None):
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, args, state, control, **kw):
        self.events.append(("begin", state.global_step, state.max_steps))

    def on_log(self, args, state, control, logs=None, **kw):
        self.events.append(("log", state.global_step, "reward/mean" in logs))

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.events.append(("evaluate", state.global_step, sorted(metrics)))

    def on_save(self, args, state, control, **kw):
        self.events.append(("save", state.global_step))

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step_end", state.global_step))
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kw):
        self.events.append(("end", state.global_step, len(state.log_history)))


def test_callbacks_get_trls_events_and_can_stop_the_run(tiny_dir, tmp_path):
    rec = Recorder(stop_at=3)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path), train_dataset=PROMPTS,
                    callbacks=[rec])
    t.train()
    assert t.step_count == 3  # stopped by control.should_training_stop after step 3 of 4
    assert rec.events == [("begin", 0, 4),
                          ("log", 1, True), ("step_end", 1),
                          ("log", 2, True), ("step_end", 2), ("save", 2),
                          ("log", 3, True), ("step_end", 3), ("save", 3),  # the stopped run is checkpointed
                          ("end", 3, 4)]  # 3 logged steps, then train()'s summary, as transformers' log_history
    assert (tmp_path / "run" / "checkpoint-3").is_dir()


def test_eval_dataset_is_scored_with_the_reward_functions(tiny_dir, tmp_path):
    rec = Recorder()
    held_out = [{"prompt": f"{a}+9=", "answer": str(a + 9)} for a in range(5)]
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=2, eval_steps=2),
                    train_dataset=PROMPTS, eval_dataset=held_out, callbacks=[rec])
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/reward/mean" in r] == [0, 2]  # before training, then every 2 steps
    final = rows[-1]
    assert 0.0 <= final["eval/reward/digit_share/mean"] <= 1.0
    assert final["eval/reward/mean"] == pytest.approx(final["eval/reward/digit_share/mean"])
    assert ("evaluate", 2, ["eval/reward/digit_share/mean", "eval/reward/mean"]) in rec.events


def test_eval_steps_with_nothing_to_evaluate_is_said(tiny_dir, tmp_path, caplog):
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=1, eval_steps=1),
                    train_dataset=PROMPTS)
    with caplog.at_level("WARNING", logger="aha.train"):
        t.train()
    assert "eval_steps=1 but nothing to evaluate" in caplog.text


def test_bf16_is_mixed_precision_with_float32_weights(tiny_dir, tmp_path):
    import torch
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=1, bf16=True),
                    train_dataset=PROMPTS)
    seen = set()
    hook = t.model.lm_head.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train()
    hook.remove()
    assert seen == {torch.bfloat16}  # every forward (generation, training) ran under autocast
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # the weights stay float32
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())  # and they were updated


def test_fp16_on_a_cpu_and_both_precisions_are_refused(tiny_dir, tmp_path):
    from aha.config import ConfigError
    with pytest.raises(ConfigError, match="bf16 and fp16 are both set"):
        args(tmp_path, bf16=True, fp16=True)
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=1, fp16=True),
                    train_dataset=PROMPTS)
    with pytest.raises(ValueError, match="fp16 mixed precision needs a CUDA device; on a CPU use bf16=true"):
        t.train()


def test_a_checkpoint_loads_with_from_pretrained(tiny_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args(tmp_path, max_steps=2), train_dataset=PROMPTS)
    t.train()
    ckpt = tmp_path / "run" / "checkpoint-2"
    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)
    mine = dict(t.model.named_parameters())
    assert all(torch.equal(p, mine[n]) for n, p in loaded.named_parameters())


@pytest.mark.parametrize("streaming", [False, True])
def test_a_trl_script_runs_unchanged(tiny_dir, tmp_path, streaming):
    """What a TRL user writes, word for word apart from the import."""
    from datasets import Dataset, IterableDataset

    from aha import GRPOConfig as Config, GRPOTrainer as Trainer  # from trl import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(8 - len(c)) for c in completions]

    data = Dataset.from_list([{"prompt": r["prompt"]} for r in PROMPTS])
    train = IterableDataset.from_generator(lambda: iter(data)) if streaming else data
    rec = Recorder()
    training_args = Config(output_dir=str(tmp_path / "trl"), bf16=True, report_to="none", log_completions=True,
                           num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
                           max_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2, learning_rate=1e-3,
                           scale_rewards="group", loss_type="dapo", beta=0.0, seed=0)
    trainer = Trainer(model=tiny_dir, reward_funcs=reward_len, args=training_args, train_dataset=train,
                      eval_dataset=data.select(range(4)), callbacks=[rec])
    trainer.train()
    assert trainer.step_count == 2 and ("end", 2, 3) in rec.events  # 2 logged steps and train()'s summary
    assert (tmp_path / "trl" / "completions.jsonl").is_file()
    assert (tmp_path / "trl" / "metrics.jsonl").read_text().count("\n") == 3  # step 0 (eval), 1, 2: report_to="none" turns trackers off only
    assert any(e[0] == "evaluate" and "eval/reward/reward_len/mean" in e[2] for e in rec.events)


def test_wandb_offline_run_has_metrics_and_completion_tables(tiny_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # offline: WANDB_MODE is set in conftest
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, max_steps=2, report_to="wandb", log_completions_steps=1))
    t.train()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    tables = sorted(runs[0].glob("files/media/table/completions_*.table.json"))
    assert len(tables) == 2  # one per logged step
    table = json.loads(tables[-1].read_text())
    assert table["columns"] == ["step", "group", "prompt", "answer", "completion", "rewards", "reward", "advantage"]
    assert len(table["data"]) == 8 and table["data"][0][0] == 2  # every completion of step 2 (B x G = 2 x 4)
    assert json.loads(table["data"][0][5]).keys() == {"digit_share"}


def test_trackio_run_is_local_with_metrics_and_completion_tables(tiny_dir, tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    import os
    import sqlite3
    from pathlib import Path
    project = f"aha-test-{tmp_path.name}"
    monkeypatch.setenv("TRACKIO_PROJECT", project)  # the store itself is $TRACKIO_DIR, set in conftest
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, max_steps=2, report_to=["trackio"], log_completions_steps=2))
    t.train()
    db = sqlite3.connect(Path(os.environ["TRACKIO_DIR"]) / f"{project}.db")
    logged = [(step, json.loads(m)) for step, m in db.execute("select step, metrics from metrics order by id")]
    assert [s for s, m in logged if "reward/mean" in m] == [1, 2]
    tables = [m["completions"] for s, m in logged if "completions" in m]
    assert len(tables) == 1 and tables[0]["_type"] == "trackio.table" and len(tables[0]["_value"]) == 8


def test_push_to_hub_uploads_the_saved_model(tiny_dir, tmp_path, monkeypatch):
    import huggingface_hub
    calls = {}
    monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo_id, **kw: calls.update(created=repo_id))
    monkeypatch.setattr(huggingface_hub, "upload_folder", lambda **kw: calls.update(kw))
    t = GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], train_dataset=PROMPTS,
                    args=args(tmp_path, max_steps=1, push_to_hub=True, hub_model_id="me/tiny-grpo"))
    with pytest.raises(FileNotFoundError, match="no saved model"):
        t.push_to_hub()
    t.train()
    t.save_model()
    assert t.push_to_hub() == "me/tiny-grpo"
    assert calls["created"] == "me/tiny-grpo" and calls["repo_id"] == "me/tiny-grpo"
    assert (tmp_path / "run" / "model" / "config.json").samefile(f"{calls['folder_path']}/config.json")


def test_bf16_mixed_precision_keeps_updates_that_bf16_weights_lose(tiny_dir, tmp_path):
    """Four AdamW steps at lr 1e-5 move each weight by up to 4e-5 (|m/sqrt(v)| <= 1 per step, about 1 while the
    gradient keeps its sign), far below bfloat16's spacing near these weights (2^-13 = 1.2e-4 at 0.02):
    bfloat16 weights round every update away; bf16 mixed precision (float32 weights, bf16 forward) accumulates
    them as float32 training does, weight by weight."""
    import torch
    from aha.config import SFTConfig
    from aha.train.sft import SFTTrainer
    rows = [{"prompt": f"{a}+1=", "completion": str(a + 1)} for a in range(16)]
    lr, steps = 1e-5, 4

    def delta(**kw):
        cfg = SFTConfig(output_dir=str(tmp_path / "-".join(map(str, kw.values()))), max_steps=steps, learning_rate=lr,
                        per_device_train_batch_size=16, progress_bar=False, report_to=["none"], **kw)
        t = SFTTrainer(model=tiny_dir, args=cfg, train_dataset=rows)
        w = t.model.model.layers[0].mlp.up_proj.weight
        before = w.detach().float().clone()
        t.train()
        return w.detach().float() - before

    mixed, full, bf16_weights = delta(bf16=True), delta(dtype="float32"), delta(dtype="bfloat16")
    assert full.abs().max() <= steps * lr * 1.05 and full.abs().median() > 0.5 * steps * lr  # the updates are real
    # mixed precision lands the float32 run's updates: within 5% of lr for 95% of the weights (the rest are
    # weights whose tiny gradient the bf16 forward moved enough to change Adam's step), 10% overall
    close = ((mixed - full).abs() < 0.05 * lr).float().mean().item()
    assert close > 0.95, close
    assert ((mixed - full).norm() / full.norm()).item() < 0.1
    assert (bf16_weights == 0).float().mean() > 0.5  # rounded away
    assert ((bf16_weights - full).norm() / full.norm()).item() > 0.5


def test_updates_inside_one_autocast_context_see_the_new_weights():
    """autocast caches a weight's bf16 copy until its outermost context exits; a GRPO step runs several
    optimizer steps inside one. After optimizer_step the next forward must use the updated weights."""
    import torch
    from aha.config import SFTConfig
    from aha.train.loop import optimizer_step
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1 = lin(x)
        y1.float().square().sum().backward()
        optimizer_step(SFTConfig(output_dir="unused", max_grad_norm=0), lin, opt, sched)
        y2 = lin(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y3 = lin(x)  # a fresh context: certainly the new weights
    assert (y2 - y1).abs().max() > 0.1
    assert torch.equal(y2, y3)
