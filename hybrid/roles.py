"""Which worker groups a run needs and where they run.

One resource pool of `trainer.nnodes x trainer.n_gpus_per_node` slots holds every group:
the fused actor-rollout(-ref) worker, and the critic and reward model colocated on the
same slots. `trainer.worker_group` picks Ray actors (`ray`), the driver's own process
(`local`, one slot only), or `auto`: local for a single slot, Ray otherwise.

`config` is the typed `HybridConfig`; each worker gets its own section only.
"""

from __future__ import annotations

import logging
import os

from hybrid.controller.local_worker_group import LocalWorkerGroup
from hybrid.placement import check_gpus_fit, gpu_asks, node_gpus, uses_gpus
from workers.device import cuda_forced_off, is_cuda_available
from workers.engine_logs import drop_harmless_warnings
from workers.roles import Role


def wants_ray(config) -> bool:
    choice = config.trainer.worker_group
    if choice == "local":
        if config.world_size != 1:
            raise ValueError(
                f"trainer.worker_group=local runs one rank, but trainer.nnodes x trainer.n_gpus_per_node = "
                f"{config.world_size}; use trainer.worker_group=ray or set both to 1"
            )
        if config.reward_model.use_reward_loop:
            raise ValueError(
                "trainer.worker_group=local: the reward loop's workers are Ray actors; use trainer.worker_group=ray "
                "(or auto) or reward_model.use_reward_loop=false"
            )
        return False
    # Asynchronous training runs the engines in Ray actors beside the training group.
    # So do the reward loop's workers.
    return (
        choice == "ray" or config.world_size > 1 or config.async_mode is not None or config.reward_model.use_reward_loop
    )


# Ray logs its notice that a local cluster uses token authentication here (an understood,
# harmless notice: workers/engine_logs.HARMLESS_WARNINGS).
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def worker_env(config) -> dict[str, str]:
    """trainer.worker_env_vars as environment strings (ROLL's system_envs)."""
    return {str(name): str(value) for name, value in config.trainer.worker_env_vars.items()}


def init_ray_if_needed(config) -> None:
    import ray

    if ray.is_initialized():
        return
    drop_harmless_warnings(logging.getLogger(RAY_AUTH_LOGGER))
    env = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for name in ("HYBRID_CACHE_DIR", "HYBRID_DEVICE"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    env.update(worker_env(config))  # trainer.worker_env_vars: every Ray worker gets them
    kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "logging_level": "WARNING"}
    # A cluster started with `ray start` (RAY_ADDRESS set) owns its resources. A one-node run
    # on the host starts a private cluster with at least one CPU slot per rank, even when
    # another run's cluster is up on this machine (ray.init would join that one, and refuse
    # num_cpus there).
    if not os.environ.get("RAY_ADDRESS") and not is_cuda_available() and config.trainer.nnodes == 1:
        kwargs["address"] = "local"
        kwargs["num_cpus"] = max(os.cpu_count() or 1, config.world_size)
    ray.init(**kwargs)


def ray_uses_gpus(config) -> bool:
    """Whether this run's Ray actors ask for GPUs: from the cluster's nodes and the config
    (hybrid/placement.py), not from the driver's own device; a cluster with fewer GPUs than
    the run asks for is refused here, in one line."""
    import ray

    gpus_per_node = node_gpus(ray.nodes())
    gpu = uses_gpus(gpus_per_node, cuda_forced_off(), config.trainer.device)
    if gpu:
        check_gpus_fit(gpus_per_node, gpu_asks(config))
    return gpu


def cpus_per_slot_for(config) -> int:
    """CPU cores per device slot when there is no GPU: the machine's cores split over the
    training slots, and the rollout engines' slots when they have their own."""
    slots = config.trainer.n_gpus_per_node + (config.rollout.n_gpus_per_node if config.async_mode else 0)
    return max((os.cpu_count() or 1) // max(slots, 1), 1)


def _worker_specs(config) -> dict:
    """{group name: (worker class, constructor args, constructor kwargs)} for this run."""
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from workers.critic_worker import CriticWorker
    from workers.reward_model_worker import RewardModelWorker

    arr = config.actor_rollout_ref
    if config.async_mode is not None:
        # The engines live in their own actors (hybrid/engines.py): the training group holds none.
        role = Role.ACTOR_REF if config.use_reference_policy else Role.ACTOR
    else:
        role = Role.ACTOR_ROLLOUT_REF if config.use_reference_policy else Role.ACTOR_ROLLOUT
    specs = {"actor_rollout": (ActorRolloutRefWorker, (arr,), {"role": role})}
    if config.use_critic:
        specs["critic"] = (CriticWorker, (config.critic,), {})
    if config.reward_model.enable and not config.reward_model.use_reward_loop:
        specs["rm"] = (RewardModelWorker, (config.reward_model,), {})
    return specs


def build_worker_groups(config) -> dict:
    """{'actor_rollout': group, 'critic': group or None, 'rm': group or None} (and 'pool' on Ray)."""
    specs = _worker_specs(config)
    groups = {"critic": None, "rm": None}
    if not wants_ray(config):
        for name, (cls, args, kwargs) in specs.items():
            groups[name] = LocalWorkerGroup(cls, *args, name=name, **kwargs)
        return groups

    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup

    init_ray_if_needed(config)
    gpu = ray_uses_gpus(config)
    slots = config.trainer.n_gpus_per_node
    # Asynchronous training: the engines' slots share the machine's cores with the trainer's.
    cpus_per_slot = 1.0 if gpu else cpus_per_slot_for(config)
    pool = RayResourcePool(
        nnodes=config.trainer.nnodes,
        slots_per_node=slots,
        use_gpu=gpu,
        cpus_per_slot=cpus_per_slot,
        max_colocate_count=len(specs),
        wait_timeout_s=config.trainer.ray_wait_register_center_timeout,
    )
    groups["pool"] = pool
    threads = None if gpu else int(cpus_per_slot)
    for name, (cls, args, kwargs) in specs.items():
        groups[name] = RayWorkerGroup(pool, cls, *args, name=name, threads_per_rank=threads, **kwargs)
    return groups
