"""An Engine whose completions depend only on the prompt and the sample's index: the same rollouts in every process
and on every CPU, so two paths (one process and Ray; the trainer before and after a refactor) can be compared on
identical data. `delay` keeps calls in flight."""

import time

from aha.rollout import Rollout


class Scripted:
    """What both engines share: built by name (`for_model`), tagged with the weight version they were given."""

    version = 0

    @classmethod
    def for_model(cls, model, tokenizer, max_batch=512):
        return cls(model, tokenizer, max_batch)

    def update_weights(self, model, version):
        self.version = version


class ScriptedEngine(Scripted):
    def __init__(self, model, tokenizer, max_batch=512, delay=0.0):
        self.delay, self.vocab = delay, model.config.vocab_size

    def generate(self, prompt_ids, n, params, generator=None):
        time.sleep(self.delay)
        out = [[(p[-1] * 7 + j * 13 + k * 5) % self.vocab for k in range(1 + (p[-1] + j) % params.max_new_tokens)]
               for p in prompt_ids for j in range(n)]
        return Rollout(completion_ids=out, truncated=[len(c) == params.max_new_tokens for c in out],
                       version=self.version)


class ScriptedAgentEngine(Scripted):
    """An Engine for episodes: each model turn is `script(conversation so far as text)` (a reply written in the
    tool-call format, or None for a plain answer), tokenized as the tokenizer splits it and ended with EOS. The
    same turns in every process: the turn loop, the one process and Ray can be compared on identical episodes."""

    def __init__(self, model, tokenizer, max_batch=512, script=None, delay=0.0):
        self.tok, self.script, self.delay = tokenizer, script or count_to_three, delay

    def generate(self, prompt_ids, n, params, generator=None):
        time.sleep(self.delay)
        out = []
        for p in prompt_ids:
            for j in range(n):  # the G samples of one prompt differ by their index
                text = self.tok.decode(p) + (f"\n[sample {j}]" if n > 1 else "")
                reply = self.tok(self.script(text), add_special_tokens=False)["input_ids"]
                out.append((reply + [self.tok.eos_token_id])[:params.max_new_tokens])
        return Rollout(completion_ids=out, truncated=[c[-1] != self.tok.eos_token_id for c in out],
                       version=self.version, logprobs=[[-0.5] * len(c) for c in out] if params.logprobs else None)


def count_to_three(context: str) -> str:
    """Three increment calls whose steps depend on the prompt's digits, then a plain answer."""
    calls = context.count("<|im_start|>tool")
    if calls < 3:
        step = 1 + (sum(map(ord, context.split("<|im_start|>user")[-1])) + calls) % 3
        return f'<tool_call>\n{{"name": "increment", "arguments": {{"step": {step}}}}}\n</tool_call>'
    return "done"


class CounterEnv:
    """IncrementEnv of TRL's docs (the target from the row), counting its resets in this process."""

    resets = 0

    def reset(self, **kwargs):
        CounterEnv.resets += 1
        self.counter, self.target = 0, int(kwargs.get("target", 4))
        return f" Reach {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter


PARITY_CASES: dict[str, dict] = {
    "dapo": {},
    "grpo_beta_iter2": dict(loss_type="grpo", beta=0.04, num_iterations=2),
    "dr_grpo": dict(loss_type="dr_grpo", advantage_estimator="dr_grpo"),
    "rloo_gspo_split": dict(advantage_estimator="rloo", importance_sampling_level="sequence", epsilon_high=0.28,
                            per_device_train_batch_size=4, generation_batch_size=16),
    "batch_rewards_masked_entropy": dict(advantage_estimator="batch_rewards", mask_truncated_completions=True,
                                         top_entropy_quantile=0.5),
    "batch_k1_shared": dict(advantage_estimator="batch", kl_estimator="k1", beta=0.1, share_prompts=True),
    "k2_delta_budget": dict(kl_estimator="k2", beta=0.02, delta=1.5, max_tokens_per_micro_batch=40,
                            num_iterations=2),
    "stream_rewards": dict(stream_rewards=True),
    "dynamic_sampling": dict(dynamic_sampling=True),
}
"""Single-turn runs whose metrics must not change when the step's internals do: every loss type, advantage and KL
estimator, importance level, split and streamed batches (benchmarks/single_turn_parity.py, tests/test_experience.py)."""
