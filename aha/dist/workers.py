"""The Ray actors, each a thin wrapper over a box that also runs in one process: the experience box's
`Generation` (rollout worker), `score_groups` (reward worker) and the driver's learner class (one data-parallel
rank). Plain classes: aha.dist.cluster turns them into actors, so importing this module needs no Ray."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch

from ..models.load import autocast, seed_everything
from ..rollout.experience import Generation, score_rollout
from ..batch import GRPOBatch


def fully_shard(module) -> None:
    """FSDP2 over the learners' group: each decoder layer its own unit, then the rest; gradients summed, not
    averaged, across ranks (each rank's loss already carries the whole minibatch's denominator)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import fully_shard as shard
    lm = module.get_base_model() if hasattr(module, "get_base_model") else module
    for layer in lm.get_decoder().layers:
        shard(layer)
    shard(module)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum


def load_trainable(model, state: dict[str, torch.Tensor]) -> int:
    """Copy `state` (trainable parameters by name) into `model`; returns the bytes received."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)
    return sum(v.numel() * v.element_size() for v in state.values())


class Identity:
    """What tests and the driver ask any worker: its process and its Ray node."""

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()


def use_threads(args) -> None:
    """The config's torch thread count (Ray already gives each 1-CPU actor one thread by default)."""
    if args.threads:
        torch.set_num_threads(args.threads)


class RolloutWorker(Identity):
    """A policy copy and the experience box's Generation (its engine, and an agent's turn loop and environments).
    Generates whole groups with the weights of one version (a call that asks for a newer version first loads it
    from the object store), and reports that version, each token's behaviour log-prob (when asked) and the time it
    was busy. The reward functions that read the environments (`env_rewards`) score the episodes here, where the
    environments live; the environments themselves never leave."""

    def __init__(self, model, tokenizer, engine_factory, args, agent=None, env_rewards: list | None = None):
        use_threads(args)
        self.model, self.args, self.env_rewards = model.eval(), args, env_rewards or []
        self.generation = Generation(model, tokenizer, args, engine_factory, agent)

    def generate(self, rows: list[dict], prompt_ids: list[list[int]], seed: int, weights: tuple, state=None) -> dict:
        """G completions (episodes) of each prompt. `weights` is (version, [ObjectRef of the trainable state, or
        None]); `state` the TrainerState the environment-side reward functions get."""
        import ray
        t0, (version, (ref,)), received = time.perf_counter(), weights, 0
        engine = self.generation.engine
        if version != engine.version:
            if ref is not None:
                received = load_trainable(self.model, ray.get(ref, timeout=self.args.dist_timeout))
            engine.update_weights(self.model, version)
        t1 = time.perf_counter()
        with autocast(self.args, self.model):
            out, texts = self.generation.run(rows, prompt_ids, torch.Generator().manual_seed(seed))
        scores = (score_rollout(self.env_rewards, rows, out, texts, state, self.args.reward_timeout)
                  if self.env_rewards else None)
        out.environments = None
        return {"env_scores": scores, "rollout": out, "texts": texts, "sync_s": t1 - t0, "sync_bytes": received,
                "busy_s": time.perf_counter() - t0}


class RewardWorker(Identity):
    """The reward functions, run on groups as their rollouts arrive; each call has the wall-clock limit."""

    def __init__(self, reward_funcs: list, timeout_s: float):
        self.reward_funcs, self.timeout_s = reward_funcs, timeout_s

    def score(self, generated: dict, rows: list[dict], state) -> dict:
        t0 = time.perf_counter()
        scored = score_rollout(self.reward_funcs, rows, generated["rollout"], generated["texts"], state, self.timeout_s)
        return {**scored, "busy_s": time.perf_counter() - t0}


class LearnerWorker(Identity):
    """One rank of data-parallel training: a learner of the driver's class (aha.train.learner.Learner) in a
    torch.distributed (gloo) group."""

    def __init__(self, args, model, pad_id: int, total_steps: int, learner_type: type):
        use_threads(args)
        self.args, self.model, self.pad_id, self.total_steps = args, model, pad_id, total_steps
        self.learner_type, self.learner = learner_type, None
        self._listener: socket.socket | None = None                  # rank 0's rendezvous socket

    def endpoint(self) -> str:
        """host:port where rank 0 serves the group's rendezvous store: a socket bound to this node's address
        (the store, left to bind itself, would listen on every interface)."""
        import ray
        self._listener = socket.create_server((ray.util.get_node_ip_address(), 0))
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def join(self, address: str, rank: int, world: int) -> int:
        host, port = address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.args.dist_timeout)
        store = torch.distributed.TCPStore(host, int(port), world, rank == 0, timeout, wait_for_workers=False,
                                           master_listen_fd=self._listener.fileno() if rank == 0 else None)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        seed_everything(self.args.seed)
        self.learner = self.learner_type(self.args, self.model, self.pad_id,
                                         torch.Generator().manual_seed(self.args.seed), self.total_steps,
                                         shard=fully_shard if self.args.learner_sharding == "fsdp" else None)
        return rank

    def update(self, batch: GRPOBatch) -> tuple:
        t0 = time.perf_counter()
        with autocast(self.args, self.model):
            sums, metrics = self.learner.update(batch)
        metrics["lr"] = self.learner.scheduler.get_last_lr()[0]
        return sums, metrics, time.perf_counter() - t0

    def local_elements(self) -> int:
        """Parameter elements this rank holds (all of them, or its FSDP shards)."""
        return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in self.learner.model.parameters())

    def weights(self) -> dict | None:
        """Every rank is called (sharded weights are gathered together); rank 0 answers."""
        state = self.learner.trainable_state()
        return state if torch.distributed.get_rank() == 0 else None

    def state(self) -> dict | None:
        state = self.learner.state()
        return state if torch.distributed.get_rank() == 0 else None

    def load_state(self, state: dict) -> None:
        self.learner.load_state(state)

    def leave(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
