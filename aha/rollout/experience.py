"""The experience box: prompts -> episodes -> scored, typed batch with advantages.

    prompts (B) --> Generation: engine (+ for an agent, the turn loop: tool calls parsed, tools run, results
                    appended) --> N = B*G episodes (token ids, loss mask, behaviour log-probs, finish, version)
                --> reward functions and environment rewards --> rewards [N, F], weighted sum [N], step rewards
                --> advantages per token (an outcome advantage broadcast over the model tokens; under process
                    supervision, from the steps each token precedes) --> GRPOBatch

The single-process trainer draws its batches from an `Experience`; the Ray layer (aha.dist.Pipeline) is built
from one: its rollout workers run the same `Generation`, its reward workers the same scoring, and its driver
the same `assemble`. Both give the loop the same four calls (next_batch, publish, pull, close), so the
trainer's step never asks where its experience came from.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from typing import Callable

import torch
from torch import Tensor

from .. import algos
from ..envs.tools import OUTCOMES
from ..rewards import merge_reward_metrics, reward_name, score_groups
from ..rewards.steps import TurnEnd, step_tokens
from ..batch import GRPOBatch
from .base import Rollout, SamplingParams
from .engines import get_engine
from .prompts import PromptSource
from .replay import ReplayBuffer

SCORER_GRACE_S = 30.0
"""With stream_rewards, how long past its reward calls' own bound (groups x functions x reward_timeout) the
scoring thread may take after generation ends before the step fails."""
Parts = list[tuple[GRPOBatch, dict[str, float]]]
"""Scored groups, as several calls gave them."""


class Generation:
    """The generating half of the box: an engine (chosen by name, `engine: hf`) that turns the prompts of B rows
    into G rollouts each; for an agent (aha.envs.Agent), G episodes each through the turn loop, one environment
    per episode. A Ray rollout worker runs one of these on its own policy copy (and its own environments)."""

    def __init__(self, model, tokenizer, args, engine_factory: Callable | None = None, agent=None):
        self.model, self.tokenizer, self.args, self.agent = model, tokenizer, args, agent
        self.engine_factory = engine_factory or get_engine(args.engine)
        """(model, tokenizer, max_batch) -> an Engine; rollout workers build theirs with it too."""
        self.engine = self.engine_factory(model, tokenizer, args.generation_max_batch)
        self.sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_completion_length,
                                       logprobs=True)  # behaviour log-probs: staleness, mismatch/*
        self.chat = None
        if agent is not None:
            from ..data.toolcalls import ToolChat
            self.chat = ToolChat(tokenizer, args.chat_template_kwargs)

    def run(self, rows: list[dict], prompt_ids: list[list[int]] | None, generator: torch.Generator | None,
            on_group: Callable | None = None) -> tuple[Rollout, list[str]]:
        """G rollouts of each row, prompt-major, and their decoded texts."""
        G = self.args.num_generations
        if self.agent is not None:
            return self._episodes(rows, generator)
        kwargs = {"on_group": on_group} if on_group is not None else {}
        out = self.engine.generate(prompt_ids, G, self.sampling, generator, **kwargs)
        return out, self.decode(out)

    def _episodes(self, rows: list[dict], generator: torch.Generator | None) -> tuple[Rollout, list[str]]:
        """G episodes of each row: environments drawn and reset, prompts rendered with their tools, the turns run."""
        from ..models import context_length
        from .turns import Episode, run_turns
        G, a, agent = self.args.num_generations, self.args, self.agent
        names = [agent.environment_name(r) for r in rows for _ in range(G)]
        envs, episodes, ctx = agent.environments(names), [], context_length(self.model)
        for k, (env, name) in enumerate(zip(envs, names)):
            prompt = agent.reset(env, rows[k // G])
            ids = self.chat.prompt_ids(prompt, agent.schemas[name])
            if ctx and len(ids) + a.max_completion_length > ctx:
                raise ValueError(f"an episode's prompt has {len(ids)} tokens; with max_completion_length "
                                 f"{a.max_completion_length} it exceeds the model's context of {ctx}")
            episodes.append(Episode(prompt, ids, agent.toolbox(env, name), state_key=getattr(env, "state_key", None)))
        out = run_turns(self.engine, self.chat, episodes, G, self.sampling, generator,
                        a.max_tool_calling_iterations, ctx, rejoin=a.rejoin_episodes)
        out.environments = envs if agent.has_environments else None
        return out, self.decode(out)

    def decode(self, out: Rollout) -> list[str]:
        return self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)

    def streams(self) -> bool:
        """Whether the engine reports each group as it finishes (an optional Engine argument; not for episodes)."""
        return self.agent is None and "on_group" in inspect.signature(self.engine.generate).parameters


class Experience:
    """Prompts in, a scored `GRPOBatch` with advantages out (see the module doc)."""

    def __init__(self, args, model, tokenizer, prompts: PromptSource, reward_funcs: list[Callable],
                 reward_weights: Tensor, generator: torch.Generator, max_steps: int,
                 engine_factory: Callable | None = None, agent=None):
        self.args, self.model, self.tokenizer, self.prompts = args, model, tokenizer, prompts
        self.reward_funcs, self.reward_weights = reward_funcs, reward_weights          # [F]
        self.generator, self.max_steps = generator, max_steps
        self.generation = Generation(model, tokenizer, args, engine_factory, agent)
        self.replay = ReplayBuffer(args.replay_buffer_size) if args.replay_buffer_size else None
        """Past groups with reward spread, for groups without it (None: replay_buffer_size 0)."""
        self.fail_streak = {reward_name(f): 0 for f in reward_funcs}
        """Consecutive steps on which each reward function raised or timed out."""
        self.failures: dict[str, BaseException] = {}
        """Each reward function's latest failure (scoring returns them), for the error that stops a run."""
        beside = agent is not None and agent.has_environments
        self.beside_environments = [i for i, f in enumerate(reward_funcs) if beside and reads_environments(f)]
        """Reward functions that read the episodes' environments (get_reward, `environments=`): with Ray they run
        on the rollout worker where the environments live; the others may run anywhere."""
        self.elsewhere = [i for i in range(len(reward_funcs)) if i not in self.beside_environments]

    @property
    def engine(self):
        return self.generation.engine

    # ------------------------------------------------------------------ what the loop calls
    def next_batch(self, step: int) -> tuple[GRPOBatch, dict[str, float]]:
        """The batch of step `step` (0-based): B prompts drawn, sampled, scored, assembled."""
        def sample(k: int) -> Parts:
            return [self.sample(*self.prompts.take(k), step)]
        t0 = time.perf_counter()
        batch, metrics = self.assemble(sample(self.args.prompts_per_step), sample)
        metrics["perf/generate_s"] = time.perf_counter() - t0 - metrics.pop("perf/score_s")
        return batch, metrics

    def publish(self, version: int) -> dict[str, float]:
        """The policy's new weights (version `version`) are what the engine samples from now on."""
        self.engine.update_weights(self.model, version)
        return {}

    def pull(self) -> None:
        """The policy is here already (the Ray layer fetches its learners' weights)."""

    def restored(self, version: int) -> None:
        self.engine.update_weights(self.model, version)

    def sampler_state(self) -> dict:
        """Where a resumed run draws from next."""
        return self.prompts.sampler.state()

    def close(self) -> None:
        """Nothing runs elsewhere."""

    def trainer_state(self, step: int):
        """The transformers TrainerState a reward function gets as `trainer_state` at GRPO step `step`, as TRL
        passes it (global_step, max_steps, epoch: passes over the prompts so far; None for a streaming dataset)."""
        from transformers import TrainerState
        epoch = self.prompts.epoch(step, self.args.prompts_per_step)
        return TrainerState(global_step=step, max_steps=self.max_steps, epoch=epoch)

    # ------------------------------------------------------------------ the box
    def sample(self, rows: list[dict], prompt_ids: list[list[int]], step: int) -> tuple[GRPOBatch, dict[str, float]]:
        """G rollouts of each row, scored (advantages: `assemble`). `perf/score_s` is the scoring time left after
        generation ended; `perf/reward_s` all of it."""
        if self.args.stream_rewards and len(rows) > 1 and self.generation.streams():
            return self._streamed(rows, prompt_ids, step)
        out, texts = self.generation.run(rows, prompt_ids, self.generator)
        t0 = time.perf_counter()
        batch, metrics = self.score(rows, prompt_ids, out, texts, step)
        scoring = time.perf_counter() - t0
        return batch, {**metrics, "perf/score_s": scoring, "perf/reward_s": scoring}

    def _streamed(self, rows: list[dict], prompt_ids: list[list[int]], step: int) -> tuple[GRPOBatch, dict[str, float]]:
        """`sample` with each group scored on a helper thread while this thread decodes the rest. The decode stays
        here: torch's small CPU ops ran about 1.45x slower on a thread other than the main one (BENCHMARKS.md)."""
        finished: queue.Queue = queue.Queue()
        parts: list = [None] * len(rows)
        result: dict = {"scoring": 0.0}

        def score_groups_as_they_come() -> None:
            try:
                while (item := finished.get()) is not None:  # the end mark always comes: put in a finally below
                    t0 = time.perf_counter()
                    i, group = item
                    parts[i] = self.score([rows[i]], [prompt_ids[i]], group, self.generation.decode(group), step)
                    result["scoring"] += time.perf_counter() - t0
            except BaseException as e:  # re-raised on the calling thread
                result["error"] = e

        scorer = threading.Thread(target=score_groups_as_they_come, daemon=True, name="aha-score")
        scorer.start()
        try:
            self.generation.run(rows, prompt_ids, self.generator, on_group=lambda i, r: finished.put((i, r)))
        finally:
            finished.put(None)
        end = time.perf_counter()
        scorer.join(timeout=len(rows) * max(len(self.reward_funcs), 1) * self.args.reward_timeout + SCORER_GRACE_S)
        if scorer.is_alive():
            raise TimeoutError(f"scoring {len(rows)} groups did not end within reward_timeout="
                               f"{self.args.reward_timeout} s per call and group ({SCORER_GRACE_S:g} s of grace)")
        if "error" in result:
            raise result["error"]
        if any(p is None for p in parts):
            raise RuntimeError(f"the engine reported no finished completions for prompts "
                               f"{[i for i, p in enumerate(parts) if p is None]}")
        batch = GRPOBatch.cat([b for b, _ in parts])
        metrics = merge_reward_metrics(self.reward_funcs, [m for _, m in parts], batch.rewards_per_func)
        return batch, {**metrics, "perf/score_s": time.perf_counter() - end, "perf/reward_s": result["scoring"]}

    def score(self, rows: list[dict], prompt_ids: list[list[int]], out: Rollout, texts: list[str], step: int
              ) -> tuple[GRPOBatch, dict[str, float]]:
        """A Rollout of G completions per row -> the scored GRPOBatch (advantages 0 until `assemble`)."""
        steps: list = []
        rpf, metrics = score_groups(self.reward_funcs, rows, texts, self.args.num_generations, out.completion_ids,
                                    self.trainer_state(step), self.args.reward_timeout, episode_inputs(out),
                                    steps_out=steps, failures_out=self.failures)            # [N,F]
        return self.make_batch(rows, prompt_ids, out, texts, rpf, steps), metrics

    def from_parts(self, rows: list[dict], prompt_ids: list[list[int]], out: Rollout, texts: list[str],
                   parts: list[tuple[list[int], dict]]) -> tuple[GRPOBatch, dict[str, float]]:
        """The scored batch from reward columns scored in several places (`score_rollout` results, each for the
        reward functions at its indices): a Ray reward worker's, a rollout worker's beside its environments."""
        rpf = torch.full((len(texts), len(self.reward_funcs)), float("nan"))                 # [N,F]
        steps: list[list] = [[] for _ in texts]
        for idx, scored in parts:
            rpf[:, idx] = scored["rewards"]
            for mine, theirs in zip(steps, scored["steps"]):  # their function indices are positions in idx
                mine += [(end, score, idx[j]) for end, score, j in theirs]
            for name, error in scored["failures"].items():
                self.failures[name] = RuntimeError(f"in a Ray worker: {error}")
        metrics = merge_reward_metrics(self.reward_funcs, [scored["metrics"] for _, scored in parts], rpf)
        return self.make_batch(rows, prompt_ids, out, texts, rpf, steps), metrics

    def make_batch(self, rows: list[dict], prompt_ids: list[list[int]], out: Rollout, texts: list[str],
                   rpf: Tensor, steps: list[list] | None = None) -> GRPOBatch:
        """The scored GRPOBatch; step rewards (end, score, function) get the token their step ends on."""
        G, N = self.args.num_generations, len(texts)
        behaviour = None if out.logprobs is None else [torch.tensor(x, dtype=torch.float32) for x in out.logprobs]
        mask = None if out.loss_mask is None else [torch.tensor(m, dtype=torch.long) for m in out.loss_mask]
        given = steps if steps and any(steps) else None
        if given is not None and out.episodes is not None and any(
                not isinstance(end, TurnEnd) for seq in given for end, _, _ in seq):
            raise ValueError("a reward function gave step rewards as (end, score) pairs on multi-turn episodes: an "
                             "episode's rewards read messages, not one text, so give it one number, or a list of "
                             "numbers, one score per model turn")
        turn_ends = [None] * N if out.episodes is None else [last_model_tokens(e) for e in out.episodes]
        return GRPOBatch(rows=rows, prompt_ids=out.prompt_ids or [p for p in prompt_ids for _ in range(G)],
                         completion_ids=out.completion_ids, texts=texts, truncated=torch.tensor(out.truncated),
                         rewards_per_func=rpf, rewards=self.combine(rpf), advantages=torch.zeros(N),
                         versions=torch.full((N,), out.version, dtype=torch.long), behaviour_logprobs=behaviour,
                         loss_mask=mask, episodes=out.episodes,
                         steps=given and [with_tokens(self.tokenizer, ids, s, ends)
                                          for ids, s, ends in zip(out.completion_ids, given, turn_ends)])

    def assemble(self, parts: Parts, more: Callable[[int], Parts]) -> tuple[GRPOBatch, dict[str, float]]:
        """Scored groups -> the step's training batch with its advantages. With dynamic_sampling (DAPO), groups
        whose rewards have no spread (they give no policy gradient) are dropped and `more(k)` samples k more
        prompts, at most dynamic_sampling_max_rounds times; surplus groups are left out, and a batch still short
        after the last round is filled with groups without spread (as if dynamic sampling were off for them).
        Reward metrics describe every group sampled this step; `sampling/*` counts what was dropped."""
        a, B = self.args, self.args.prompts_per_step
        batch, rounds = GRPOBatch.cat([b for b, _ in parts]), 0
        keep = list(range(len(batch.rows)))
        while a.dynamic_sampling:
            keep = self._spread_groups(batch)
            if len(keep) >= B or rounds == a.dynamic_sampling_max_rounds:
                break
            rounds += 1
            new = more(B - len(keep))
            parts, batch = parts + new, GRPOBatch.cat([batch] + [b for b, _ in new])
        metrics = merge_reward_metrics(self.reward_funcs, [m for _, m in parts], batch.rewards_per_func)
        self._check_failures(metrics)
        metrics.update(tool_metrics(batch.episodes) if batch.episodes is not None else {})
        ok = batch.rewards[torch.isfinite(batch.rewards)]
        metrics.update({"reward/mean": ok.mean().item() if len(ok) else float("nan"),
                        "reward/std": ok.std().item() if len(ok) > 1 else float("nan"),
                        "reward/excluded_frac": 1 - len(ok) / len(batch.rewards)})
        batch, kept = self.keep_groups(batch, keep, rounds)
        metrics.update(kept)
        if batch.steps is not None:
            metrics.update(step_metrics(batch.steps))
        if algos.is_process(a.advantage_estimator) and batch.steps is not None:
            advantages, adv_metrics = self.process_advantages(batch)                  # [N,T]
            batch.set_token_advantages(advantages)
        elif algos.is_turn_level(a.advantage_estimator) and batch.episodes is not None:
            advantages, adv_metrics = self.turn_advantages(batch)                     # [N,T]
            batch.set_token_advantages(advantages)
        else:
            advantages, adv_metrics = algos.compute_advantages(a.advantage_estimator, self.objective(batch),
                                                               a.num_generations)    # [N]
            batch.set_advantages(advantages)
        return batch, {**metrics, **adv_metrics}

    def keep_groups(self, batch: GRPOBatch, spread: list[int], rounds: int) -> tuple[GRPOBatch, dict[str, float]]:
        """What becomes of groups whose rewards barely differ, in one place. With dynamic_sampling: the first B groups
        with spread (`spread`, after `rounds` extra rounds), filled with groups without it when short. Then, with
        keep_groups_by_std < 1, that share of the groups, those whose rewards spread most (algos.top_std_groups).
        A group left out takes no part in the update, its KL term included; `sampling/*` counts them. Last, with
        replay_buffer_size, each group left without spread is replaced by a past one (replay.ReplayBuffer)."""
        a, B, metrics = self.args, self.args.prompts_per_step, {}
        if a.dynamic_sampling:
            kept = set(spread)
            chosen = (spread + [g for g in range(len(batch.rows)) if g not in kept])[:B]
            metrics.update({"sampling/dropped_groups": float(len(batch.rows) - B), "sampling/rounds": float(rounds),
                            "sampling/groups": float(min(len(spread), B))})
            batch = batch.groups(chosen)
        if a.keep_groups_by_std < 1:
            top = algos.top_std_groups(batch.rewards, batch.group_size, a.keep_groups_by_std).tolist()
            metrics["sampling/std_filtered_groups"] = float(len(batch.rows) - len(top))
            batch = batch.groups(top)
        if self.replay is not None:  # TRL's GRPOWithReplayBuffer
            batch, replayed = self.replay.replace_flat_groups(batch, self.generator)
            metrics.update({"sampling/replayed_groups": float(replayed),
                            "sampling/replay_size": float(len(self.replay))})
        return batch, metrics

    def objective(self, batch: GRPOBatch) -> Tensor:
        """The reward [N] the advantage estimator normalises: the weighted sum of the functions' rewards, each as it is
        or normalised within its group first (multi_objective_aggregation, algos.OBJECTIVES)."""
        rpf = algos.get_objectives(self.args.multi_objective_aggregation)(batch.rewards_per_func, batch.group_size)
        return self.combine(rpf)                                                      # [N]

    def process_advantages(self, batch: GRPOBatch) -> tuple[Tensor, dict[str, float]]:
        """Token advantages [N,T] by process supervision: each usable step's score times its function's weight, and
        the outcome (the weighted sum of the functions that gave a number) as a step on the last model token."""
        steps = [(i, tok, float(score) * float(self.reward_weights[j])) for i, seq in enumerate(batch.steps)
                 for _, tok, j, score in seq if score == score]                     # NaN scores left out
        seq, tok, score = (torch.tensor([x[k] for x in steps], dtype=torch.long if k < 2 else torch.float32)
                           for k in range(3))                                       # [S] each
        outcome = self.combine(batch.rewards_per_func, batch.steps, outcome_only=True)  # [N]
        last = torch.tensor([int(m.nonzero().max()) if m.any() else 0 for m in batch.loss_mask])  # [N]
        length = max(1, max(len(c) for c in batch.completion_ids))
        return algos.process_advantages(outcome, last, seq, tok, score, length, batch.group_size)

    def turn_advantages(self, batch: GRPOBatch) -> tuple[Tensor, dict[str, float]]:
        """GiGPO's token advantages [N,T] (algos.gigpo_advantages) on an agent's episodes: each model turn a step whose
        reward is what reward functions gave that turn (one score per model turn, weighted) and, on the episode's last
        turn, its outcome (the weighted sum of the functions that gave it a number); its anchor, `turn_anchors`."""
        outcome = self.combine(batch.rewards_per_func, batch.steps, outcome_only=True)  # [N]
        rows, anchors = [], {}
        for i, episode in enumerate(batch.episodes):
            turns = [t for t in episode["turns"] if t["role"] == "assistant"]
            reward = [0.0] * len(turns)
            ends = {max(t["end"] - 1, 0): k for k, t in enumerate(turns)}
            for _, tok, j, score in (batch.steps[i] if batch.steps is not None else []):
                reward[ends[tok]] += float(score) * float(self.reward_weights[j])  # NaN: no return, A_S 0
            # NaN outcome: no outcome function gave a number (an excluded episode gets no returns in gigpo_advantages)
            reward[-1] += float(outcome[i]) if torch.isfinite(outcome[i]) else 0.0
            for t, r, key in zip(turns, reward, turn_anchors(episode)):
                rows.append((i, r, anchors.setdefault(key, len(anchors)), t["start"], t["end"]))
        episode_of, reward, anchor, start, end = (torch.tensor([row[k] for row in rows]) for k in range(5))  # [S]
        length = max(1, max(len(c) for c in batch.completion_ids))
        return algos.gigpo_advantages(batch.rewards, episode_of, reward.float(), anchor, start, end, length,
                                      batch.group_size)

    def _spread_groups(self, batch: GRPOBatch) -> list[int]:
        """Groups with at least two rewards that differ: the ones that carry a learning signal."""
        g = algos.group_stats(batch.rewards, batch.group_size)
        return ((g.count.squeeze(-1) >= 2) & (g.std.squeeze(-1) > 0)).nonzero().squeeze(-1).tolist()

    def _check_failures(self, metrics: dict[str, float]) -> None:
        """A reward function that fails step after step is a bug, not noise: stop instead of training on nothing."""
        from ..rewards.scoring import NoUsableValue
        for name in self.fail_streak:
            self.fail_streak[name] = self.fail_streak[name] + 1 if metrics[f"reward/{name}/failed"] else 0
            if self.args.reward_fail_steps and self.fail_streak[name] >= self.args.reward_fail_steps:
                last = self.failures.get(name)  # an exit (SystemExit, KeyboardInterrupt) from a reward: a raise
                what = "gave no usable value" if isinstance(last, NoUsableValue) else "raised or timed out"
                raise RuntimeError(f"reward function {name} {what} on {self.fail_streak[name]} consecutive steps "
                                   f"(last: {last!r}); fix it, or set reward_fail_steps=0 to train on without it"
                                   ) from last

    def combine(self, rpf: Tensor, steps: list[list] | None = None, outcome_only: bool = False) -> Tensor:
        """Weighted sum over functions, NaN ignored; NaN only when no function gave a value. `outcome_only`: over
        the functions that gave a completion a number, not steps (process supervision counts those step by step)."""
        if outcome_only and steps is not None:
            rpf = rpf.clone()
            for i, seq in enumerate(steps):
                rpf[i, [j for _, _, j, _ in seq]] = float("nan")
        return combine_rewards(rpf, self.reward_weights)


def combine_rewards(rpf: Tensor, weights: Tensor) -> Tensor:
    """The one way rewards [N, F] become one per completion [N] (training, rejection sampling): the weighted sum
    over the functions that gave a value (NaN: none, left out); NaN only when no function gave one.
    Example: [[1, nan], [nan, nan]] with weights [2, 1] -> [2, nan]."""
    finite = torch.isfinite(rpf)                                                     # [N,F]
    total = (torch.where(finite, rpf, torch.zeros_like(rpf)) * weights).sum(-1)      # [N]
    return torch.where(finite.any(-1), total, torch.full_like(total, float("nan")))  # [N]


def with_tokens(tokenizer, completion_ids: list[int], steps: list[tuple], turn_ends: list[int] | None = None
                ) -> list[tuple]:
    """Step rewards (end, score, function) with the token each ends on: (end, token, function, score). An end is a
    character of the text, or a model turn (TurnEnd: its last model token, `turn_ends`; its end then the characters
    up to that token)."""
    chars = iter(step_tokens(tokenizer, completion_ids, [end for end, _, _ in steps if not isinstance(end, TurnEnd)]))
    out = []
    for end, score, j in steps:
        if isinstance(end, TurnEnd):
            tok = turn_ends[end]
            end = len(tokenizer.decode(completion_ids[:tok + 1], skip_special_tokens=True))
        else:
            tok = next(chars)
        out.append((end, tok, j, score))
    return out


def turn_anchors(episode: dict) -> list[str]:
    """What each model turn of an episode acts from (gigpo's anchor state), as a key: with the environment's state
    key (`state_key()`, read before the turn), that key, the prompt and the tool results the episode has read so
    far; without one, the prompt and everything before the turn (each earlier turn's text and its results). Turns
    of one group with equal keys form a step group."""
    states, k, read, before, out = episode.get("states"), 0, [], [], []
    for turn in episode["turns"]:
        if turn["role"] == "assistant":
            out.append(repr((episode["prompt"], states[k], read) if states else (episode["prompt"], before)))
            k, before = k + 1, before + [turn["text"]]
        else:
            results = [c["content"] for c in turn["calls"]]
            read, before = read + [results], before + [results]
    return out


def last_model_tokens(episode: dict) -> list[int]:
    """The index of each model turn's last token in an episode's completion (a turn cut to nothing: the token
    before it)."""
    return [max(t["end"] - 1, 0) for t in episode["turns"] if t["role"] == "assistant"]


def step_metrics(steps: list[list[tuple]]) -> dict[str, float]:
    """process/*: usable step rewards per completion, their mean score, and the share of the steps given a usable
    score (the others: NaN, inf or not a number)."""
    scores = [score for seq in steps for *_, score in seq]
    usable = [x for x in scores if x == x]
    return {"process/steps_per_completion": len(usable) / len(steps),
            "process/step_reward_mean": sum(usable) / len(usable) if usable else float("nan"),
            "process/scored_frac": len(usable) / len(scores) if scores else float("nan")}


def episode_inputs(out: Rollout) -> dict | None:
    """What reward functions read of an agent's episodes, as TRL passes it: each episode's prompt (after its
    environment's reset), its turns as chat messages, and its environment; and aha's `episodes`: how each ended
    (finish: stop, length or tool_limit), its tool calls and their outcomes, and whether its environment was retired
    (a call ran past tool_timeout: its state is not read; aha.rewards.episode reads these)."""
    if out.episodes is None:
        return None
    return {"prompts": [e["prompt"] for e in out.episodes], "completions": [e["messages"] for e in out.episodes],
            "environments": out.environments,
            "episodes": [{k: e[k] for k in ("finish", "calls", "outcomes", "environment_retired")}
                         for e in out.episodes]}


def tool_metrics(episodes: list[dict]) -> dict[str, float]:
    """tools/*: calls and model turns per episode, tokens the model and the tools wrote per episode, failed calls
    (`tools/errors`: every outcome but ok and timeout; each also under its own name) and calls cut at tool_timeout,
    the share of failed calls (TRL's tools/failure_frequency), results cut to the budget before tokenizing,
    environments retired after a timed-out call (replaced by fresh ones), and how episodes ended."""
    n = len(episodes)
    outcomes = {k: float(sum(e["outcomes"].get(k, 0) for e in episodes)) for k in OUTCOMES}
    calls = sum(outcomes.values())
    errors = calls - outcomes["ok"] - outcomes["timeout"]
    metrics = {"tools/calls_per_episode": calls / n,
               "tools/turns": sum(sum(t["role"] == "assistant" for t in e["turns"]) for e in episodes) / n,
               "tools/model_tokens_per_episode": sum(e["model_tokens"] for e in episodes) / n,
               "tools/env_tokens_per_episode": sum(e["env_tokens"] for e in episodes) / n,
               "tools/errors": errors, "tools/timeouts": outcomes["timeout"],
               "tools/failure_frequency": (errors + outcomes["timeout"]) / calls if calls else 0.0,
               "tools/non_string": float(sum(e["non_string"] for e in episodes)),
               "tools/truncated_results": float(sum(e["truncated_results"] for e in episodes)),
               "tools/environments_replaced": float(sum(e["environment_retired"] for e in episodes))}
    metrics.update({f"tools/{k}": v for k, v in outcomes.items() if k not in ("ok", "timeout")})
    metrics.update({f"tools/finish_{k}_frac": sum(e["finish"] == k for e in episodes) / n
                    for k in ("stop", "length", "tool_limit")})
    return metrics


def reads_environments(fn: Callable) -> bool:
    """Whether a reward function reads the episodes' environments: an environment's get_reward, or a function with
    an `environments` parameter. (Every function gets `environments` in one process, as in TRL; on Ray only these
    run where the environments live, and one that reads them from **kwargs elsewhere is told they are missing.)"""
    try:
        return "environments" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def score_rollout(reward_funcs: list[Callable], rows: list[dict], out: Rollout, texts: list[str], state,
                  timeout_s: float) -> dict:
    """Rewards [N, F] of `reward_funcs` on a rollout, their metrics and failures (name -> repr), as a Ray worker
    returns them."""
    n = len(out.completion_ids) // len(rows)
    steps, failures = [], {}
    rewards, metrics = score_groups(reward_funcs, rows, texts, n, out.completion_ids, state, timeout_s,
                                    episode_inputs(out), steps_out=steps, failures_out=failures)  # [N,F]
    return {"rewards": rewards, "metrics": metrics, "steps": steps,
            "failures": {name: repr(error) for name, error in failures.items()}}
