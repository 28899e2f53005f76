"""The driver of the Ray layer: a scheduler that keeps rollout workers busy, a replay queue of whole groups
that bounds how stale a trained batch may be, reward workers scoring as rollouts land, learners, and
weight sync. It is built from the experience box (aha.rollout.experience.Experience: prompts, generation,
scoring, assembly) and the learner (its settings and, for remote ranks, its class), never from the trainer,
and answers the trainer's loop as an Experience and a Learner do: next_batch, update, publish, pull, close.

Staleness. Weights after t GRPO steps are version t. The batch trained at step t is requested when
version t - max_staleness is the newest, so its groups lag at most max_staleness versions (checked on
every result; a violation is re-issued, never trained on). Stale tokens get the behaviour weight of
`algos.behaviour_weights` in the learner.

Faults. A rollout or reward worker that dies is restarted by Ray (max_worker_restarts) and its chunk is
re-issued; the restarted worker loads the current weights before it samples. A learner that dies fails
the run with its rank named. Every wait has dist_timeout.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..rollout.experience import score_rollout
from . import cluster
from .workers import LearnerWorker, RewardWorker, RolloutWorker

log = logging.getLogger("aha.dist")


@dataclass
class Chunk:
    """Whole groups requested from one rollout worker (and scored by one reward worker)."""

    step: int                         # the step that will train on them
    idx: list[int]                    # prompt indices (the sampler's)
    rows: list[dict]                  # their dataset rows
    prompt_ids: list[list[int]]
    seed: int                         # sampling seed: a re-issued chunk samples the same way
    worker: int
    gen: object = None                # ObjectRef of the worker's result
    score: object = None              # ObjectRef of the reward worker's result, or None (scored here)
    reissued: int = 0


@dataclass
class StepRequest:
    chunks: list[Chunk]
    sampler_before: dict              # the sampler's position before these prompts were drawn
    submitted: float = field(default_factory=time.perf_counter)


class Pipeline:
    """Rollout workers, reward workers, learners and the scheduler between them (see the module doc)."""

    def __init__(self, experience, learner):
        self.x, self.learner, self.a = experience, learner, experience.args
        self.rollout, self.reward, self.learners, self.group = [], [], [], None
        self.weights = (0, [None])    # (version, [ObjectRef]): version 0 is what every worker was built with
        self.version = 0
        self.stale = False            # the driver's model is behind the remote learners
        self.pending: deque[StepRequest] = deque()
        self.busy = {"rollout": 0.0, "reward": 0.0, "learner": 0.0, "sync_s": 0.0, "sync_bytes": 0.0}
        self.reissued = 0
        self.clock = time.perf_counter()
        self.started_ray = cluster.connect(self.a.ray_address, self._bundles(), self.a.dist_timeout)
        try:
            self._start_workers()
        except BaseException:  # nothing half-started outlives a failed set-up
            self.close()
            raise

    def _bundles(self) -> int:
        a = self.a
        return a.num_rollout_workers + a.num_reward_workers + (a.num_learners if a.num_learners > 1 else 0)

    def _start_workers(self) -> None:
        import ray
        x, a = self.x, self.a
        R, W, L = a.num_rollout_workers, a.num_reward_workers, a.num_learners if a.num_learners > 1 else 0
        self.group = cluster.placement(self._bundles(), a.placement_strategy, a.dist_timeout)
        self.model_ref = model = ray.put(x.model)  # kept: Ray rebuilds a restarted actor from it
        beside = [x.reward_funcs[i] for i in x.beside_environments]
        self.rollout = [cluster.actor(RolloutWorker, self.group, i, a.max_worker_restarts).remote(
            model, x.tokenizer, x.generation.engine_factory, a, x.generation.agent, beside) for i in range(R)]
        self.reward = [cluster.actor(RewardWorker, self.group, R + i, a.max_worker_restarts).remote(
            [x.reward_funcs[i] for i in x.elsewhere], a.reward_timeout) for i in range(W)]
        self.learners = [cluster.actor(LearnerWorker, self.group, R + W + i, 0).remote(
            a, model, x.tokenizer.pad_token_id, self.learner.total_steps, type(self.learner)) for i in range(L)]
        self._join_learners()

    def _join_learners(self) -> None:
        if not self.learners:
            return
        address = cluster.get(self.learners[0].endpoint.remote(), self.a.dist_timeout, "learner rank 0")
        world = len(self.learners)
        self._wait_learners([w.join.remote(address, r, world) for r, w in enumerate(self.learners)])

    # ------------------------------------------------------------------ sampling
    def fill(self, step: int) -> None:
        """Keep steps `step` .. step + max_staleness requested (the oldest is trained next)."""
        while len(self.pending) <= self.a.max_staleness and step + len(self.pending) < self.x.max_steps:
            before = self.x.sampler_state()
            rows, ids = self.x.prompts.take(self.a.prompts_per_step)
            self.pending.append(StepRequest(self._submit(rows, ids, step + len(self.pending), 0), before))

    def sampler_state(self) -> dict:
        """Where a resumed run should draw from: before the prompts of steps still in flight."""
        return self.pending[0].sampler_before if self.pending else self.x.sampler_state()

    def _submit(self, rows: list[dict], ids: list[list[int]], step: int, round_: int) -> list[Chunk]:
        idx = list(range(len(rows)))
        parts = max(1, min(len(idx), len(self.rollout) or 1))
        bounds = [round(k * len(idx) / parts) for k in range(parts + 1)]
        chunks = [Chunk(step, idx[lo:hi], rows[lo:hi], ids[lo:hi], hash((self.a.seed, step, round_, k)) & (2**62 - 1), k)
                  for k, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]
        for c in chunks:
            self._issue(c)
        return chunks

    def _issue(self, c: Chunk, generate: bool = True) -> None:
        import ray
        state = self.x.trainer_state(c.step)
        if generate and self.rollout:
            c.gen = self.rollout[c.worker].generate.remote(c.rows, c.prompt_ids, c.seed, self.weights, state)
        elif generate:  # no rollout workers: generate here, with the driver's (current) weights and environments
            self.pull()
            t0 = time.perf_counter()
            out, texts = self.x.generation.run(c.rows, c.prompt_ids, torch.Generator().manual_seed(c.seed))
            beside = [self.x.reward_funcs[i] for i in self.x.beside_environments]
            scores = score_rollout(beside, c.rows, out, texts, state, self.a.reward_timeout) if beside else None
            out.environments = None
            c.gen = ray.put({"rollout": out, "texts": texts, "env_scores": scores, "sync_s": 0.0, "sync_bytes": 0,
                             "busy_s": time.perf_counter() - t0})
        c.score = self.reward[c.worker % len(self.reward)].score.remote(c.gen, c.rows, state) if self.reward else None

    def _collect(self, c: Chunk):
        """The chunk's scored GRPOBatch; a dead worker's chunk (or one sampled too stale) is re-issued."""
        while True:
            try:
                gen = cluster.get(c.gen, self.a.dist_timeout, f"rollout worker {c.worker}")
            except Exception as e:  # noqa: BLE001 - only a dead worker is retried
                self._retry(c, e, self.rollout[c.worker] if self.rollout else None, f"rollout worker {c.worker}")
                continue
            out = gen["rollout"]
            if out.version < c.step - self.a.max_staleness:  # a restarted worker that sampled before it synced
                self._retry(c, None, None, f"rollout worker {c.worker} (version {out.version} for step {c.step})")
                continue
            try:
                scored = cluster.get(c.score, self.a.dist_timeout, "reward worker") if c.score is not None else None
            except Exception as e:  # noqa: BLE001
                k = c.worker % len(self.reward)
                self._retry(c, e, self.reward[k], f"reward worker {k}", generate=False)
                continue
            break
        self.busy["rollout"] += gen["busy_s"]
        self.busy["sync_s"] += gen["sync_s"]
        self.busy["sync_bytes"] += gen["sync_bytes"]
        if scored is None and gen["env_scores"] is None:
            return self.x.score(c.rows, c.prompt_ids, out, gen["texts"], c.step)
        if scored is None:  # no reward workers: the functions that need no environment are scored here
            scored = score_rollout([self.x.reward_funcs[i] for i in self.x.elsewhere], c.rows, out, gen["texts"],
                                   self.x.trainer_state(c.step), self.a.reward_timeout)
        self.busy["reward"] += scored.get("busy_s", 0.0)
        parts = [(self.x.elsewhere, scored)] + ([(self.x.beside_environments, gen["env_scores"])]
                                                if gen["env_scores"] is not None else [])
        return self.x.from_parts(c.rows, c.prompt_ids, out, gen["texts"], parts)

    def _retry(self, c: Chunk, error: BaseException | None, worker, what: str, generate: bool = True) -> None:
        """Re-issue a chunk whose worker died (once Ray has restarted it) or that came back too stale."""
        if error is not None and not cluster.died(error):
            raise error
        if c.reissued >= self.a.max_worker_restarts + 1:
            raise RuntimeError(f"{what} failed {c.reissued + 1} times on the same prompts; giving up") from error
        log.warning("%s: %s; re-issuing %d groups", what, "died" if error else "stale result", len(c.idx))
        if worker is not None and error is not None:
            cluster.wait_alive(worker, self.a.dist_timeout, what)
        c.reissued += 1
        self.reissued += len(c.idx)
        self._issue(c, generate)

    def next_batch(self, step: int):
        """Step `step`'s groups (the oldest requested), scored, assembled (dynamic sampling), with the Ray metrics."""
        self.fill(step)
        t0 = time.perf_counter()
        request = self.pending.popleft()
        parts = [self._collect(c) for c in request.chunks]
        more_rounds = [0]

        def more(k: int):
            more_rounds[0] += 1
            return [self._collect(c) for c in self._submit(*self.x.prompts.take(k), step, more_rounds[0])]
        batch, metrics = self.x.assemble(parts, more)
        lag = (step - batch.versions).float()                                       # [N]
        metrics.update({"perf/generate_s": time.perf_counter() - t0, "dist/staleness_mean": lag.mean().item(),
                        "dist/staleness_max": lag.max().item(), "dist/groups_trained": float(len(batch.rows)),
                        "dist/groups_reissued": float(self.reissued)})
        self.reissued = 0
        return batch, metrics

    # ------------------------------------------------------------------ learning and weights
    def update(self, batch):
        t0 = time.perf_counter()
        if not self.learners:
            sums, metrics = self.learner.update(batch)
            self.busy["learner"] += time.perf_counter() - t0
            return sums, metrics
        import ray
        ref = ray.put(batch)
        results = self._wait_learners([w.update.remote(ref) for w in self.learners])
        self.busy["learner"] += sum(r[2] for r in results) / len(results)
        self.stale = True
        return results[0][0], results[0][1]

    def _wait_learners(self, refs: list) -> list:
        """Every rank's result; a dead rank fails the run by name (the others are stopped at close)."""
        import ray
        deadline, done = time.monotonic() + self.a.dist_timeout, {}
        while len(done) < len(refs):
            ready, _ = ray.wait([r for r in refs if r not in done], num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                missing = [i for i, r in enumerate(refs) if r not in done]
                raise TimeoutError(f"learner rank(s) {missing} did not answer within {self.a.dist_timeout:.0f} s")
            rank = refs.index(ready[0])
            try:
                done[ready[0]] = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001
                reason = "died" if cluster.died(e) else "failed"
                raise RuntimeError(f"learner rank {rank} {reason}: {type(e).__name__}: "
                                   f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
        return [done[r] for r in refs]

    def publish(self, version: int) -> dict[str, float]:
        """The new weights (version `version`: the steps trained) to the rollout workers (through the object store,
        tagged with their version), the next steps requested with them, and this step's pipeline metrics."""
        import ray
        self.version = version
        if self.learners:
            self.weights = (version, [[w.weights.remote() for w in self.learners][0]])
        else:
            self.weights = (version, [ray.put(self.learner.trainable_state())] if self.rollout else [None])
            self.x.publish(version)
        self.fill(version)
        now = time.perf_counter()
        wall, b = max(now - self.clock, 1e-9), self.busy
        metrics = {"dist/rollout_busy": b["rollout"] / wall / max(len(self.rollout), 1),
                   "dist/reward_busy": b["reward"] / wall / max(len(self.reward), 1),
                   "dist/learner_busy": b["learner"] / wall,
                   "sync/seconds": b["sync_s"], "sync/bytes": b["sync_bytes"]}
        self.busy, self.clock = dict.fromkeys(b, 0.0), now
        return metrics

    def pull(self) -> None:
        """The remote learners' weights, optimizer and schedule into the driver's copy (for eval and checkpoints)."""
        if self.learners and self.stale:  # every rank takes part (sharded state is gathered); rank 0 answers
            self.learner.load_state(self._wait_learners([w.state.remote() for w in self.learners])[0])
            self.x.publish(self.version)
            self.stale = False

    def restored(self, version: int) -> None:
        """After a resume at `version` (steps trained): learners and workers continue from the driver's state."""
        import ray
        self.version = version
        self.x.restored(version)
        if self.learners:
            state = ray.put(self.learner.state())
            self._wait_learners([w.load_state.remote(state) for w in self.learners])
        self.weights = (version, [ray.put(self.learner.trainable_state())])
        self.pending.clear()

    def close(self) -> None:
        """Bring the final weights home, end every actor and the placement group (and Ray, if started here)."""
        import ray
        try:
            self.pull()
        except Exception as e:  # noqa: BLE001 - a failed run is being reported already
            log.warning("could not fetch the learners' final state: %s", e)
        for handle in self.rollout + self.reward + self.learners:
            ray.kill(handle, no_restart=True)
        self.rollout, self.reward, self.learners, self.pending = [], [], [], deque()
        if self.group is not None:
            ray.util.remove_placement_group(self.group)
            self.group = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False
