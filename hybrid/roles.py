"""Which worker groups a run needs and where they run.

One resource pool of `trainer.nnodes x trainer.n_gpus_per_node` slots holds every role:
the fused actor-rollout(-ref) worker, and the critic and reward model colocated on the
same slots. `trainer.worker_group` picks Ray actors (`ray`), the driver's own process
(`local`, one slot only), or `auto`: local for a single slot, Ray otherwise.
"""

from __future__ import annotations

import os

from hybrid.controller.local_worker_group import LocalWorkerGroup
from workers.device import is_cuda_available


def use_critic(config) -> bool:
    enable = config.critic.get("enable")
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def use_reference_policy(config) -> bool:
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def world_size(config) -> int:
    return int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)


def wants_ray(config) -> bool:
    choice = config.trainer.get("worker_group", "auto")
    if choice == "local":
        if world_size(config) != 1:
            raise ValueError(
                f"trainer.worker_group=local runs one rank, but trainer.nnodes x trainer.n_gpus_per_node = "
                f"{world_size(config)}; use trainer.worker_group=ray or set both to 1"
            )
        return False
    return choice == "ray" or world_size(config) > 1


def init_ray_if_needed(config) -> None:
    import ray

    if ray.is_initialized():
        return
    env = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for name in ("HYBRID_CACHE_DIR", "HYBRID_DEVICE"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "logging_level": "WARNING"}
    # A cluster started with `ray start` (RAY_ADDRESS set) owns its resources; a private
    # one-node cluster gets at least one CPU slot per rank.
    if not os.environ.get("RAY_ADDRESS") and not is_cuda_available() and config.trainer.nnodes == 1:
        kwargs["num_cpus"] = max(os.cpu_count() or 1, world_size(config))
    ray.init(**kwargs)


def build_worker_groups(config) -> dict:
    """{'actor_rollout': group, 'critic': group or None, 'rm': group or None}."""
    from workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

    role = "actor_rollout_ref" if use_reference_policy(config) else "actor_rollout"
    groups = {"critic": None, "rm": None}
    with_critic = use_critic(config)
    with_rm = bool(config.reward_model.enable)
    if not wants_ray(config):
        groups["actor_rollout"] = LocalWorkerGroup(ActorRolloutRefWorker, config.actor_rollout_ref, role=role, name="actor_rollout")
        if with_critic:
            groups["critic"] = LocalWorkerGroup(CriticWorker, config.critic, name="critic")
        if with_rm:
            groups["rm"] = LocalWorkerGroup(RewardModelWorker, config.reward_model, name="rm")
        return groups

    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup

    init_ray_if_needed(config)
    gpu = is_cuda_available()
    slots = int(config.trainer.n_gpus_per_node)
    cpus_per_slot = 1.0 if gpu else max((os.cpu_count() or 1) // slots, 1)
    pool = RayResourcePool(
        nnodes=int(config.trainer.nnodes),
        slots_per_node=slots,
        use_gpu=gpu,
        cpus_per_slot=cpus_per_slot,
        max_colocate_count=1 + int(with_critic) + int(with_rm),
    )
    groups["pool"] = pool
    threads = None if gpu else int(cpus_per_slot)
    groups["actor_rollout"] = RayWorkerGroup(pool, ActorRolloutRefWorker, config.actor_rollout_ref, role=role, name="actor_rollout", threads_per_rank=threads)
    if with_critic:
        groups["critic"] = RayWorkerGroup(pool, CriticWorker, config.critic, name="critic", threads_per_rank=threads)
    if with_rm:
        groups["rm"] = RayWorkerGroup(pool, RewardModelWorker, config.reward_model, name="rm", threads_per_rank=threads)
    return groups
