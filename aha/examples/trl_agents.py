"""TRL's documented agent examples (docs/source/grpo_trainer.md, "Agent Training"), run with aha.

    python examples/trl_agents.py --model smollm2-135m-instruct --out runs/trl_agents
    python examples/trl_agents.py --model PATH_OR_HUB_ID --only increment_dataset

Each example is TRL's code with `from aha import GRPOConfig, GRPOTrainer`, changing only `model=`, `output_dir`
and `max_steps=3`, and filling what the doc leaves out: the `...` bodies (a format reward, a Fibonacci
`run_code`, a one-row grid game's `move`), the undefined `reward_func`, the arguments the tools example elides
(a dataset of multiplications, a reward, a config) and the docstring the doc's second `IncrementEnv.increment`
points back to ("see the full docstring above"; set from the first one), which transformers needs to describe the
tool. Each trains 3 steps
and saves its model. tests/test_agents.py runs them on a tiny model built in code.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from aha import GRPOConfig, GRPOTrainer


# ------------------------------------------------------------------ Environments: IncrementEnv, self-sampling
class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


SELF_SAMPLING_INCREMENT_DOC = IncrementEnv.increment.__doc__


def increment_self_sampling(model: str, output_dir: str) -> GRPOTrainer:
    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(output_dir=output_dir, max_steps=3, chat_template_kwargs={"enable_thinking": False}),
        environment_factory=IncrementEnv,
    )
    trainer.train()
    return trainer


# ------------------------------------------------------------------ Environments: with a dataset (`target` column)
def increment_dataset(model: str, output_dir: str) -> GRPOTrainer:
    from datasets import Dataset

    # Each row carries the prompt and the task data (here, the counter target to reach).
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
            "target": list(range(1, 7)),
        }
    )

    class IncrementEnv:
        def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
            self.counter = 0
            self.target = target

        def get_reward(self) -> float:
            return float(self.counter == self.target)

        def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
            self.counter += step
            return self.counter
        increment.__doc__ = SELF_SAMPLING_INCREMENT_DOC  # the full docstring the doc points back to

    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(output_dir=output_dir, max_steps=3),
        train_dataset=dataset,  # the dataset owns the task; the "target" column reaches reset(target=...)
        environment_factory=IncrementEnv,
    )
    trainer.train()
    return trainer


# ------------------------------------------------------------------ Tools: multiply and async_add
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def final_number_matches(completions, answer, **kwargs):  # fills the doc's `...`: the last number of the reply
    replies = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    found = [re.findall(r"-?\d+", r) for r in replies]
    return [float(bool(f) and f[-1] == str(a)) for f, a in zip(found, answer)]


def tools(model: str, output_dir: str) -> GRPOTrainer:
    rng = random.Random(0)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99), rng.randint(1, 9)) for _ in range(64)]
    dataset = [{"prompt": [{"role": "user", "content": f"What is {a} * {b} + {c}? Use the tools."}],
                "answer": str(a * b + c)} for a, b, c in pairs]
    trainer = GRPOTrainer(
        tools=[multiply, async_add],
        model=model, reward_funcs=final_number_matches, train_dataset=dataset,
        args=GRPOConfig(output_dir=output_dir, max_steps=3),
    )
    trainer.train()
    return trainer


# ------------------------------------------------------------------ Rewards: reward_funcs beside get_reward
def format_reward(completions, **kwargs):  # trainer-owned: scores the completion
    return [0.1 if c[-1]["role"] == "assistant" and not c[-1].get("tool_calls") else 0.0 for c in completions]


def rewards(model: str, output_dir: str) -> GRPOTrainer:
    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(output_dir=output_dir, max_steps=3),
        reward_funcs=format_reward,          # trainer-owned: scores the completion
        environment_factory=IncrementEnv,    # env-owned: scores its internal state via `get_reward`
    )
    trainer.train()
    return trainer


# ------------------------------------------------------------------ Multiple environments
def fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class CodingEnv:
    def reset(self, **kwargs) -> str:
        n = random.randint(1, 20)
        self.answer = fibonacci(n)
        return f"Compute the {n}th Fibonacci number."

    def run_code(self, code: str) -> str:  # exposed as a tool only for "coding" examples
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        from aha.envs.python import run_python
        return run_python(code)


class GameEnv:
    def reset(self, **kwargs) -> str:
        self.position, self.goal = 0, 3
        return "Reach the goal tile."

    def move(self, action: str) -> str:  # exposed as a tool only for "game" examples
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        self.position += {"right": 1, "left": -1}.get(action, 0)
        return "goal reached" if self.position == self.goal else f"tile {self.position} of 0..{self.goal}"


def reward_func(completions, environments, **kwargs):  # the doc's undefined reward_func: did the episode succeed?
    out = []
    for c, env in zip(completions, environments):
        if isinstance(env, CodingEnv):
            out.append(float(str(env.answer) in c[-1]["content"]))
        else:
            out.append(float(env.position == env.goal))
    return out


def multiple_environments(model: str, output_dir: str) -> GRPOTrainer:
    from datasets import Dataset

    # The dataset only routes: each row picks the environment for that rollout
    dataset = Dataset.from_dict({"environment": ["coding", "game"] * 500})

    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(output_dir=output_dir, max_steps=3, chat_template_kwargs={"enable_thinking": False}),
        train_dataset=dataset,
        reward_funcs=reward_func,
        environment_factory={"coding": CodingEnv, "game": GameEnv},
    )
    trainer.train()
    return trainer


EXAMPLES = {"increment_self_sampling": increment_self_sampling, "increment_dataset": increment_dataset,
            "tools": tools, "rewards": rewards, "multiple_environments": multiple_environments}


def main() -> None:
    parser = argparse.ArgumentParser(description="TRL's agent examples with aha")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", default="runs/trl_agents")
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    a = parser.parse_args()
    summary = {}
    for name in a.only:
        trainer = EXAMPLES[name](a.model, str(Path(a.out) / name))
        saved = trainer.save_model()
        rows = [json.loads(line) for line in (Path(a.out) / name / "metrics.jsonl").read_text().splitlines()]
        keys = ("reward/mean", "tools/calls_per_episode", "tools/errors", "tools/turns", "completion/len_mean",
                "perf/step_s")
        summary[name] = {"saved": str(saved), "steps": [{k: r.get(k) for k in keys} for r in rows]}
        print(name, json.dumps(summary[name]), flush=True)
    (Path(a.out) / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
