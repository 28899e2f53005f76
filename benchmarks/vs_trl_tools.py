"""aha's agent step against TRL's tool loop (`trl.GRPOTrainer(tools=[...])`): seconds per step and seconds of the
generation phase, on the same tiny model, tools, prompts, group size, budget and turns per episode.

    .venv/bin/python benchmarks/vs_trl_tools.py --threads 1                 # 4 turns, 3 alternating rounds
    .venv/bin/python benchmarks/vs_trl_tools.py --threads 1 --turns 1 4 8   # also 1 and 8 turns

On a machine shared with other work, --threads 1 (see benchmarks/agent_speed.py).

What both sides get: the 4m model of benchmarks/vs_trl.py (random weights, its 512-token BPE tokenizer) with aha's
TOOL_TEMPLATE as its chat template (TRL requires a template that renders tools, calls and results; aha then keeps
the tokenizer's own), chat prompts "episode i turns: k go", one instant tool (agent_speed.echo), 2 prompts x 8
episodes a step, max_completion_length --budget for every token after the prompt, and vs_trl.py's training
settings (aha_config, trl_config: TRL's defaults that would make it slower on a CPU, bf16 autocast and gradient
checkpointing among them, are set to aha's; both sample at temperature 1 with their own generation code). With
--defaults each framework keeps its own defaults for everything but the workload (SHARED: batch, G, learning rate,
seed; TRL then trains under bf16 autocast with gradient checkpointing and without a KL term, aha in float32 without
one). --aha-bf16 gives aha `bf16: true` (bf16 autocast over float32 weights), the precision TRL trains in.

The scripted policy, one rule on both sides, so both run the same turns: every model turn is decoded by the model
for at most --turn-tokens tokens, its last token then replaced by the end-of-turn token (aha: FixedTurns below;
TRL: generation_config.max_new_tokens and the same replacement after `_generate_single_turn`); a model turn asks for
one echo call until its episode has had the k turns its prompt names (agent_speed.ScriptedTurns's rule: aha's
ToolChat.parse, and TRL's `parse_response` replaced by it), the turn's text kept as its content (the reward, the
vowel share of vs_trl.py, reads the last one). The rule counts, on each side, the model turns it reads in each
step and their tokens; a worker fails unless every step ran exactly k turns per episode.

What is timed, after one warm-up step: aha: wall time of `trainer.step()`, and its perf/generate_s (the turn loop:
model turns, tool calls, parsing; rewards excluded). TRL: `on_step_begin` to `on_step_end`, and the wall time of
`_generate` (its tool loop: model turns, tool calls, parsing; rewards are scored outside it), with the model
turns alone (`_generate_single_turn`) beside it. Each (framework, turns, round) is its own process; rounds alternate
which framework runs first; the median over rounds is reported with every round.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import vs_trl  # first: it puts the repository root on sys.path
from agent_speed import DrawnTurns, ScriptedTurns, echo
from aha.data.toolcalls import TOOL_TEMPLATE


class FixedTurns(DrawnTurns):
    """agent_speed.DrawnTurns with every turn's length --turn-tokens: the engine the trainer gets, so aha runs its
    default turn loop (an episode's next turn rejoins the running batch; agent_speed.FixedTurns runs rounds)."""

    turn_tokens = 32

    def drawn(self, context: list[int]) -> int:
        return self.turn_tokens


class Scripted(ScriptedTurns):
    """agent_speed's rule (call echo until the episode has had the turns its prompt names), the turn's text kept as
    its content so the reward differs inside a group; counts the model turns it reads and their tokens."""

    def __init__(self, tokenizer, template_kwargs: dict | None = None):
        super().__init__(tokenizer, template_kwargs)
        self.count = {"model_turns": 0, "model_tokens": 0}

    def parse(self, ids, prefix_ids, tools):
        self.count["model_turns"] += 1
        self.count["model_tokens"] += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True), super().parse(ids, prefix_ids, tools)[1]


def trl_parse(rule: Scripted):
    """TRL's `parse_response(tokenizer, ids, prefix, tools)` answering as `rule` does, in TRL's message form."""
    def parse_response(tokenizer, ids, prefix=None, tools=None) -> dict:
        content, calls = rule.parse(ids, prefix, tools)
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.message() for c in calls]
        return message
    return parse_response


def dataset(turns: int, n: int = 64) -> list[dict]:
    """Chat prompts of one length, each naming the turns its episodes take."""
    return [{"prompt": [{"role": "user", "content": f"episode {i:03d} turns: {turns} go"}]} for i in range(n)]


def build(directory: Path) -> str:
    """vs_trl.py's 4m model, its tokenizer given TOOL_TEMPLATE."""
    from transformers import AutoTokenizer
    path = vs_trl.build_model("4m", directory)["path"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def check_turns(counts: list[dict], turns: int, episodes: int = vs_trl.COMPLETIONS_PER_STEP) -> None:
    """Every step ran `turns` model turns per episode (the rule allows at most that many, so a total of
    episodes x turns means each episode ran exactly `turns`)."""
    want = episodes * turns
    bad = [c["model_turns"] for c in counts if c["model_turns"] != want]
    if bad:
        raise RuntimeError(f"expected {want} model turns a step ({turns} per episode), ran {bad}")


# ------------------------------------------------------------------ workers (one framework per process)
SHARED = dict(per_device_train_batch_size=vs_trl.COMPLETIONS_PER_STEP, num_generations=vs_trl.NUM_GENERATIONS,
              learning_rate=1e-5, seed=vs_trl.SEED)
"""--defaults: the workload both sides get; every other setting is each framework's own default."""


AHA_BF16 = False
"""--aha-bf16: aha with `bf16: true` (bf16 autocast, float32 weights), the precision TRL trains in by default."""


def aha_args(out_dir: str, steps: int, threads: int, defaults: bool):
    import dataclasses
    from aha.config import GRPOConfig
    if not defaults:
        args = vs_trl.aha_config(out_dir, steps, 1e-5, vs_trl.SEED, threads)
    else:
        args = GRPOConfig(output_dir=out_dir, max_completion_length=vs_trl.MAX_COMPLETION_LENGTH, max_steps=steps,
                          threads=threads, report_to=[], progress_bar=False, log_completions_steps=0, **SHARED)
    return dataclasses.replace(args, bf16=True) if AHA_BF16 else args


def trl_args(out_dir: str, steps: int, defaults: bool):
    from trl import GRPOConfig
    if not defaults:
        return vs_trl.trl_config(out_dir, steps, 1e-5, vs_trl.SEED)
    return GRPOConfig(output_dir=out_dir, max_completion_length=vs_trl.MAX_COMPLETION_LENGTH, max_steps=steps,
                      use_cpu=True, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
                      log_completions=False, **SHARED)


def run_aha(model_dir: str, steps: int, turns: int, turn_tokens: int, threads: int, out_dir: str,
            defaults: bool = False) -> dict:
    import torch
    from aha.train.grpo import GRPOTrainer
    torch.set_num_threads(threads)
    FixedTurns.turn_tokens = turn_tokens
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[vs_trl.vowel_frac], tools=[echo],
                          args=aha_args(out_dir, steps, threads, defaults),
                          train_dataset=dataset(turns), engine_factory=FixedTurns.for_model)
    generation = trainer.experience.generation
    generation.chat = rule = Scripted(trainer.tokenizer, trainer.args.chat_template_kwargs)
    if rule.template is not None:
        raise RuntimeError("aha did not keep the tokenizer's template (TOOL_TEMPLATE): the prompts would differ")
    records = []
    for _ in range(steps):
        rule.count.update(model_turns=0, model_tokens=0)
        t0 = time.perf_counter()
        m = trainer.step()
        wall = time.perf_counter() - t0
        trainer.step_count += 1
        records.append({"step_s": wall, "generate_s": m["perf/generate_s"], "train_s": m["perf/train_s"],
                        **rule.count})
    check_turns(records, turns)
    prompt = generation.chat.prompt_ids(dataset(turns)[0]["prompt"], trainer.agent.schemas[None])
    loop = "rejoin" if "on_turn_end" in inspect.signature(trainer.engine.generate).parameters else "rounds"
    return {"records": records, "prompt0_ids": prompt, "torch_threads": torch.get_num_threads(), "turn_loop": loop}


def run_trl(model_dir: str, steps: int, turns: int, turn_tokens: int, threads: int, out_dir: str,
            defaults: bool = False) -> dict:
    import torch
    import trl.trainer.grpo_trainer as grpo
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl.chat_template_utils import qwen3_template
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = qwen3_template  # Hermes tags, as TOOL_TEMPLATE writes; parsing is scripted below
    rule = Scripted(tokenizer)
    grpo.parse_response = trl_parse(rule)
    steps_s, current, records = [], {}, []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            current.clear()
            rule.count.update(model_turns=0, model_tokens=0)
            current.update(t0=time.perf_counter(), generate_s=0.0, model_s=0.0)

        def on_step_end(self, args, state, control, **kw):
            records.append({"step_s": time.perf_counter() - current.pop("t0"), **current, **rule.count})

    trainer = grpo.GRPOTrainer(model=model_dir, reward_funcs=[vs_trl.vowel_frac], tools=[echo],
                               args=trl_args(out_dir, steps, defaults),
                               train_dataset=Dataset.from_list(dataset(turns)), processing_class=tokenizer,
                               callbacks=[StepTimer()])
    trainer.remove_callback(PrinterCallback)
    trainer.generation_config.max_new_tokens = trainer.generation_kwargs["max_new_tokens"] = turn_tokens
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generate, single_turn = trainer._generate, trainer._generate_single_turn

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = generate(prompts)
        current["generate_s"] += time.perf_counter() - t0
        return out

    def fixed_turn(prompt_ids, *a, **k):
        t0 = time.perf_counter()
        ids, logprobs = single_turn(prompt_ids, *a, **k)
        current["model_s"] += time.perf_counter() - t0
        return [c[:-1] + [eot] for c in ids], logprobs

    trainer._generate, trainer._generate_single_turn = timed_generate, fixed_turn
    trainer.train()
    if len(records) != steps:
        raise RuntimeError(f"expected {steps} timed steps, got {len(records)}")
    check_turns(records, turns)
    prompt = tokenizer.apply_chat_template(dataset(turns)[0]["prompt"], tools=trainer.tools, tokenize=True,
                                           add_generation_prompt=True, return_dict=False)
    return {"records": records, "prompt0_ids": list(prompt), "torch_threads": torch.get_num_threads()}


def worker(a) -> None:
    run = run_aha if a.worker == "aha" else run_trl
    with tempfile.TemporaryDirectory(prefix=f"vs_trl_tools_{a.worker}_") as out_dir:
        result = run(a.model_dir, a.steps, a.turns[0], a.turn_tokens, a.threads, out_dir, a.defaults)
    result["peak_rss_mb"] = vs_trl.peak_rss_mb()
    Path(a.result).write_text(json.dumps(result))


# ------------------------------------------------------------------ driver
def spawn(framework: str, model_dir: str, turns: int, a, tmp: Path, tag: str) -> dict:
    result = tmp / f"{tag}.json"
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", TRL_EXPERIMENTAL_SILENCE="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", framework, "--model-dir", model_dir,
           "--steps", str(a.steps), "--turns", str(turns), "--turn-tokens", str(a.turn_tokens),
           "--budget", str(a.budget), "--threads", str(a.threads), "--result", str(result)] + (
               ["--defaults"] if a.defaults else []) + (["--aha-bf16"] if a.aha_bf16 else [])
    proc = subprocess.run(cmd, env=env, cwd=vs_trl.ROOT, capture_output=True, text=True, timeout=a.worker_timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{framework} worker failed (exit status {proc.returncode}): {' '.join(cmd)}")
    return json.loads(result.read_text())


def summary(run: dict) -> dict:
    timed = run["records"][1:]  # the first step warms up
    med = lambda key: statistics.median(r[key] for r in timed)  # noqa: E731
    out = {"step_s": med("step_s"), "generate_s": med("generate_s"), "model_turns_per_step": med("model_turns"),
           "model_tokens_per_step": med("model_tokens"), "peak_rss_mb": run["peak_rss_mb"],
           "step_s_all": [round(r["step_s"], 3) for r in run["records"]]}
    for key in ("model_s", "train_s"):  # TRL's model turns alone; aha's training phase
        if key in timed[0]:
            out[key] = med(key)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--turns", type=int, nargs="+", default=[4], help="model turns per episode (one run each)")
    p.add_argument("--turn-tokens", type=int, default=32, help="tokens the model decodes in each turn")
    p.add_argument("--budget", type=int, default=1024, help="max_completion_length (both sides)")
    p.add_argument("--steps", type=int, default=4, help="steps per run: 1 warm-up + the rest timed")
    p.add_argument("--rounds", type=int, default=3, help="runs per framework and turn count, alternating")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads in each worker")
    p.add_argument("--worker-timeout", type=float, default=3600.0)
    p.add_argument("--out", default="benchmarks/results/vs_trl_tools.json")
    p.add_argument("--defaults", action="store_true",
                   help="each framework at its own defaults but the workload (SHARED), not vs_trl.py's matched "
                        "training settings (TRL's defaults: bf16 autocast, gradient checkpointing, beta 0)")
    p.add_argument("--aha-bf16", action="store_true",
                   help="aha with bf16: true (bf16 autocast over float32 weights), TRL's default precision")
    p.add_argument("--worker", choices=("aha", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    vs_trl.MAX_COMPLETION_LENGTH = a.budget
    global AHA_BF16
    AHA_BF16 = a.aha_bf16
    if a.worker:
        return worker(a)
    if a.steps < 2:
        p.error("--steps must be at least 2 (one warm-up step plus timed steps)")
    if min(a.turns) < 1 or a.turn_tokens < 2:
        p.error("--turns must be >= 1 and --turn-tokens >= 2")
    report = {"versions": vs_trl.versions(), "argv": sys.argv[1:], "loadavg_start": os.getloadavg(),
              "settings": {"model": "4m", "episodes_per_step": vs_trl.COMPLETIONS_PER_STEP,
                           "num_generations": vs_trl.NUM_GENERATIONS, "max_completion_length": a.budget,
                           "turn_tokens": a.turn_tokens, "threads": a.threads, "steps": a.steps,
                           "warmup_steps_discarded": 1, "tool": "echo (instant)",
                           "training_settings": "each framework's defaults" if a.defaults else "vs_trl.py's matched",
                           "aha_bf16": a.aha_bf16},
              "turns": {}}
    out = Path(a.out) if Path(a.out).is_absolute() else vs_trl.ROOT / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aha_vs_trl_tools_") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = build(tmp / "model")
        for k in a.turns:
            rounds: dict[str, list[dict]] = {"aha": [], "trl": []}
            prompts = {}
            for r in range(a.rounds):
                for fw in ("aha", "trl") if r % 2 == 0 else ("trl", "aha"):
                    run = spawn(fw, model_dir, k, a, tmp, f"{fw}-{k}-{r}")
                    prompts[fw] = run["prompt0_ids"]
                    s = summary(run)
                    if "turn_loop" in run:
                        report["aha_turn_loop"] = run["turn_loop"]
                    rounds[fw].append(s)
                    print(json.dumps({"turns": k, "round": r, "framework": fw, **s}), flush=True)
            if prompts["aha"] != prompts["trl"]:
                raise SystemExit(f"the two sides' prompts differ: aha {prompts['aha']} trl {prompts['trl']}")
            med = {fw: {key: statistics.median(s[key] for s in rs) for key in ("step_s", "generate_s")}
                   for fw, rs in rounds.items()}  # the median of the rounds' medians, each phase on its own
            pairs = list(zip(rounds["aha"], rounds["trl"]))
            report["turns"][k] = {
                "rounds": rounds, "median": med, "prompt_tokens": len(prompts["aha"]),
                "trl_over_aha_step": med["trl"]["step_s"] / med["aha"]["step_s"],
                "trl_over_aha_generate": med["trl"]["generate_s"] / med["aha"]["generate_s"],
                "trl_over_aha_step_per_round": [t["step_s"] / h["step_s"] for h, t in pairs],
                "trl_over_aha_generate_per_round": [t["generate_s"] / h["generate_s"] for h, t in pairs]}
            t = report["turns"][k]
            print(f"{k} turns: TRL/aha per step {t['trl_over_aha_step']:.2f}x, generation "
                  f"{t['trl_over_aha_generate']:.2f}x (per round: "
                  + " ".join(f"{x:.2f}" for x in t["trl_over_aha_step_per_round"]) + " / "
                  + " ".join(f"{x:.2f}" for x in t["trl_over_aha_generate_per_round"]) + ")", flush=True)
            report["loadavg_end"] = os.getloadavg()
            out.write_text(json.dumps(report, indent=1))  # after each turn count: a long run keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
