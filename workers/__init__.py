"""What runs on each device: the workers (fused actor-rollout-ref, critic, reward model),
the models they train, rollout engines, the weight sync, checkpoints."""
