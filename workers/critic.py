"""The PPO critic on one rank: per-token values of responses and the value update.

The value model is a causal LM body with a scalar head (transformers'
`AutoModelForTokenClassification` with one label), initialised from the actor's weights.
Values are read at the positions that predict each response token, like the actor's
log-probs, and the loss is normalised globally across micro-batches and ranks the same way.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from protocol.data_proto import DataProto
from workers.actor import DataParallelPPOActor
from workers.device import current_device
from workers.losses import compute_value_loss, masked_mean
from workers.micro_batch import pack


def forward_values(model, micro: dict, response_len: int, use_remove_padding: bool) -> torch.Tensor:
    input_ids, attention_mask, position_ids = micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    batch, seq_len = input_ids.shape
    if not use_remove_padding:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        values = out.logits.squeeze(-1)
        return values[:, seq_len - response_len - 1 : seq_len - 1].float()
    packed_ids, packed_pos, flat_index, varlen = pack(input_ids, attention_mask, position_ids)
    out = model(input_ids=packed_ids, position_ids=packed_pos, use_cache=False, **varlen)
    flat = torch.zeros(batch * seq_len, dtype=torch.float32, device=input_ids.device)
    flat[flat_index] = out.logits[0].squeeze(-1).float()
    return flat.view(batch, seq_len)[:, seq_len - response_len - 1 : seq_len - 1]


class DataParallelPPOCritic(DataParallelPPOActor):
    """Shares the actor's micro-batching and global-normalisation machinery."""

    def _values_micro(self, micro: dict) -> torch.Tensor:
        response_len = micro["responses"].shape[1]
        values = forward_values(self.module, micro, response_len, self.use_remove_padding)
        return values * micro["response_mask"]

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        self.module.eval()
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask"]
        tensors = data.batch.select(*keys).to(current_device())
        values = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        groups = self._micro_batches(
            data,
            int(data.meta_info.get("micro_batch_size", 16)),
            bool(data.meta_info.get("use_dynamic_bsz", False)),
            int(data.meta_info.get("max_token_len", 32768)),
        )
        for idx in groups:
            index = torch.tensor(idx)
            values[index] = self._values_micro({k: tensors[k][index] for k in keys}).cpu()
        return values

    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config
        self.module.train()
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "values", "returns"]
        loss_agg_mode = cfg.get("loss_agg_mode", "token-mean")
        seq_level = loss_agg_mode.startswith("seq-mean")
        mini_bsz = int(data.meta_info["ppo_mini_batch_size"])
        sums: dict[str, float] = defaultdict(float)
        num_minis, grad_norms = 0, []
        for epoch in range(int(cfg.get("ppo_epochs", 1))):
            iterator = data.select(batch_keys=keys).make_iterator(
                mini_batch_size=mini_bsz, epochs=1, seed=epoch,
                dataloader_kwargs={"shuffle": bool(cfg.get("shuffle", False))},
            )
            for mini in iterator:
                tensors = mini.batch.to(current_device())
                mask_all = tensors["response_mask"]
                local_units = float(mask_all.any(-1).sum() if seq_level else mask_all.sum())
                global_units = max(self._global_count(local_units), 1.0)
                self.optimizer.zero_grad(set_to_none=True)
                groups = self._micro_batches(
                    mini,
                    int(cfg.ppo_micro_batch_size_per_gpu or 1),
                    bool(cfg.get("use_dynamic_bsz", False)),
                    int(cfg.get("ppo_max_token_len_per_gpu", 32768)),
                )
                for idx in groups:
                    index = torch.tensor(idx, device=mask_all.device)
                    micro = {k: tensors[k][index] for k in keys}
                    mask = micro["response_mask"]
                    weight = float(mask.any(-1).sum() if seq_level else mask.sum()) / global_units
                    vpreds = self._values_micro(micro)
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds=vpreds,
                        returns=micro["returns"],
                        values=micro["values"],
                        response_mask=mask,
                        cliprange_value=float(cfg.cliprange_value),
                        loss_agg_mode=loss_agg_mode,
                    )
                    (vf_loss * weight * self.world_size).backward()
                    sums["critic/vf_loss"] += float(vf_loss.detach()) * weight
                    sums["critic/vf_clipfrac"] += float(vf_clipfrac) * weight
                    sums["critic/vpred_mean"] += float(masked_mean(vpreds.detach(), mask)) * weight
                num_minis += 1
                grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm=float(cfg.grad_clip))
                if hasattr(grad_norm, "full_tensor"):
                    grad_norm = grad_norm.full_tensor()
                grad_norm = float(grad_norm)
                if torch.isfinite(torch.tensor(grad_norm)):
                    self.optimizer.step()
                else:
                    sums["critic/skipped_steps"] += 1
                self.optimizer.zero_grad(set_to_none=True)
                grad_norms.append(grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.lr_scheduler is not None:
            lr = self.lr_scheduler.get_last_lr()[0]
            self.lr_scheduler.step()
        names = sorted(k for k in sums if k != "critic/skipped_steps")
        if self.world_size > 1:
            t = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=current_device())
            dist.all_reduce(t)
            sums.update(zip(names, t.tolist()))
        metrics = {k: sums[k] / max(num_minis, 1) for k in names}
        metrics["critic/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["critic/lr"] = lr
        return metrics
