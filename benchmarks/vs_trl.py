"""aha versus TRL's GRPOTrainer at identical settings: seconds per step, generation and training tokens/s,
peak RSS, fraction of zero-std groups, and the mean-reward curves of both from the same start.

    .venv/bin/pip install -e '.[bench]'          # TRL is a benchmark-only extra, never a runtime dependency
    .venv/bin/python benchmarks/vs_trl.py      # 4m and 30m timed (3 alternating rounds of 1 warm-up + 5 steps),
                                               # same-batch check, 30-step 4m curves x 3 seeds
    .venv/bin/python benchmarks/vs_trl.py --curve-sizes 4m 30m               # curves for both sizes (slower)
    .venv/bin/python benchmarks/vs_trl.py --sizes 4m --curve-steps 0 --check-steps 0 --only aha   # aha timing only
    .venv/bin/python benchmarks/vs_trl.py --sizes 4m --rounds 0 --curve-seeds 5 --check-steps 0 \
        --max-completion-length 512 --micro-batch-tokens 768     # curves alone at reasoning length, 5 seeds each
    python benchmarks/vs_trl.py --device cuda --sizes qwen2-0.5b --bf16 --curve-steps 0 --check-steps 0 \
        --max-completion-length 512                # on a GPU: Qwen2-0.5B's shape (see benchmarks/gpu.sh)

Run it on a quiet machine: other processes on the cores make the torch thread pools contend and inflate the
times several-fold (with 2 threads on 2 busy cores, 10x was seen), and not equally for both frameworks.
Each size is timed in --rounds alternating aha/TRL runs and the median run is reported with every round's
figure, so one slow spell shows up as an outlier instead of deciding the ratio.
Seed-to-seed spread of the reward curves is large (sd of the last-10-step mean ~0.05-0.07 at 4m, lr 1e-3), so
compare curves over several seeds: the summary gives aha - TRL on the last-10 mean with a Welch 95% interval over
the seeds (`aha.stats.difference_interval`). The same-batch check below is the exact comparison.

Both trainers load one model directory built here (random weights, BPE tokenizer trained on the synthetic
corpus), see the same plain-string prompts (no chat template), and are scored by one graded reward (the share
of lowercase vowels in the completion), which differs inside every group from the first step, so neither
saves time by skipping all-zero groups. Each (framework, size, run) is a separate subprocess (this file
re-invoked with --worker), so peak RSS is per framework and neither warms caches for the other.

Settings shared by both: 2 prompts x num_generations 8 = 16 completions per optimizer step (one generation
round per step), max_completion_length 64, temperature 1, top_p 1, top_k off, beta 0.04 (k3 KL to a frozen
reference copy), num_iterations 1, loss_type dapo, group-std advantage scaling, AdamW (0.9, 0.99, eps 1e-8,
no weight decay), constant learning rate, no warmup, gradient clipping at 1.0, fp32 on CPU, no gradient
checkpointing, the same torch thread count. TRL's `use_bias_correction_kl` (default True in 1.16) is turned off:
it multiplies the KL term by the importance ratio, which leaves the KL value alone but adds k3 * grad log p to
the gradient, so the two trainers would optimise different objectives (see trl_config).

Same-batch check (--check-steps): both trainers get identical scripted completions instead of sampling, so
rewards, advantages, losses, KL, gradient norms and weights must agree to float rounding. It separates "the
update rule is the same" from "the sampled curves agree within noise".

What is timed: aha: wall time of `trainer.step()`; generation and training seconds from its metrics.
TRL: wall time from `on_step_begin` to `on_step_end` (data fetch and logging excluded, as for aha); generation
seconds = `_generate_single_turn` (padding, `model.generate`, EOS cut); reward seconds = `_calculate_rewards`;
training seconds = step - generation - rewards (reference log-probs, loss, backward, optimizer).
Token counts are computed the same way for both: generation tokens = completion tokens including the EOS
token; training tokens = unpadded prompt + completion tokens of the sequences trained on.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from aha.stats import difference_interval, verdict  # noqa: E402

SIZES = ("4m", "30m", "qwen2-0.5b")
QWEN2_VOCAB = 151936
"""qwen2-0.5b is Qwen2-0.5B's shape (24 layers, hidden 896, q/k/v biases) with its real vocabulary over the
512-token tokenizer: ids past the tokenizer decode to nothing, and under random weights EOS comes once in
151,936 tokens, so nearly every completion runs to the cap (no rows for aha to drop)."""
NUM_GENERATIONS = 8
COMPLETIONS_PER_STEP = 16
MAX_COMPLETION_LENGTH = 64
"""Default generation budget; --max-completion-length sets it for the driver and its worker processes."""
MICRO_BATCH_TOKENS = None
"""aha's max_tokens_per_micro_batch (--micro-batch-tokens): None (auto, aha's default) = chosen per batch by
aha.train.passes; 0 = one pass over the 16 sequences, as TRL does."""
WORKER_TIMEOUT_S = 7200.0
"""Longest one worker process (one framework's timing, check or curve run) may take (--worker-timeout)."""
BF16 = False
"""--bf16: the timing and curve runs of both trainers in bf16 mixed precision (float32 weights, bf16 autocast;
TRL's bf16=True, its default); the same-batch check stays float32."""
DEVICE = "cpu"
"""--device: where both trainers run (cuda: TRL without use_cpu, aha on CUDA; times synchronised)."""
BETA = 0.04
SEED = 0
MODEL_SEED = 0
CURVE_LR = {"4m": 1e-3, "30m": 3e-4, "qwen2-0.5b": 1e-5}
"""Learning rate of the learning-curve runs per size: high enough that the reward visibly moves in 30 steps."""
ADAM = dict(adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0)
"""Optimiser settings written explicitly into both configs (aha's defaults; TRL's beta2 would be 0.999)."""

# ------------------------------------------------------------------ data, model and reward (shared)
WORDS = ("the a an one every some small big old new red blue green quiet loud happy sad fast slow bright dark "
         "cat dog bird fish tree river mountain city house road garden window door book letter song story "
         "runs walks sings reads writes opens closes sees finds keeps leaves takes gives makes follows "
         "under over near behind beside across through into from with without after before during "
         "morning evening night winter summer spring autumn rain snow wind sun moon star cloud stone").split()


def corpus(n: int = 3000, seed: int = 1) -> list[str]:
    """Sentences for the tokenizer, with digits and punctuation so the byte-level vocab fills up to 512."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        out.append(f"{i % 97}. " + " ".join(words).capitalize() + rng.choice(".!?;,:"))
    return out


def prompts(n: int = 256, seed: int = 2) -> list[dict]:
    """Plain-string prompts (no chat template in either trainer), 8 to 20 tokens long."""
    rng = random.Random(seed)
    return [{"prompt": f"Story {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))}
            for i in range(n)]


VOWELS = frozenset("aeiou")


def vowel_frac(prompts=None, completions=None, **kwargs) -> list[float]:
    """Share of the completion's characters that are lowercase vowels (0 for an empty completion).

    Graded, so a random model's 8 samples of a prompt differ in reward from step 1 and no group is all-zero.
    Example: "banana!" -> 3/7 = 0.4286.
    """
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[-1]["content"]
        out.append(sum(ch in VOWELS for ch in text) / len(text) if text else 0.0)
    return out


def build_model(size: str, directory: Path) -> dict:
    """The tiny model of `size` written to `directory` (same seed, same weights every time)."""
    from aha.models.tiny import make_tiny, num_params
    from transformers import AutoConfig
    arch, overrides = ("qwen2", {"vocab_size": QWEN2_VOCAB}) if size == "qwen2-0.5b" else ("llama", None)
    path = make_tiny(directory, corpus(), size=size, arch=arch, seed=MODEL_SEED, overrides=overrides)
    config = AutoConfig.from_pretrained(path)
    return {"path": str(path), "params": num_params(config), "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "layers": config.num_hidden_layers}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def sync() -> None:
    """Wait for queued GPU work, so a host clock read after it times the work (no-op on the CPU)."""
    if DEVICE.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def scripted_completions(prompt_ids: list[int], step: int, n: int, vocab_size: int, eos_id: int) -> list[list[int]]:
    """n fixed completions of one prompt at one step, for the same-batch check: both trainers get exactly
    these instead of sampling, so their rewards, advantages, losses and updates must agree to rounding."""
    seed = (sum((i + 1) * t for i, t in enumerate(prompt_ids)) * 1009 + step) % 2**31
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(4, MAX_COMPLETION_LENGTH)
        ids = [rng.randrange(7, vocab_size) for _ in range(length)]  # 0-6: pad, eos and special tokens
        if length < MAX_COMPLETION_LENGTH and rng.random() < 0.5:
            ids.append(eos_id)
        out.append(ids)
    return out


def save_params(model, path: str) -> None:
    import torch
    flat = torch.cat([p.detach().reshape(-1).float().cpu() for _, p in sorted(model.named_parameters())])
    torch.save(flat, path)


# ------------------------------------------------------------------ workers (one framework per process)
def aha_config(out_dir: str, steps: int, lr: float, seed: int, threads: int):
    from aha.config import GRPOConfig
    return GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=COMPLETIONS_PER_STEP, gradient_accumulation_steps=1,
        num_generations=NUM_GENERATIONS, max_completion_length=MAX_COMPLETION_LENGTH, beta=BETA,
        kl_estimator="k3", num_iterations=1, loss_type="dapo", advantage_estimator="grpo", epsilon=0.2,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        max_steps=steps, seed=seed, report_to=[], progress_bar=False, log_completions_steps=0,
        threads=threads, dtype="float32", bf16=BF16, gradient_checkpointing=False,
        max_tokens_per_micro_batch=MICRO_BATCH_TOKENS, **ADAM)


def token_budget(text: str) -> int | None:
    """--micro-batch-tokens' value: 'auto' -> None (aha chooses), else an integer."""
    return None if text == "auto" else int(text)


def token_budget_arg(value: int | None) -> str:
    return "auto" if value is None else str(value)


def trl_config(out_dir: str, steps: int, lr: float, seed: int):
    """TRL's config matching aha_config. TRL's own defaults that differ and are overridden here:
    use_bias_correction_kl (True: the KL term is multiplied by the importance ratio, which is 1 in value but
    adds k3 * grad log p to the gradient; aha's k3 penalty has no such term), gradient_checkpointing (True),
    lr_scheduler_type (linear), adam_beta2 (0.999), bf16 (True, also on CPU), logging_steps (10),
    optim (adamw_torch_fused)."""
    from trl import GRPOConfig
    cfg = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=COMPLETIONS_PER_STEP, gradient_accumulation_steps=1,
        generation_batch_size=COMPLETIONS_PER_STEP,  # -> steps_per_generation 1: one generation round per step
        num_generations=NUM_GENERATIONS, max_completion_length=MAX_COMPLETION_LENGTH, beta=BETA,
        num_iterations=1, loss_type="dapo", scale_rewards="group", epsilon=0.2, use_bias_correction_kl=False,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", max_steps=steps, seed=seed, logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, use_cpu=DEVICE == "cpu", bf16=BF16, fp16=False, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"}, log_completions=False, dataloader_num_workers=0, **ADAM)
    assert cfg.steps_per_generation == 1 and cfg.generation_batch_size == COMPLETIONS_PER_STEP
    return cfg


def run_aha(model_dir: str, steps: int, lr: float, seed: int, threads: int, out_dir: str,
            scripted: bool = False, params_out: str | None = None) -> dict:
    import torch
    from aha.rollout import Rollout
    from aha.train.grpo import GRPOTrainer
    torch.set_num_threads(threads)
    cfg = aha_config(out_dir, steps, lr, seed, threads)
    data = prompts()[:COMPLETIONS_PER_STEP // NUM_GENERATIONS] if scripted else prompts()
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[vowel_frac], args=cfg, train_dataset=data)
    from aha.data import encode_prompt
    from aha.models import eos_ids
    setup = {"eos_ids": eos_ids(trainer.model, trainer.tokenizer), "pad_id": trainer.tokenizer.pad_token_id,
             "prompt0_ids": encode_prompt(trainer.tokenizer, data[0]["prompt"]),
             "torch_threads": torch.get_num_threads()}
    if params_out:
        save_params(trainer.model, params_out + ".init")
    if scripted:
        vocab, eos = trainer.model.config.vocab_size, trainer.tokenizer.eos_token_id

        class ScriptedEngine:
            calls, version = 0, 0

            def update_weights(self, model, version):
                self.version = version

            def generate(self, prompt_ids, n, params, generator=None):
                comps = [c for p in prompt_ids for c in scripted_completions(p, self.calls, n, vocab, eos)]
                self.calls += 1
                return Rollout(completion_ids=comps, truncated=[c[-1] != eos for c in comps])

        trainer.engine = ScriptedEngine()
    records = []
    if str(next(trainer.model.parameters()).device).split(":")[0] != DEVICE.split(":")[0]:
        raise RuntimeError(f"aha's model is on {next(trainer.model.parameters()).device}, expected {DEVICE}")
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        m = trainer.step()
        sync()
        wall = time.perf_counter() - t0
        trainer.step_count += 1
        records.append({
            "step_s": wall, "generate_s": m["perf/generate_s"], "train_s": m["perf/train_s"],
            "reward_s": max(wall - m["perf/generate_s"] - m["perf/train_s"], 0.0),
            "gen_tokens": m["perf/gen_tokens_per_s"] * m["perf/generate_s"],
            "train_tokens": m["perf/train_tokens_per_s"] * m["perf/train_s"],
            "reward": m["reward/mean"], "zero_std_frac": m["reward/zero_std_frac"],
            "completion_len": m["completion/len_mean"], "kl": m.get("kl"), "loss": m["loss"],
            "grad_norm": m["grad_norm"], "lr": m["lr"], "entropy": m.get("entropy"),
            "pass_tokens": m.get("perf/pass_tokens"), "share_prompts": m.get("perf/share_prompts"),
            **{k[len("perf/"):]: m[k] for k in ("perf/train_old_s", "perf/train_reference_s", "perf/train_policy_s",
                                               "perf/train_optimizer_s") if k in m},
        })
    if params_out:
        save_params(trainer.model, params_out)
    return {"setup": setup, "records": records}


def run_trl(model_dir: str, steps: int, lr: float, seed: int, threads: int, out_dir: str,
            scripted: bool = False, params_out: str | None = None) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer
    torch.set_num_threads(threads)
    cfg = trl_config(out_dir, steps, lr, seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    gen, rew, step_logs, steps_s, periods = [], [], [], [], []

    class StepTimer(TrainerCallback):
        t0 = None

        def on_step_begin(self, args, state, control, **kw):
            sync()
            now = time.perf_counter()
            if self.t0 is not None:
                periods.append(now - self.t0)  # begin-to-begin: includes TRL's logging and the data fetch
            self.t0 = now

        def on_step_end(self, args, state, control, **kw):
            sync()
            steps_s.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:  # the per-step log, not the end-of-training summary
                step_logs.append(dict(logs))

    data = prompts()[:COMPLETIONS_PER_STEP // NUM_GENERATIONS] if scripted else prompts()
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[vowel_frac], args=cfg,
                          train_dataset=Dataset.from_list(data), processing_class=tokenizer,
                          callbacks=[StepTimer()])
    trainer.remove_callback(PrinterCallback)  # disable_tqdm adds a printer of every log dict

    generate_single_turn, calculate_rewards = trainer._generate_single_turn, trainer._calculate_rewards
    if scripted:
        vocab, eos, calls = trainer.model.config.vocab_size, tokenizer.eos_token_id, [0]

        def scripted_generate(prompt_ids, *a, **k):
            # TRL's rows are prompts repeated num_generations times; give the j-th copy the j-th completion
            seen: dict[tuple, int] = {}
            comps = []
            for p in prompt_ids:
                j = seen[tuple(p)] = seen.get(tuple(p), -1) + 1
                comps.append(scripted_completions(list(p), calls[0], NUM_GENERATIONS, vocab, eos)[j])
            calls[0] += 1
            return comps, None

        generate_single_turn = scripted_generate

    def timed_generate(prompt_ids, *a, **k):
        sync()
        t0 = time.perf_counter()
        completion_ids, logprobs = generate_single_turn(prompt_ids, *a, **k)
        sync()
        gen.append({"s": time.perf_counter() - t0, "completion_tokens": sum(map(len, completion_ids)),
                    "prompt_tokens": sum(map(len, prompt_ids)), "rows": len(completion_ids)})
        return completion_ids, logprobs

    def timed_rewards(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = calculate_rewards(*a, **k)
        sync()
        rew.append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn, trainer._calculate_rewards = timed_generate, timed_rewards
    p0 = prompts()[0]["prompt"]
    setup = {"eos_ids": list(trainer.eos_token_ids), "pad_id": tokenizer.pad_token_id,
             "generation_config": {k: getattr(trainer.generation_config, k) for k in
                                   ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens",
                                    "eos_token_id", "pad_token_id")},
             "prompt0_ids": tokenizer(text=[p0])["input_ids"][0],
             "steps_per_generation": cfg.steps_per_generation, "generation_batch_size": cfg.generation_batch_size,
             "torch_threads": torch.get_num_threads()}
    if trainer.model.device.type != DEVICE.split(":")[0]:
        raise RuntimeError(f"TRL's model is on {trainer.model.device}, expected {DEVICE}")
    trainer.train()
    if not (len(steps_s) == len(gen) == len(rew) == len(step_logs) == steps):
        raise RuntimeError(f"expected one generation round per step: {steps} steps, {len(steps_s)} timed, "
                           f"{len(gen)} generations, {len(rew)} reward calls, {len(step_logs)} logs")
    records = []
    for s, g, r, log in zip(steps_s, gen, rew, step_logs):
        if g["rows"] != COMPLETIONS_PER_STEP:
            raise RuntimeError(f"TRL generated {g['rows']} completions in a step, expected {COMPLETIONS_PER_STEP}")
        records.append({
            "step_s": s, "generate_s": g["s"], "reward_s": r, "train_s": max(s - g["s"] - r, 0.0),
            "gen_tokens": g["completion_tokens"], "train_tokens": g["prompt_tokens"] + g["completion_tokens"],
            "reward": log["reward"], "zero_std_frac": log["frac_reward_zero_std"],
            "completion_len": log["completions/mean_length"], "kl": log.get("kl"), "loss": log.get("loss"),
            "trl_step_time": log.get("step_time"), "grad_norm": log.get("grad_norm"),
            "lr": log.get("learning_rate"), "entropy": log.get("entropy"),
        })
    if params_out:
        save_params(trainer.accelerator.unwrap_model(trainer.model), params_out)
    return {"setup": setup, "records": records, "periods_s": periods}


def worker(args) -> None:
    run = run_aha if args.worker == "aha" else run_trl
    with tempfile.TemporaryDirectory(prefix=f"vs_trl_{args.worker}_") as out_dir:
        result = run(args.model_dir, args.steps, args.lr, args.seed, args.threads, out_dir,
                     scripted=args.scripted, params_out=args.params_out)
    result["peak_rss_mb"] = peak_rss_mb()
    if DEVICE.startswith("cuda"):
        import torch
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------ driver
def spawn(framework: str, model_dir: str, steps: int, lr: float, seed: int, threads: int, tmp: Path,
          scripted: bool = False) -> dict:
    bf16 = BF16 and not scripted
    tag = (f"{framework}-{Path(model_dir).name}-{steps}-{lr}-{seed}" + ("-scripted" if scripted else "")
           + ("-bf16" if bf16 else ""))
    result = tmp / f"{tag}.json"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    if DEVICE == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", framework, "--model-dir", model_dir,
           "--steps", str(steps), "--lr", repr(lr), "--seed", str(seed), "--threads", str(threads),
           "--max-completion-length", str(MAX_COMPLETION_LENGTH),
           "--micro-batch-tokens", token_budget_arg(MICRO_BATCH_TOKENS),
           "--device", DEVICE,
           "--result", str(result)] + (["--bf16"] if bf16 else []) \
        + (["--scripted", "--params-out", str(tmp / f"{tag}.pt")] if scripted else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"{framework} worker ran past --worker-timeout {WORKER_TIMEOUT_S:g} s and was killed: "
                         f"{' '.join(cmd)}") from e
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        why = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit status {proc.returncode}")
        if proc.returncode == -signal.SIGKILL:
            why += " (what the kernel's out-of-memory killer sends: see dmesg)"
        raise SystemExit(f"{framework} worker failed, {why}: {' '.join(cmd)}")
    out = json.loads(result.read_text())
    out["process_s"] = time.perf_counter() - t0
    if scripted:
        out["params_path"] = str(tmp / f"{tag}.pt")
    return out


def summarise(run: dict, warmup: int = 1) -> dict:
    timed = run["records"][warmup:] or run["records"]
    med = lambda key: statistics.median(r[key] for r in timed)  # noqa: E731
    total = lambda key: sum(r[key] for r in timed)  # noqa: E731
    return {
        "median_step_s": med("step_s"), "median_generate_s": med("generate_s"), "median_train_s": med("train_s"),
        "median_reward_s": med("reward_s"),
        "gen_tokens_per_s": total("gen_tokens") / max(total("generate_s"), 1e-9),
        "train_tokens_per_s": total("train_tokens") / max(total("train_s"), 1e-9),
        "peak_rss_mb": run["peak_rss_mb"], "peak_gpu_mb": run.get("peak_gpu_mb"),
        "zero_std_frac": statistics.fmean(r["zero_std_frac"] for r in run["records"]),
        "completion_len_mean": statistics.fmean(r["completion_len"] for r in timed),
        "timed_steps": len(timed), "step_s_all": [r["step_s"] for r in run["records"]],
    }


def same_batch_check(runs: dict, size: str, lr: float) -> dict:
    """Per-step metrics of both trainers on identical completions, and how far their weights drifted apart
    relative to how far they moved (float rounding, amplified a little by Adam, gives ~1e-5)."""
    import torch
    a0 = torch.load(runs["aha"]["params_path"] + ".init")
    a, t = torch.load(runs["aha"]["params_path"]), torch.load(runs["trl"]["params_path"])
    steps = []
    for ra, rt in zip(runs["aha"]["records"], runs["trl"]["records"]):
        steps.append({k: {"aha": ra.get(k), "trl": rt.get(k)} for k in ("reward", "loss", "kl", "grad_norm")})
    out = {"size": size, "lr": lr, "steps": steps,
           "max_abs_param_diff": float((a - t).abs().max()),
           "param_diff_norm": float((a - t).norm()), "aha_update_norm": float((a - a0).norm()),
           "trl_update_norm": float((t - a0).norm())}
    out["relative_param_diff"] = out["param_diff_norm"] / max(out["aha_update_norm"], 1e-30)
    print("        step  " + "  ".join(f"{k:>21}" for k in ("reward aha/trl", "loss aha/trl", "kl aha/trl",
                                                                  "grad_norm aha/trl")))
    for i, st in enumerate(steps, 1):
        cells = [f"{st[k]['aha'] or 0.0:10.5f}/{st[k]['trl'] or 0.0:<10.5f}"
                 for k in ("reward", "loss", "kl", "grad_norm")]
        print(f"        {i:>4}  " + "  ".join(cells))
    print(f"        weights after the check: ||aha - trl|| / ||aha - start|| = {out['relative_param_diff']:.2e} "
          f"(update norms aha {out['aha_update_norm']:.4f}, trl {out['trl_update_norm']:.4f}; "
          f"max |aha - trl| {out['max_abs_param_diff']:.2e})")
    return out


def rolling(xs: list[float], w: int) -> list[float]:
    return [statistics.fmean(xs[max(0, i - w + 1):i + 1]) for i in range(len(xs))]


def plot_curves(curves: dict, path: Path, window: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(curves), figsize=(6.5 * len(curves), 4.5), squeeze=False)
    colors = {"aha": "tab:blue", "trl": "tab:orange"}
    for ax, (size, per_fw) in zip(axes[0], curves.items()):
        for fw, c in per_fw.items():
            for seed_curve in c["per_seed"].values():
                ax.plot(range(1, len(seed_curve) + 1), seed_curve, color=colors[fw], alpha=0.25, lw=0.8)
            mean = c["mean_curve"]
            ax.plot(range(1, len(mean) + 1), rolling(mean, window), color=colors[fw], lw=2.2,
                    label=f"{fw} (rolling mean {window}; last-10 mean {c['last10_mean']:.3f})")
        ax.set_title(f"{size} model, lr {c['lr']:g}, {len(c['per_seed'])} seed(s)")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward (vowel fraction)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("GRPO mean reward per step, aha vs TRL (same model, prompts, reward, settings)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    if DEVICE.startswith("cuda"):
        import torch
        out["gpu"] = torch.cuda.get_device_name()
    for pkg in ("torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def main(argv=None) -> None:
    global MAX_COMPLETION_LENGTH, MICRO_BATCH_TOKENS, BF16, WORKER_TIMEOUT_S, DEVICE
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Formatter)
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    p.add_argument("--steps", type=int, default=6, help="steps per timing run: 1 warm-up + the rest timed")
    p.add_argument("--rounds", type=int, default=3,
                   help="timing runs per framework and size, alternating aha/TRL; the median run is reported "
                        "(0: no timing runs, e.g. for curves alone)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate of the timing runs (both frameworks)")
    p.add_argument("--curve-steps", type=int, default=30, help="steps of the learning-curve runs (0: skip)")
    p.add_argument("--curve-sizes", nargs="+", choices=SIZES,
                   help="sizes with curves (default: the smallest of --sizes; 30m costs ~4x as much)")
    p.add_argument("--curve-lr", type=float, help=f"learning rate of the curve runs (default per size: {CURVE_LR})")
    p.add_argument("--curve-seeds", type=int, default=3,
                   help="seeds per framework for the curves (seed, seed+1, ...); one seed cannot show the noise")
    p.add_argument("--only", choices=("aha", "trl", "both"), default="both")
    p.add_argument("--out", default="benchmarks/results", help="writes vs_trl.json and vs_trl_reward_curves.png")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads in each worker")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--window", type=int, default=5, help="rolling-mean window of the curves")
    p.add_argument("--check-steps", type=int, default=3,
                   help="same-batch check: steps where both trainers get the same scripted completions (0: skip)")
    p.add_argument("--max-completion-length", type=int, default=MAX_COMPLETION_LENGTH,
                   help="most tokens per completion (the tiny models' context is 8,192)")
    p.add_argument("--micro-batch-tokens", type=token_budget, default=MICRO_BATCH_TOKENS,
                   help="aha's max_tokens_per_micro_batch: 'auto' (aha's default: chosen per batch), 0 (one pass "
                        "of 16, as TRL pads the 16 sequences to the longest) or N (length-sorted passes of at most "
                        "N padded tokens); the same gradient in every case")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 mixed precision in both trainers (float32 weights, bf16 autocast; TRL's default is "
                        "bf16=True), for the timing and curve runs; the same-batch check stays float32")
    p.add_argument("--worker-timeout", type=float, default=WORKER_TIMEOUT_S,
                   help="seconds one worker process may run before it is killed and the benchmark stops")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where both trainers run")
    p.add_argument("--worker", choices=("aha", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--scripted", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--params-out", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    MAX_COMPLETION_LENGTH, MICRO_BATCH_TOKENS = args.max_completion_length, args.micro_batch_tokens
    BF16, WORKER_TIMEOUT_S, DEVICE = args.bf16, args.worker_timeout, args.device
    if args.worker:
        return worker(args)
    if args.rounds > 0 and args.steps < 2:
        p.error("--steps must be at least 2 (one warm-up step plus timed steps)")
    frameworks = ["aha", "trl"] if args.only == "both" else [args.only]
    if "trl" in frameworks:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise SystemExit("TRL is not installed: .venv/bin/pip install -e '.[bench]'  (or 'trl==1.16.0')")
    out = (ROOT / args.out) if not Path(args.out).is_absolute() else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"versions": versions(), "loadavg_start": os.getloadavg(), "argv": sys.argv[1:],
              "settings": {"num_generations": NUM_GENERATIONS, "completions_per_step": COMPLETIONS_PER_STEP,
                           "max_completion_length": MAX_COMPLETION_LENGTH,
                           "aha_max_tokens_per_micro_batch": MICRO_BATCH_TOKENS, "beta": BETA, "num_iterations": 1,
                           "loss_type": "dapo", "advantages": "group std (aha grpo / TRL scale_rewards=group)",
                           "temperature": 1.0, "top_p": 1.0, "top_k": 0, "lr": args.lr, "threads": args.threads,
                           "seed": args.seed, "steps": args.steps, "warmup_steps_discarded": 1,
                           "dtype": "float32", "bf16_mixed_precision_timing": BF16, "device": DEVICE, **ADAM},
              "models": {}, "timing": {}, "curves": {}, "curve_difference": {}}
    curve_sizes = (args.curve_sizes or [min(args.sizes, key=SIZES.index)]) if args.curve_steps > 0 else []
    with tempfile.TemporaryDirectory(prefix="aha_vs_trl_") as tmp_name:
        tmp = Path(tmp_name)
        model_dirs = {}
        for size in dict.fromkeys(list(args.sizes) + list(curve_sizes)):
            info = build_model(size, tmp / f"model-{size}")
            model_dirs[size] = info["path"]
            report["models"][size] = {k: v for k, v in info.items() if k != "path"}
            print(f"[model] {size}: {info['params']:,} parameters, vocab {info['vocab_size']}", flush=True)

        for size in args.sizes if args.rounds > 0 else []:
            report["timing"][size] = t = {}
            runs: dict[str, list[dict]] = {fw: [] for fw in frameworks}
            for r in range(args.rounds):  # alternating, so slow spells of a shared machine hit both
                for fw in frameworks:
                    print(f"[time ] {fw} {size}: {args.steps} steps (round {r + 1}/{args.rounds}) ...", flush=True)
                    run = spawn(fw, model_dirs[size], args.steps, args.lr, args.seed, args.threads, tmp)
                    s = summarise(run)
                    s["setup"], s["records"] = run["setup"], run["records"]
                    runs[fw].append(s)
                    gpu = f", peak GPU {s['peak_gpu_mb']:.0f} MB" if s["peak_gpu_mb"] is not None else ""
                    print(f"        median {s['median_step_s']:.3f} s/step (all: "
                          f"{' '.join(f'{x:.2f}' for x in s['step_s_all'])}), peak RSS {s['peak_rss_mb']:.0f} MB{gpu}",
                          flush=True)
            for fw, rs in runs.items():
                # the round with the median s/step stands for the framework; every round is kept
                t[fw] = dict(sorted(rs, key=lambda s: s["median_step_s"])[len(rs) // 2])
                t[fw]["rounds_median_step_s"] = [s["median_step_s"] for s in rs]
            if len(t) == 2:
                t["ratio_trl_over_aha"] = t["trl"]["median_step_s"] / t["aha"]["median_step_s"]
                t["ratio_per_round"] = [b["median_step_s"] / a["median_step_s"]
                                        for a, b in zip(runs["aha"], runs["trl"])]
                for key in ("eos_ids", "pad_id", "prompt0_ids"):
                    if t["aha"]["setup"][key] != t["trl"]["setup"][key]:
                        print(f"WARNING: {key} differs: aha {t['aha']['setup'][key]} trl {t['trl']['setup'][key]}")

        if args.check_steps > 0 and len(frameworks) == 2:
            # the curve lr, so that by step 2 the policy has left the reference and the KL gradient counts
            size = args.sizes[0]
            lr = args.curve_lr if args.curve_lr is not None else CURVE_LR[size]
            print(f"[check] same scripted completions into both, {size}, {args.check_steps} steps, lr {lr:g} ...",
                  flush=True)
            runs = {fw: spawn(fw, model_dirs[size], args.check_steps, lr, args.seed, args.threads, tmp, scripted=True)
                    for fw in frameworks}
            report["same_batch_check"] = same_batch_check(runs, size, lr)

        for size in curve_sizes:
            lr = args.curve_lr if args.curve_lr is not None else CURVE_LR[size]
            report["curves"][size] = {}
            for fw in frameworks:
                per_seed, extra = {}, {}
                for k in range(args.curve_seeds):
                    seed = args.seed + k
                    print(f"[curve] {fw} {size}: {args.curve_steps} steps, lr {lr:g}, seed {seed} ...", flush=True)
                    run = spawn(fw, model_dirs[size], args.curve_steps, lr, seed, args.threads, tmp)
                    per_seed[seed] = [r["reward"] for r in run["records"]]
                    extra[seed] = {key: [r.get(key) for r in run["records"]]
                                   for key in ("completion_len", "kl", "entropy", "grad_norm", "lr", "step_s")}
                mean_curve = [statistics.fmean(v) for v in zip(*per_seed.values())]
                last = [statistics.fmean(c[-10:]) for c in per_seed.values()]
                c = {"lr": lr, "per_seed": per_seed, "mean_curve": mean_curve, "per_seed_other": extra,
                     "first5_mean": statistics.fmean(mean_curve[:5]),
                     "last10_mean": statistics.fmean(mean_curve[-10:]),
                     "last10_per_seed": last,
                     # per-step noise of the last 10 steps (steps are correlated, so this is a rough floor)
                     "last10_step_sd": statistics.stdev(mean_curve[-10:]) if len(mean_curve) >= 2 else 0.0}
                if len(last) > 1:
                    c["last10_seed_se"] = statistics.stdev(last) / len(last) ** 0.5
                report["curves"][size][fw] = c
                print(f"        reward first-5 mean {c['first5_mean']:.3f}, last-10 mean {c['last10_mean']:.3f}",
                      flush=True)
            per_fw = report["curves"][size]
            if len(per_fw) == 2:  # the two trainers' seeds are independent runs: Welch interval of the difference
                diff, ci = difference_interval(per_fw["aha"]["last10_per_seed"], per_fw["trl"]["last10_per_seed"])
                report["curve_difference"][size] = {"last10_aha_minus_trl": diff, "ci95": ci, "verdict": verdict(ci)}
    report["loadavg_end"] = os.getloadavg()

    (out / "vs_trl.json").write_text(json.dumps(report, indent=1))
    if report["curves"]:
        plot_curves(report["curves"], out / "vs_trl_reward_curves.png", args.window)
    print_table(report)
    print(f"\nwrote {out / 'vs_trl.json'}" + (f" and {out / 'vs_trl_reward_curves.png'}" if report["curves"] else ""))


def print_table(report: dict) -> None:
    print(f"\nload average at start {report['loadavg_start'][0]:.2f}, at end {report['loadavg_end'][0]:.2f} "
          f"on {report['versions']['cpus']} CPUs; torch {report['versions']['torch']}, "
          f"transformers {report['versions']['transformers']}, trl {report['versions']['trl']}")
    head = f"{'size':<5} {'framework':<9} {'s/step':>8} {'gen s':>7} {'train s':>8} {'gen tok/s':>10} " \
           f"{'train tok/s':>12} {'peak RSS MB':>12} {'zero-std':>9} {'TRL/aha':>8}"
    print(head)
    print("-" * len(head))
    for size, t in report["timing"].items():
        for fw in ("aha", "trl"):
            if fw not in t:
                continue
            s = t[fw]
            ratio = f"{t['ratio_trl_over_aha']:.2f}x" if fw == "trl" and "ratio_trl_over_aha" in t else ""
            rounds = " ".join(f"{x:.2f}" for x in s["rounds_median_step_s"])
            print(f"{size:<5} {fw:<9} {s['median_step_s']:>8.3f} {s['median_generate_s']:>7.3f} "
                  f"{s['median_train_s']:>8.3f} {s['gen_tokens_per_s']:>10.0f} {s['train_tokens_per_s']:>12.0f} "
                  f"{s['peak_rss_mb']:>12.0f} {s['zero_std_frac']:>9.3f} {ratio:>8}   rounds: {rounds}")
        if "ratio_per_round" in t:
            print(f"{size:<5} TRL/aha per round: " + " ".join(f"{x:.2f}x" for x in t["ratio_per_round"]))
    chk = report.get("same_batch_check")
    if chk:
        print(f"same-batch check ({chk['size']}, {len(chk['steps'])} steps, lr {chk['lr']:g}): "
              f"||w_aha - w_trl|| / ||w_aha - w_0|| = {chk['relative_param_diff']:.1e}")
    for size, per_fw in report["curves"].items():
        parts = [f"{fw} {c['first5_mean']:.3f} -> {c['last10_mean']:.3f} (step sd {c['last10_step_sd']:.3f}"
                 + (f", seed se {c['last10_seed_se']:.3f}" if "last10_seed_se" in c else "") + ")"
                 for fw, c in per_fw.items()]
        print(f"reward curve {size} (first-5 mean -> last-10 mean): " + "; ".join(parts))
        d = report.get("curve_difference", {}).get(size)
        if d:
            print(f"  last-10 mean, aha - TRL over seeds: {d['last10_aha_minus_trl']:+.3f}, 95% interval [{d['ci95'][0]:+.3f}, "
                  f"{d['ci95'][1]:+.3f}] ({'within noise' if d['verdict'] == '=' else 'outside noise: ' + d['verdict']})")


if __name__ == "__main__":
    main()
