"""Each speed feature of aha switched off and on, on the same work, in one process, alternating.

    .venv/bin/python benchmarks/ablations.py                 # 4m model, 2 threads, 5 repeats
    .venv/bin/python benchmarks/ablations.py --size 30m --repeats 3

Features (off -> on):
  prefill_once        every one of the B*G rows prefills its prompt -> each prompt prefilled once, cache shared
  drop_finished       rows that hit EOS keep decoding until the longest ends -> dropped from the batch
  layer_cache_64/448  transformers' DynamicCache (grows by concatenation) -> LayerCache (buffers written in
                      place), at 64 and 448 new tokens
  sorted_micro        micro-batches of 4 in arrival order -> sorted by length (less padding computed);
                      forward + backward over 64 sequences of 8..256 tokens
  skip_zero_adv       beta = 0, half of the groups with zero advantage: trained anyway -> skipped
  no_old_logprobs     num_iterations = 1: the old-policy forward computed anyway -> not computed
Each is timed `--repeats` times with off and on alternating; the table gives medians and the speed-up.
The model is built in code (random weights, as in vs_trl.py); an EOS bias gives varied completion lengths
where the feature depends on them.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from aha.rollout import SamplingParams, get_engine  # noqa: E402
from aha.rollout import hf as engine_module  # noqa: E402


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(name: str, off, on, repeats: int, rows: list) -> None:
    off(), on()  # warm-up
    t_off, t_on = [], []
    for _ in range(repeats):
        t_off.append(timed(off))
        t_on.append(timed(on))
    a, b = statistics.median(t_off), statistics.median(t_on)
    rows.append((name, a, b))
    print(f"{name:<18} off {a:8.3f} s   on {b:8.3f} s   speed-up {a / b:5.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="4m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from vs_trl import build_model, prompts as make_prompts
    from aha.train.grpo import GRPOBatch, GRPOTrainer
    from aha.config import GRPOConfig

    tmp = tempfile.mkdtemp(prefix="aha_ablations_")
    info = build_model(a.size, Path(tmp) / "model")
    cfg = GRPOConfig(output_dir=tmp + "/run", num_generations=8, per_device_train_batch_size=16,
                     max_completion_length=64, beta=0.0, report_to=[], progress_bar=False,
                     log_completions_steps=0, threads=a.threads)
    data = make_prompts()
    trainer = GRPOTrainer(model=info["path"], reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                          args=cfg, train_dataset=data)
    model, tok = trainer.model, trainer.tokenizer
    eos = tok.eos_token_id
    prompts = trainer.prompt_ids[:2]
    print(f"{a.size}: {info['params']:,} parameters; {a.threads} threads; torch {torch.__version__}; "
          f"{platform.processor() or platform.machine()}", flush=True)
    rows: list = []
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731

    # ---- generation (B=2 prompts x G=8, temperature 1)
    def gen(engine, ps, n, T):
        return lambda: engine.generate(ps, n, SamplingParams(1.0, 1.0, 0, T), g())

    build = get_engine("hf")
    fast = build(model, tok, eos_token_ids=[eos])
    never, never_slow = build(model, tok, eos_token_ids=[]), build(model, tok, eos_token_ids=[], layer_cache=False)
    compare("prefill_once", gen(fast, [p for p in prompts for _ in range(8)], 1, 64), gen(fast, prompts, 8, 64),
            a.repeats, rows)
    for T in (64, 448):
        compare(f"layer_cache_{T}", gen(never_slow, prompts, 8, T), gen(never, prompts, 8, T), a.repeats, rows)

    # an EOS logit bias, so completion lengths spread out instead of all running to the budget
    eos_bias = torch.zeros(model.config.vocab_size)
    eos_bias[eos] = 2.0
    hook = model.lm_head.register_forward_hook(lambda module, inputs, out: out + eos_bias.to(out.dtype))
    lengths = [len(c) for c in fast.generate(prompts, 8, SamplingParams(1.0, 1.0, 0, 256), g()).completion_ids]
    print(f"   (EOS-biased model: completion lengths at 256 new tokens: mean {statistics.fmean(lengths):.0f}, "
          f"min {min(lengths)}, max {max(lengths)})")

    def no_drop():
        keep, engine_module.COMPACT_FRACTION = engine_module.COMPACT_FRACTION, float("inf")
        try:
            fast.generate(prompts, 8, SamplingParams(1.0, 1.0, 0, 256), g())
        finally:
            engine_module.COMPACT_FRACTION = keep

    compare("drop_finished", no_drop, gen(fast, prompts, 8, 256), a.repeats, rows)
    hook.remove()

    # ---- training side: 64 sequences, prompt 8-20 tokens, completion 8..256 tokens
    rng = torch.Generator().manual_seed(1)
    P = [trainer.prompt_ids[i] for i in range(8) for _ in range(8)]
    C = [torch.randint(7, model.config.vocab_size, (int(n),), generator=rng).tolist()
         for n in torch.randint(8, 257, (64,), generator=rng)]

    def fwd_bwd(order):
        def run():
            for s in range(0, 64, 4):
                ids = order[s:s + 4]
                lp, mask, _ = trainer.learner._logprobs(model, [P[i] for i in ids], [C[i] for i in ids])
                ((lp * mask).sum() / mask.sum()).backward()
            model.zero_grad(set_to_none=True)
        return run

    arrival = list(range(64))
    compare("sorted_micro", fwd_bwd(arrival), fwd_bwd(sorted(arrival, key=lambda i: len(P[i]) + len(C[i]))),
            a.repeats, rows)

    adv = torch.randn(64)
    adv[:32] = 0.0  # half of the groups carry no signal
    keep = torch.ones(64, dtype=torch.bool)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    batch = GRPOBatch(rows=[{"prompt": ""}] * 8, prompt_ids=P, completion_ids=C, texts=[""] * 64,
                      truncated=~keep, rewards_per_func=adv[:, None], rewards=adv, advantages=adv,
                      versions=torch.zeros(64, dtype=torch.long))

    def update(skip):
        def run():
            trainer.args.skip_zero_advantage = skip
            trainer.learner.update(batch)
            model.load_state_dict(state)  # every timed update starts from the same weights
        return run

    compare("skip_zero_adv", update(False), update(True), a.repeats, rows)
    trainer.args.skip_zero_advantage = True
    compare("no_old_logprobs", lambda: (trainer.learner.frozen_logprobs(batch, reference=False), update(True)()),
            update(True), a.repeats, rows)

    print("\n| feature | off (s) | on (s) | speed-up |\n|---|---|---|---|")
    for name, off, on in rows:
        print(f"| {name} | {off:.3f} | {on:.3f} | {off / on:.2f}x |")


if __name__ == "__main__":
    main()
