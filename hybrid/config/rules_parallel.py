"""The rules of tensor-parallel rollout in the fused worker across keys (hybrid/config/rules.py
runs them; the engine's TP groups are workers/rollout/tensor_parallel.py's). With
`actor_rollout_ref.rollout.tensor_model_parallel_size` = t > 1 and the fused worker generating
(hybrid_engine=true, no remote engines), each TP group of t consecutive ranks runs one engine:
refused at start, one line each, are an engine without tensor parallelism (transformers'
generate), groups that would span nodes (t not dividing trainer.n_gpus_per_node), and the agent
loops (mode=async: their requests arrive as trajectories progress, while the shards of an
`external_launcher` engine must schedule the same requests in lock step). Whether t divides the
world is rules.py's; whether it fits the model's heads is checked at preflight
(hybrid/preflight_models.py), where the model's config.json is read.
"""

from __future__ import annotations

from hybrid.config.schema import HybridConfig
from protocol.config_schema import Problems, fmt, valid
from workers.rollout.engine import engine_names, engine_spec, engines_with
from workers.rollout.tensor_parallel import TP_KEY

ROLLOUT = "actor_rollout_ref.rollout"


def check_tensor_parallel(config: HybridConfig, problems: Problems) -> None:
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    if not valid(rollout, arr.hybrid_engine, rollout.tensor_model_parallel_size, rollout.name):
        return
    tp = rollout.tensor_model_parallel_size
    remote = valid(rollout.remote) and rollout.remote.enabled
    if tp == 1 or arr.hybrid_engine is not True or remote:
        return  # engines in actors of their own, or behind a server, are placed elsewhere
    if rollout.name in engine_names() and not engine_spec(rollout.name).tensor_parallel:
        problems.add(
            f"{TP_KEY}={tp}: {ROLLOUT}.name={fmt(rollout.name)} ({engine_spec(rollout.name).description}) has no "
            f"tensor parallelism; set it to 1, or {ROLLOUT}.name to {' or '.join(engines_with(tensor_parallel=True))}"
        )
    trainer = config.trainer
    if valid(trainer) and valid(trainer.n_gpus_per_node) and trainer.n_gpus_per_node % tp:
        problems.add(
            f"{TP_KEY}={tp} does not divide trainer.n_gpus_per_node={trainer.n_gpus_per_node}: an engine's shards "
            f"are consecutive ranks of one node"
        )
    if rollout.mode == "async":
        problems.add(
            f"{ROLLOUT}.mode=async with {TP_KEY}={tp}: the agent loops add requests as trajectories progress, and "
            f"the shards of a tensor-parallel engine must schedule the same requests in lock step; set "
            f"{ROLLOUT}.mode=sync (multi_turn.enable runs the lock-step loop) or {TP_KEY}=1"
        )
