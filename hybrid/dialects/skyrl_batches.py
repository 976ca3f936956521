"""SkyRL's policy mini batch against its data-parallel ranks: the convert of
`trainer.policy_mini_batch_size`, which says why sizes that do not split evenly are refused.

SkyRL (skyrl/train/utils/utils.py validate_batch_sizes) works per GPU with floor division:
policy_mini_batch_size x n_samples_per_prompt // dp must be a positive multiple of
micro_train_batch_size_per_gpu and divide train_batch_size x n_samples_per_prompt // dp;
sizes failing that are refused by SkyRL itself. Sizes passing it whose mini batch does not
split evenly over the ranks are trained by SkyRL with dummy rows: each mini batch is padded
with (-samples) mod dp copies of its first row with loss mask 0 and then split
(MeshDispatch.stage_chunks, pad_training_input_batch); for those sizes the convert turns on
hybrid's trainer.pad_mini_batches, which pads the same way (hybrid/batch_ops.py).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ACTOR, ROLLOUT
from hybrid.dialects.table import Context, Refusal

_GIVEN = ("generator.n_samples_per_prompt", "trainer.train_batch_size", "trainer.micro_train_batch_size_per_gpu")


def _policy_mini_batch(value: Any, ctx: Context) -> dict[str, Any]:
    out = {f"{ACTOR}.ppo_mini_batch_size": value}
    n = ctx.effective("generator.n_samples_per_prompt", f"{ROLLOUT}.n")
    train = ctx.effective("trainer.train_batch_size", "data.train_batch_size")
    micro = ctx.effective("trainer.micro_train_batch_size_per_gpu", f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    nodes = ctx.effective("trainer.placement.policy_num_nodes", "trainer.nnodes")
    gpus = ctx.effective("trainer.placement.policy_num_gpus_per_node", "trainer.n_gpus_per_node")
    sp = ctx.effective("trainer.policy.sequence_parallel_size", f"{ACTOR}.ulysses_sequence_parallel_size")
    numbers = (value, n, train, micro, nodes, gpus, sp)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in numbers):
        return out  # hybrid's own checks name a size that is not a positive whole number
    if (nodes * gpus) % sp:
        return out  # hybrid's own checks name devices that sequence parallelism does not divide
    dp = nodes * gpus // sp
    samples = value * n
    per_gpu = samples // dp
    sizes = (
        f"policy_mini_batch_size {value} x n_samples_per_prompt {n} = {samples} samples over {dp} data-parallel ranks"
    )
    # Say what SkyRL does only when the sizes it reads are SkyRL's: given, or SkyRL's defaults
    # filled in (skyrl_defaults.py); nodes and sequence parallelism default to 1 in both.
    skyrl_sizes = all(ctx.known(k) for k in (*_GIVEN, "trainer.placement.policy_num_gpus_per_node"))
    if skyrl_sizes and (per_gpu == 0 or per_gpu % micro or (train * n // dp) % per_gpu):
        raise Refusal(
            f"SkyRL's own check (validate_batch_sizes) refuses these sizes too: {sizes} is {per_gpu} per GPU "
            f"(rounded down), which must be a positive multiple of micro_train_batch_size_per_gpu {micro} and divide "
            f"train_batch_size {train} x n_samples_per_prompt {n} // {dp} = {train * n // dp}"
        )
    if skyrl_sizes and samples % dp:
        out["trainer.pad_mini_batches"] = True  # SkyRL adds -samples % dp dummy rows to each mini batch
    return out


__all__ = ["_policy_mini_batch"]
