"""What runs on each device: FSDP workers, rollout engines, sharding, checkpoints."""
