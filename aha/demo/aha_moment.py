"""`aha demo aha`: the aha moment you can watch. Does GRPO make a tiny model check its own sums more often,
when checking is what makes answers right?

R1-Zero's RL made its model start saying "wait, let me reconsider". Here the task (aha.tasks.checked) has a
first attempt that slips and a check that catches the slip; the cold start shows the check on a few solutions
only (`reflect_share`), so the behaviour exists but is rare; GRPO pays for correctness and format only, never
for the words. Reflection is measured on the held-out problems (greedy and sampled) before and after GRPO, and
during GRPO on the sampled completions (behaviour/*) and the held-out greedy ones (eval/behaviour/*).

build a model in code -> cold start -> GRPO -> reflection and accuracy before/after, aha.png, summary.json.
The ablations are settings: reflect_share=0 (nothing to reinforce), check_carries=false (the check has nothing
to catch), wait_reward=0.5 (a reward that pays for "wait": behaviour/empty_reflection should catch the hack);
sft_model=RUN/sft/model lets an arm start from another run's cold start.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..config import DemoConfig
from . import default
from .default import accuracy_report, cold_start, finish, given_model, held_out, start, train_grpo

DEFAULTS = {**default.DEFAULTS, "sft_target": 0.5}
"""The embedded default's, with a cold start to 0.5: the rewards pay for the answer alone, and from 0.25 seed 0
sampled 5% right answers and GRPO lost 10 points of held-out accuracy."""

CURVES = ["eval/accuracy", "eval/behaviour/reflection_rate", "behaviour/reflection_rate",
          "behaviour/accuracy/reflective", "behaviour/accuracy/direct", "behaviour/wait_fixed_rate",
          "behaviour/wait_broke_rate", "behaviour/empty_reflection", "completion/len_mean"]
"""What aha.png draws over GRPO steps: held-out greedy (eval/) and sampled training completions."""
SHOWN = ("behaviour/reflection_rate", "behaviour/correction_rate", "behaviour/wait_fixed_rate",
         "behaviour/wait_broke_rate", "behaviour/empty_reflection", "behaviour/accuracy/reflective",
         "behaviour/accuracy/direct")
"""The behaviour metrics summary.json keeps for each model and decoding."""


def run(cfg: DemoConfig) -> dict:
    from ..behaviour import DEFAULT_REFLECTION_PHRASES
    from ..eval import make_eval_fn
    from ..tasks import get_task
    from ..tasks.checked import MARKER, make_checked, wait_word_reward

    t0 = time.perf_counter()
    out = start(cfg)
    task, phrases = get_task("add_check"), [*DEFAULT_REFLECTION_PHRASES, MARKER]
    train = make_checked("train", None, cfg.seed, cfg.reflect_share, cfg.check_carries)[:6000]  # no carries: 2,560
    test = make_checked("test", cfg.eval_problems, cfg.seed, 0.0, cfg.check_carries)

    # 1-2. a model built in code and its cold start (or another run's, shared by arms that differ only later)
    sft_dir, sft_steps = cold_started(cfg, out, task, train)
    before = measure(cfg, task, test, sft_dir, phrases)

    # 3. GRPO on correctness and format only (plus, in the hack's ablation, a reward for the word "wait");
    #    every held-out problem of the in-training check goes to held_out.jsonl with what its reflection did
    rewards, weights = task.rewards(), list(task.reward_weights)
    if cfg.wait_reward:
        rewards, weights = [*rewards, wait_word_reward], [*weights, cfg.wait_reward]
    eval_fn = make_eval_fn(task, test[:cfg.eval_during], shown=cfg.eval_during, phrases=phrases)
    grpo_dir = train_grpo(cfg, out, sft_dir, task, train, rewards, test, eval_fn=eval_fn,
                          reward_weights=weights, reflection_phrases=phrases)
    after = measure(cfg, task, test, grpo_dir, phrases)
    return report(out, before, after, cfg, grpo_dir, time.perf_counter() - t0, sft_steps)


def cold_started(cfg: DemoConfig, out: Path, task, train: list) -> tuple[Path, int]:
    """The cold-start model: `sft_model` when given (0 steps taken here), else a tiny model built on the task's
    text (every problem in all three kinds, so arms that differ in reflect_share get the same one) and SFT."""
    from ..models.tiny import make_tiny
    from ..tasks.checked import check_corpus
    if cfg.sft_model:
        return given_model(cfg.sft_model, "sft_model"), 0
    base = make_tiny(out / "base", check_corpus(train), size=cfg.size, seed=cfg.seed)
    return cold_start(cfg, out, base, task, train)


def measure(cfg: DemoConfig, task, test: list, model_dir: Path, phrases: list[str]) -> dict:
    """held_out's accuracy summary, plus the behaviour metrics of the greedy answers (`greedy`) and of
    held_out_samples samples per problem at temperature 1 (`sampled`), and per problem whether its greedy answer
    reflects (`reflects`, 0/1) and the share of its samples that do (`sample_reflects`), for the intervals."""
    from ..behaviour import behaviour_metrics, count_phrases
    from ..eval import greedy_behaviour
    n = cfg.held_out_samples
    res = held_out(cfg, task, test, model_dir, **({"n_samples": n, "temperature": 1.0, "keep_samples": True,
                                                   "seed": cfg.seed} if n else {}))
    records = res.pop("records")
    greedy, _ = greedy_behaviour(records, phrases)
    samples = [(r["prompt"], s) for r in records for s in r.get("samples", [])]
    sampled = behaviour_metrics([p for p, _ in samples], [s["text"] for _, s in samples],
                                [s["len"] for _, s in samples], [s["correct"] for _, s in samples], phrases)
    share = lambda texts: sum(c > 0 for c in count_phrases(texts, phrases)) / max(len(texts), 1)  # noqa: E731
    return {**res, "greedy": greedy, "sampled": sampled if samples else {},
            "reflects": [share([r["greedy"]]) for r in records],
            "sample_reflects": [share([s["text"] for s in r["samples"]]) for r in records if r.get("samples")]}


def reflection_summary(before: dict, after: dict, seed: int) -> dict:
    """summary.json's reflection keys: held-out greedy rates with Wilson intervals and their paired change
    (points, bootstrap over problems), sampled rates with bootstrap intervals over problems, the share of
    greedy answers a "wait" corrected to the right answer, and the shown behaviour metrics of each model."""
    from ..stats import bootstrap, is_gain, paired_gain, wilson
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    points = lambda ci: [100 * ci[0], 100 * ci[1]]  # noqa: E731
    gain, ci = paired_gain(before["reflects"], after["reflects"], seed=seed)
    out = {}
    for stage, res in (("sft", before), ("grpo", after)):
        out[f"{stage}_reflection_rate"] = mean(res["reflects"])
        out[f"{stage}_reflection_rate_ci95"] = list(wilson(int(sum(res["reflects"])), len(res["reflects"])))
        out[f"{stage}_reflection_rate_sampled"] = mean(res["sample_reflects"])
        out[f"{stage}_reflection_rate_sampled_ci95"] = [_finite(v) for v in bootstrap(res["sample_reflects"],
                                                                                   seed=seed)]
        out[f"{stage}_corrected_rate"] = _finite(res["greedy"]["behaviour/wait_fixed_rate"])
    out.update({"reflection_gain_points": 100 * gain, "reflection_gain_ci95": points(ci),
                "reflection_rose": is_gain(ci)})
    if before["sample_reflects"] and after["sample_reflects"]:
        sgain, sci = paired_gain(before["sample_reflects"], after["sample_reflects"], seed=seed)
        out.update({"reflection_gain_sampled_points": 100 * sgain, "reflection_gain_sampled_ci95": points(sci)})
    out["behaviour"] = {f"{stage}_{kind}": {k: _finite(res[kind].get(k)) for k in SHOWN}
                        for stage, res in (("sft", before), ("grpo", after)) for kind in ("greedy", "sampled")
                        if res[kind]}
    return out


def _finite(v: float | None) -> float | None:
    """NaN (no completion in a split) as None: summary.json stays JSON that a browser reads."""
    return None if v is None or v != v else v


def fixed_by_reflection(held_out: Path) -> dict[str, int]:
    """Held-out problem id -> the first in-training evaluation at which a "wait" fixed its greedy answer after an
    earlier one got it wrong (aha.behaviour.first_fixes over held_out.jsonl)."""
    import json

    from ..behaviour import first_fixes
    rows = [json.loads(line) for line in held_out.read_text().splitlines()] if held_out.is_file() else []
    return {str(k): v for k, v in sorted(first_fixes(rows).items())}


def reflection_table(before: dict, after: dict, summary: dict, samples: int) -> str:
    """The held-out reflection table (greedy and sampled, before and after) and the verdict on the change."""
    pct = lambda v: "–" if v is None or v != v else f"{v:.1%}"  # noqa: E731
    head = ("| held-out completions | reflection | corrections (wait) | wait fixed | wait broke | empty reflection "
            "| accuracy reflective / direct |\n|---|---|---|---|---|---|---|\n")
    rows = []
    for label, res in (("SFT (cold start)", before), ("SFT + GRPO", after)):
        for kind, name in (("greedy", "greedy"), ("sampled", f"sampled x{samples}")):
            m = res[kind]
            if m:
                rows.append(f"| {label}, {name} | {pct(m['behaviour/reflection_rate'])} | "
                            f"{pct(m['behaviour/correction_rate'])} | {pct(m['behaviour/wait_fixed_rate'])} | "
                            f"{pct(m['behaviour/wait_broke_rate'])} | {pct(m['behaviour/empty_reflection'])} | "
                            f"{pct(m['behaviour/accuracy/reflective'])} / {pct(m['behaviour/accuracy/direct'])} |\n")
    lo, hi = summary["reflection_gain_ci95"]
    verdict = "a rise" if summary["reflection_rose"] else "fell" if hi < 0 else "inside the noise: no rise"
    fixes = summary.get("fixed_by_reflection", {})
    return (head + "".join(rows) + f"\nHeld-out greedy reflection {pct(summary['sft_reflection_rate'])} -> "
            f"{pct(summary['grpo_reflection_rate'])}: {summary['reflection_gain_points']:+.1f} points, paired "
            f"bootstrap 95% CI [{lo:+.1f}, {hi:+.1f}] ({verdict})\n"
            f"In-training held-out checks: {len(fixes)} problems answered wrong were later fixed by a \"wait\""
            + (f" (the first at step {min(fixes.values())})" if fixes else "") + "\n")


def report(out: Path, before: dict, after: dict, cfg: DemoConfig, grpo_dir: Path, seconds: float,
           sft_steps: int) -> dict:
    """summary.json (the demo's accuracy keys, then reflection's), results.md and aha.png; the tables printed."""
    from ..metrics import plot_metrics
    plot = plot_metrics(out / "grpo" / "metrics.jsonl", CURVES, out / "aha.png",
                        title="Reflection under GRPO (eval/: held-out greedy; the rest: sampled training completions)")
    n = len(before["reflects"])
    summary, table = accuracy_report(before, after, n, cfg.seed)
    summary.update(reflection_summary(before, after, cfg.seed))
    summary["fixed_by_reflection"] = fixed_by_reflection(out / "grpo" / "held_out.jsonl")
    summary.update({"reflect_share": cfg.reflect_share, "check_carries": cfg.check_carries,
                    "wait_reward": cfg.wait_reward, "sft_model": cfg.sft_model, "eval_problems": n,
                    "sft_steps": sft_steps, "steps": cfg.grpo_steps, "seconds": round(seconds, 1),
                    "model_dir": str(grpo_dir), "plot": str(plot)})
    return finish(out, summary, table + "\n" + reflection_table(before, after, summary, cfg.held_out_samples))
