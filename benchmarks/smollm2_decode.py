"""SmolLM2-135M-Instruct's decoding through aha's engine in bfloat16 weights (what `dtype: auto` samples with where
the CPU computes bf16): 2 chat prompts x 8 samples, 192 new tokens each (no EOS), one torch thread, after a warm-up.

    .venv/bin/aha models get smollm2-135m-instruct        # prints the directory it is in
    .venv/bin/python benchmarks/smollm2_decode.py ~/.cache/aha/models/smollm2-135m-instruct

Compare two trees of aha by running it with PYTHONPATH set to each.
"""
import sys, time, torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM, AutoTokenizer
from aha.rollout.engines import get_engine
from aha.rollout.base import SamplingParams
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write a short story about a cat number {i}. " * 6}], add_generation_prompt=True) for i in range(2)]
prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
eng = get_engine("hf")(model, tok, 512, eos_token_ids=[])
p = SamplingParams(temperature=1.0, max_new_tokens=192)
eng.generate(prompts, 8, SamplingParams(temperature=1.0, max_new_tokens=16), torch.Generator().manual_seed(0))
for r in range(2):
    t = time.perf_counter(); out = eng.generate(prompts, 8, p, torch.Generator().manual_seed(1))
    dt = time.perf_counter() - t
    print(f"prompt {len(prompts[0])} tokens, 16 rows x {sum(map(len,out.completion_ids))/16:.0f}: {dt:.2f} s, {sum(map(len,out.completion_ids))/dt:.0f} tokens/s")
