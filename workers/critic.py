"""The PPO critic on one rank: per-token values of responses and the value update.

The value model is a causal LM body with a scalar head (transformers'
`AutoModelForTokenClassification` with one label), initialised from the actor's weights.
Values are read at the positions that predict each response token, like the actor's
log-probs. The update runs through the same optimizer step as the actor's
(workers/optimizer_step.py); this file supplies the clipped value loss of one micro-batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from protocol.data_proto import DataProto
from workers.config.batching import MicroBatching
from workers.device import current_device
from workers.losses import aggregation_spec, compute_value_loss, masked_mean
from workers.micro_batch import micro_batches, response_inputs, to_rows
from workers.optimizer_step import MiniBatchCounts, OptimizerStep, UpdatePlan, world_size
from workers.ulysses import SequenceParallel, SequenceSplit

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import CriticConfig

# The critic's section has no data_loader_seed: its shuffled mini-batches (critic.shuffle)
# use epoch e's seed 0 + e, as they always have.
CRITIC_SHUFFLE_SEED = 0


def forward_values(
    model,
    micro: dict,
    response_len: int,
    use_remove_padding: bool,
    share_prompts: bool = False,
    sp: SequenceParallel | None = None,
) -> torch.Tensor:
    """Values (B, R) at the positions predicting each response token (0 where there is none)."""
    inputs, keep, valid = response_inputs(micro, use_remove_padding or sp is not None, share_prompts)
    if valid is None:
        out = model(**inputs, use_cache=False)
        seq_len = micro["input_ids"].shape[1]
        return out.logits.squeeze(-1)[:, seq_len - response_len - 1 : seq_len - 1].float()
    split = SequenceSplit(inputs, keep, sp)  # the whole row without sequence parallelism
    out = model(**split.inputs, use_cache=False)
    return to_rows(split.gather(out.logits[0, split.keep, 0].float()), valid)


class DataParallelPPOCritic:
    """`config`: the `critic` section; `sp`: this rank's sequence-parallel group, whose
    rows it is given (workers/ulysses.py)."""

    def __init__(
        self,
        config: CriticConfig,
        module: torch.nn.Module,
        optimizer,
        lr_scheduler,
        use_remove_padding: bool,
        *,
        share_prompts: bool = False,
        sp: SequenceParallel | None = None,
    ):
        self.config = config
        self.sp = sp
        self.share_prompts = share_prompts  # packs prompt-once (workers/shared_prefix.py)
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.use_remove_padding = use_remove_padding
        self.world_size = world_size()
        self.step = OptimizerStep(module, optimizer, lr_scheduler, config.grad_clip, prefix="critic")

    def values_micro(self, micro: dict) -> torch.Tensor:
        response_len = micro["responses"].shape[1]
        values = forward_values(self.module, micro, response_len, self.use_remove_padding, self.share_prompts, self.sp)
        return values * micro["response_mask"]

    @torch.no_grad()
    def compute_values(self, data: DataProto, batching: MicroBatching) -> torch.Tensor:
        self.module.eval()
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask"]
        tensors = data.batch.select(*keys).to(current_device())
        values = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        for idx in micro_batches(data.batch, batching.for_model(self.share_prompts, self.sp), self.world_size):
            index = torch.tensor(idx)
            values[index] = self.values_micro({k: tensors[k][index] for k in keys}).cpu()
        return values

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """One value update on this rank's rows, in mini-batches of the config's samples per rank."""
        cfg = self.config
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "values", "returns"]
        plan = UpdatePlan(
            samples_per_rank=cfg.mini_batch_samples_per_rank,
            epochs=cfg.ppo_epochs,
            shuffle=cfg.shuffle,
            seed=CRITIC_SHUFFLE_SEED,
            micro=cfg.update_batching.for_model(self.share_prompts, self.sp),
            seq_level=aggregation_spec(cfg.loss_agg_mode).seq_level,
            summed=aggregation_spec(cfg.loss_agg_mode).summed,
        )
        return self.step.run(data, keys, plan, self._micro_loss)

    def _micro_loss(self, micro: dict, weight: float, counts: MiniBatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro["response_mask"]
        vpreds = self.values_micro(micro)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds,
            returns=micro["returns"],
            values=micro["values"],
            response_mask=mask,
            cliprange_value=float(self.config.cliprange_value),
            loss_agg_mode=self.config.loss_agg_mode,
        )
        metrics = {
            "critic/vf_loss": float(vf_loss.detach()) * weight,
            "critic/vf_clipfrac": float(vf_clipfrac) * weight,
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mask)) * weight,
        }
        return vf_loss, metrics
