"""GRPO as a distributed system on Ray: rollout workers, reward workers, data-parallel learners
(torch.distributed) and the scheduler that joins them. Used by GRPOTrainer when a config asks for
workers (num_rollout_workers, num_reward_workers, num_learners > 1); Ray is imported only then."""

from .pipeline import Pipeline

__all__ = ["Pipeline"]
