"""The PPO actor on one rank: log-probs and entropy of responses, and the policy update.

Works on a rank's share of the batch (a DataProto with `input_ids`, `attention_mask`,
`position_ids`, `responses` and, for updates, `old_log_probs`, `advantages`,
`response_mask`). Logits are computed only at the positions that predict response tokens
(`logits_to_keep`), divided by the sampling temperature, and turned into log-probs in
fp32. With `use_remove_padding` the rows are packed into one sequence.

Loss normalisation is global: every micro-batch's loss is weighted by its share of the
mini-batch's tokens (or sequences) summed over all ranks, times the world size that
FSDP's gradient average divides by. So the gradient is the same whatever the micro-batch
size, the dynamic token budget or the number of ranks.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from protocol.data_proto import DataProto
from workers.device import current_device
from workers.losses import agg_loss, entropy_from_logits, get_policy_loss_fn, kl_penalty, logprobs_from_logits
from workers.micro_batch import pack, split_by_count, split_by_token_budget


def forward_response_logits(model, micro: dict, response_len: int, use_remove_padding: bool):
    """Logits (B, R, V) at the positions predicting each response token, plus a validity mask."""
    input_ids = micro["input_ids"]
    attention_mask = micro["attention_mask"]
    position_ids = micro["position_ids"]
    batch, seq_len = input_ids.shape
    if not use_remove_padding:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=response_len + 1,
        )
        return out.logits[:, :-1], None
    packed_ids, packed_pos, flat_index, varlen = pack(input_ids, attention_mask, position_ids)
    packed_at = torch.full((batch * seq_len,), -1, dtype=torch.long, device=input_ids.device)
    packed_at[flat_index] = torch.arange(flat_index.numel(), device=input_ids.device)
    rows = torch.arange(batch, device=input_ids.device).unsqueeze(1) * seq_len
    cols = torch.arange(seq_len - response_len - 1, seq_len - 1, device=input_ids.device).unsqueeze(0)
    source = packed_at[rows + cols]  # (B, R): packed position predicting each response token
    valid = source >= 0
    out = model(input_ids=packed_ids, position_ids=packed_pos, use_cache=False, logits_to_keep=source[valid], **varlen)
    return out.logits[0], valid


class DataParallelPPOActor:
    def __init__(self, config, module: torch.nn.Module, optimizer=None, lr_scheduler=None):
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.use_remove_padding = bool(config.get("use_remove_padding", True))
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1

    # ------------------------------------------------------------------ forward
    def _forward_micro(self, micro: dict, temperature: float, calculate_entropy: bool, entropy_grad: bool = True):
        """Log-probs and (if asked) entropy; `entropy_grad=False` computes the entropy as a
        metric only, without keeping its softmax for the backward pass."""
        responses = micro["responses"]
        response_len = responses.shape[1]
        logits, valid = forward_response_logits(self.module, micro, response_len, self.use_remove_padding)
        logits = logits.float() / temperature

        def entropy_of(x):
            if entropy_grad:
                return entropy_from_logits(x)
            with torch.no_grad():
                return entropy_from_logits(x.detach())

        if valid is None:
            log_probs = logprobs_from_logits(logits, responses)
            entropy = entropy_of(logits) if calculate_entropy else None
            return log_probs, entropy
        log_probs = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        log_probs[valid] = logprobs_from_logits(logits, responses[valid])
        entropy = None
        if calculate_entropy:
            entropy = torch.zeros_like(log_probs)
            entropy[valid] = entropy_of(logits)
        return log_probs, entropy

    def _micro_batches(self, data: DataProto, micro_batch_size: int, use_dynamic_bsz: bool, max_token_len: int):
        """Index lists; with a token budget every rank runs the same number of micro-batches."""
        n = len(data)
        if not use_dynamic_bsz:
            return split_by_count(n, micro_batch_size)
        seq_lens = data.batch["attention_mask"].sum(-1).tolist()
        groups = split_by_token_budget(seq_lens, max_token_len)
        if self.world_size > 1:
            count = torch.tensor([len(groups)], device=current_device())
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            groups = split_by_token_budget(seq_lens, max_token_len, same_count_as=int(count.item()))
        return groups

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs (B, R) of `responses` under the current weights, and entropy if asked."""
        self.module.eval()
        temperature = float(data.meta_info.get("temperature", 1.0))
        micro_bsz = int(data.meta_info.get("micro_batch_size", 16))
        use_dynamic = bool(data.meta_info.get("use_dynamic_bsz", False))
        max_tokens = int(data.meta_info.get("max_token_len", 16384))
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        tensors = data.batch.select(*keys).to(current_device())
        log_probs = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        entropy = torch.zeros_like(log_probs) if calculate_entropy else None
        for idx in self._micro_batches(data, micro_bsz, use_dynamic, max_tokens):
            index = torch.tensor(idx)
            micro = {k: tensors[k][index] for k in keys}
            lp, ent = self._forward_micro(micro, temperature, calculate_entropy)
            log_probs[index] = lp.cpu()
            if calculate_entropy:
                entropy[index] = ent.cpu()
        return log_probs, entropy

    # ------------------------------------------------------------------ update
    def _global_count(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=current_device())
        dist.all_reduce(t)
        return float(t.item())

    def update_policy(self, data: DataProto) -> dict[str, float]:
        cfg = self.config
        self.module.train()
        temperature = float(data.meta_info.get("temperature", 1.0))
        loss_agg_mode = cfg.loss_agg_mode
        policy_loss_fn = get_policy_loss_fn(cfg.policy_loss.get("loss_mode", "vanilla"))
        entropy_coeff = float(cfg.get("entropy_coeff", 0.0))
        use_kl_loss = bool(cfg.get("use_kl_loss", False))
        use_tis = float(cfg.get("tis_imp_ratio_cap", -1) or -1) > 0 and "rollout_log_probs" in data.batch.keys()

        mini_bsz = int(data.meta_info["ppo_mini_batch_size"])  # samples per rank
        # On-policy (one optimizer step on the whole batch): the driver skipped the old
        # log-prob pass, because the weights that would compute it are the ones being
        # updated; this forward's log-probs, detached, are the old ones (ratio 1).
        on_policy = "old_log_probs" not in data.batch.keys()
        if on_policy and (int(cfg.get("ppo_epochs", 1)) != 1 or mini_bsz < len(data)):
            raise ValueError(
                f"update_actor got no old_log_probs, which is only valid for one optimizer step on the whole batch, "
                f"but ppo_epochs={cfg.get('ppo_epochs', 1)} and the mini-batch has {mini_bsz} of {len(data)} samples"
            )
        has_rollout_lp = "rollout_log_probs" in data.batch.keys()
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "advantages"]
        if not on_policy:
            keys.append("old_log_probs")
        if use_kl_loss:
            keys.append("ref_log_prob")
        if use_tis or (on_policy and has_rollout_lp):
            keys.append("rollout_log_probs")
        logp_diff_max = 0.0
        seq_level = loss_agg_mode.startswith("seq-mean")
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        grad_norms, lrs = [], []

        for epoch in range(int(cfg.get("ppo_epochs", 1))):
            shuffle = bool(cfg.get("shuffle", False))
            seed = cfg.get("data_loader_seed")
            iterator = data.select(batch_keys=keys).make_iterator(
                mini_batch_size=mini_bsz,
                epochs=1,
                seed=(seed if seed is not None else 0) + epoch,
                dataloader_kwargs={"shuffle": shuffle},
            )
            for mini in iterator:
                mini_tensors = mini.batch.to(current_device())
                mask_all = mini_tensors["response_mask"]
                local_units = float(mask_all.any(-1).sum() if seq_level else mask_all.sum())
                global_units = max(self._global_count(local_units), 1.0)
                global_tokens = max(self._global_count(float(mask_all.sum())), 1.0) if on_policy else 1.0
                self.optimizer.zero_grad(set_to_none=True)
                groups = self._micro_batches(
                    mini,
                    int(cfg.ppo_micro_batch_size_per_gpu or 1),
                    bool(cfg.get("use_dynamic_bsz", False)),
                    int(cfg.get("ppo_max_token_len_per_gpu", 16384)),
                )
                for idx in groups:
                    index = torch.tensor(idx, device=mask_all.device)
                    micro = {k: mini_tensors[k][index] for k in keys}
                    mask = micro["response_mask"]
                    units = float(mask.any(-1).sum() if seq_level else mask.sum())
                    weight = units / global_units
                    log_prob, entropy = self._forward_micro(
                        micro, temperature, entropy_coeff != 0 or on_policy, entropy_grad=entropy_coeff != 0
                    )
                    if on_policy:
                        old_log_prob = log_prob.detach()
                        # The metrics the skipped old log-prob pass would have given.
                        sums["actor/entropy"] += float(agg_loss(entropy.detach(), mask, loss_agg_mode)) * weight
                        if has_rollout_lp:
                            diff = (micro["rollout_log_probs"] - old_log_prob).abs()[mask.bool()]
                            sums["rollout/logp_abs_diff_mean"] += float(diff.sum()) / global_tokens
                            logp_diff_max = max(logp_diff_max, float(diff.max()) if diff.numel() else 0.0)
                    else:
                        old_log_prob = micro["old_log_probs"]
                    pg_loss, pg_metrics = policy_loss_fn(
                        old_log_prob=old_log_prob,
                        log_prob=log_prob,
                        advantages=micro["advantages"],
                        response_mask=mask,
                        loss_agg_mode=loss_agg_mode,
                        config=cfg,
                        rollout_log_probs=micro.get("rollout_log_probs"),
                    )
                    loss = pg_loss
                    if entropy_coeff != 0:
                        ent = agg_loss(entropy, mask, loss_agg_mode)
                        loss = loss - entropy_coeff * ent
                        sums["actor/entropy_loss"] += float(ent.detach()) * weight
                    if use_kl_loss:
                        kl = agg_loss(kl_penalty(log_prob, micro["ref_log_prob"], cfg.kl_loss_type), mask, loss_agg_mode)
                        loss = loss + float(cfg.kl_loss_coef) * kl
                        sums["actor/kl_loss"] += float(kl.detach()) * weight
                        sums["actor/kl_coef"] = float(cfg.kl_loss_coef)
                    # FSDP averages gradients over ranks, so scale by world size to get the global mean.
                    (loss * weight * self.world_size).backward()
                    sums["actor/pg_loss"] += float(pg_loss.detach()) * weight
                    for name, value in pg_metrics.items():
                        sums[name] += float(value) * weight
                counts["mini"] += 1
                grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm=float(cfg.grad_clip))
                if hasattr(grad_norm, "full_tensor"):
                    grad_norm = grad_norm.full_tensor()
                grad_norm = float(grad_norm)
                if not torch.isfinite(torch.tensor(grad_norm)):
                    # A non-finite gradient would poison the weights; skip this step, report it.
                    self.optimizer.zero_grad(set_to_none=True)
                    sums["actor/skipped_steps"] += 1
                else:
                    self.optimizer.step()
                grad_norms.append(grad_norm)
        if self.lr_scheduler is not None:
            lrs.append(self.lr_scheduler.get_last_lr()[0])
            self.lr_scheduler.step()
        else:
            lrs.append(self.optimizer.param_groups[0]["lr"])
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self._reduce_metrics(sums, counts["mini"], grad_norms, lrs)
        if on_policy and has_rollout_lp:
            metrics["rollout/logp_abs_diff_max"] = self._global_max(logp_diff_max)
        return metrics

    def _global_max(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=current_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def _reduce_metrics(self, sums, num_minis, grad_norms, lrs) -> dict[str, float]:
        """Per-micro weighted sums are global means once summed over ranks; average over minis."""
        names = sorted(k for k in sums if k not in ("actor/kl_coef", "actor/skipped_steps"))
        if self.world_size > 1 and names:
            t = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=current_device())
            dist.all_reduce(t)
            for k, v in zip(names, t.tolist()):
                sums[k] = v
        metrics = {k: sums[k] / max(num_minis, 1) for k in names}
        if "actor/kl_coef" in sums:
            metrics["actor/kl_coef"] = sums["actor/kl_coef"]
        metrics["actor/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["actor/lr"] = lrs[-1] if lrs else 0.0
        if sums.get("actor/skipped_steps"):
            metrics["actor/skipped_steps"] = sums["actor/skipped_steps"]
        return metrics
