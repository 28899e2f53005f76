"""aha: GRPO on verifiable rewards."""
