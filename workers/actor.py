"""The PPO actor on one rank: log-probs and entropy of responses, and the policy update.

Works on a rank's share of the batch (a DataProto with `input_ids`, `attention_mask`,
`position_ids`, `responses` and, for updates, `old_log_probs`, `advantages`,
`response_mask`). Logits are computed only at the positions that predict response tokens
(`logits_to_keep`), divided by the sampling temperature, and turned into log-probs in
fp32 — by the fused, chunked output layer when `chunk_logits` (workers/response_head.py).
With `use_remove_padding` the rows are packed into one sequence; with `share_prompts`
packed prompt-once (workers/shared_prefix.py).

The update runs through the shared optimizer step (workers/optimizer_step.py: mini- and
micro-batches, globally normalised loss weights, clipping, scheduler); this file supplies
the policy loss of one micro-batch. The reference policy is an actor without an optimizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from protocol.data_proto import DataProto
from workers.compiled_entropy import entropy_function
from workers.config.batching import MicroBatching
from workers.device import current_device
from workers.losses import (
    agg_loss,
    aggregation_spec,
    compute_policy_loss_reinforce,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from workers.micro_batch import micro_batches, response_inputs, to_rows
from workers.optimizer_step import MiniBatchCounts, OptimizerStep, UpdatePlan, all_reduce_max, world_size
from workers.response_head import fused_response_head
from workers.rollout_correction import (
    Stats,
    compute_correction,
    correction_metrics,
    rejected_loss_scale,
)
from workers.ulysses import SequenceParallel, SequenceSplit
from workers.vision import MULTI_MODAL_INPUTS, vision_model_inputs

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ActorConfig
    from workers.rollout_correction_settings import CorrectionSettings


class DataParallelPPOActor:
    """`config`: the `actor_rollout_ref.actor` section (None for the reference policy,
    which only computes log-probs). `share_prompts`: every pass packs prompt-once
    (workers/shared_prefix.py; `actor.use_prefix_grouper`). `chunk_logits`: log-probs and
    entropy come from the fused, chunked output layer (workers/response_head.py;
    `model.use_fused_kernels`). `sp`: this rank's sequence-parallel group; the rows given
    are then the whole group's (workers/ulysses.py). `use_torch_compile`: the entropy goes
    through torch.compile, as verl's (workers/compiled_entropy.py)."""

    def __init__(
        self,
        module: torch.nn.Module,
        use_remove_padding: bool,
        config: ActorConfig | None = None,
        optimizer=None,
        lr_scheduler=None,
        *,
        share_prompts: bool = False,
        chunk_logits: bool = False,
        sp: SequenceParallel | None = None,
        use_torch_compile: bool = False,
    ):
        self.config = config
        self.entropy_from_logits = entropy_function(use_torch_compile)
        self.share_prompts = share_prompts
        self.sp = sp
        self.chunk_logits = chunk_logits
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.use_remove_padding = use_remove_padding
        self.world_size = world_size()
        self.step = None
        if optimizer is not None:
            self.step = OptimizerStep(module, optimizer, lr_scheduler, config.grad_clip, prefix="actor")

    # ------------------------------------------------------------------ forward
    def forward_micro(self, micro: dict, temperature: float, calculate_entropy: bool, entropy_grad: bool = True):
        """Log-probs and (if asked) entropy; `entropy_grad=False` computes the entropy as a
        metric only, without keeping its softmax for the backward pass."""
        responses = micro["responses"]
        inputs, keep, valid = response_inputs(micro, self.use_remove_padding or self.sp is not None, self.share_prompts)
        if MULTI_MODAL_INPUTS in micro:  # a vision-language batch (workers/vision.py; padded rows only)
            inputs = vision_model_inputs(inputs, micro[MULTI_MODAL_INPUTS], current_device())
        split = SequenceSplit(inputs, keep, self.sp)  # the whole row without sequence parallelism
        labels = responses if valid is None else split.local(responses[valid])
        if self.chunk_logits:
            flat_labels = labels if valid is not None else F.pad(responses, (0, 1)).reshape(-1)
            with fused_response_head(self.module, flat_labels, temperature, with_entropy=calculate_entropy):
                out = self.module(**split.inputs, use_cache=False, logits_to_keep=split.keep)
            per_token = out.logits[:, :-1] if valid is None else out.logits[0]
            log_probs, entropy = per_token[..., 0].float(), per_token[..., 1].float()
            entropy = (entropy if entropy_grad else entropy.detach()) if calculate_entropy else None
        else:
            out = self.module(**split.inputs, use_cache=False, logits_to_keep=split.keep)
            logits = (out.logits[:, :-1] if valid is None else out.logits[0]).float() / temperature
            log_probs = logprobs_from_logits(logits, labels)
            entropy = None
            if calculate_entropy and entropy_grad:
                entropy = self.entropy_from_logits(logits)
            elif calculate_entropy:
                with torch.no_grad():
                    entropy = self.entropy_from_logits(logits.detach())
        if valid is None:
            return log_probs, entropy
        log_probs = to_rows(split.gather(log_probs), valid)
        return log_probs, None if entropy is None else to_rows(split.gather(entropy), valid)

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, batching: MicroBatching, temperature: float, calculate_entropy: bool = False
    ):
        """Log-probs (B, R) of `responses` under the current weights, and entropy if asked."""
        self.module.eval()
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        tensors = data.batch.select(*keys).to(current_device())
        log_probs = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        entropy = torch.zeros_like(log_probs) if calculate_entropy else None
        images = data.non_tensor_batch.get(MULTI_MODAL_INPUTS)
        for idx in micro_batches(data.batch, batching.for_model(self.share_prompts, self.sp), self.world_size):
            index = torch.tensor(idx)
            micro = {k: tensors[k][index] for k in keys}
            if images is not None:
                micro[MULTI_MODAL_INPUTS] = images[idx]
            lp, ent = self.forward_micro(micro, temperature, calculate_entropy)
            log_probs[index] = lp.cpu()
            if calculate_entropy:
                entropy[index] = ent.cpu()
        return log_probs, entropy

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto, temperature: float) -> dict[str, float]:
        """One PPO update on this rank's rows, in mini-batches of the config's
        `mini_batch_samples_per_rank`.

        On-policy (`on_policy_update`: one optimizer step on the whole batch) the driver skips
        the old log-prob pass, because the weights that would compute it are the ones being
        updated: this forward's log-probs, detached, are the old ones (ratio 1).

        Rollout correction (the config's `correction`: algorithm.rollout_correction, or the
        older `tis_imp_ratio_cap`) is applied here; see `_correct`.
        """
        cfg = self.config
        on_policy = cfg.on_policy_update
        _check_old_log_probs(cfg, "old_log_probs" in data.batch.keys(), len(data))
        settings = cfg.correction
        stats = Stats()
        data, where = self._correct(data, settings, on_policy, stats)
        keys = self._update_keys(data, on_policy, settings)
        loss = _PolicyMicroLoss(self, cfg, temperature, on_policy, "rollout_log_probs" in keys, settings, where, stats)
        aggregation = aggregation_spec(cfg.loss_agg_mode)
        plan = UpdatePlan(
            samples_per_rank=cfg.mini_batch_samples_per_rank,
            epochs=cfg.ppo_epochs,
            shuffle=cfg.shuffle,
            seed=cfg.data_loader_seed if cfg.data_loader_seed is not None else 0,
            micro=cfg.update_batching.for_model(self.share_prompts, self.sp),
            seq_level=aggregation.seq_level,
            summed=aggregation.summed,
        )
        metrics = self.step.run(data, keys, plan, loss)
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"] = float(cfg.kl_loss_coef)
        if loss.has_rollout_lp and loss.reports_pass_metrics:
            metrics["rollout/logp_abs_diff_max"] = all_reduce_max(loss.logp_diff_max)
        if settings is not None:
            stats.reduce(_all_reduce)
            metrics.update(correction_metrics(stats.values(), settings))
        return metrics

    def _correct(self, data: DataProto, settings, on_policy: bool, stats: Stats) -> tuple[DataProto, str | None]:
        """Where rollout correction is computed, so that every path gives verl 0.9's numbers:

        * "batch": decoupled with old log-probs from the separate pass: once, here, over this
          rank's rows; weights and the rejection mask join the rows (`rollout_is_weights`, a
          narrowed `response_mask`, as verl's driver does), and batch normalisation averages
          over all ranks, so "batch" is the whole training batch, as in verl's decoupled mode.
        * "micro": decoupled on-policy (no separate pass): pi_old is each micro-batch's own
          detached forward; token and sequence weights need nothing beyond the micro-batch's
          whole rows. Rejection and normalisation need the whole batch first, so the driver
          keeps the old log-prob pass for them (the config's on_policy_update is false).
        * "bypass": pi_rollout is the anchor (the driver sent it as old_log_probs); weights and
          rejection follow pi_theta, so they are computed per micro-batch in the loss, and
          normalisation averages over the micro-batch on all ranks, as verl's bypass mode.
        """
        if settings is None:
            return data, None
        if "rollout_log_probs" not in data.batch.keys():
            raise ValueError("rollout correction needs the engine's log-probs (rollout_log_probs) in the batch")
        if settings.bypass:
            return data, "bypass"
        if on_policy:
            if settings.needs_whole_batch:
                raise ValueError(
                    "rollout correction with rejection sampling or batch-normalised weights needs old_log_probs of the "
                    "whole batch before the update; the trainer runs the old log-prob pass for it"
                )
            return data, "micro"
        batch = data.batch
        corr = compute_correction(
            batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], settings, _all_reduce
        )
        stats.merge(corr.stats)
        data = data.select()  # a new container: the caller's rows keep their own mask
        if corr.weights is not None:
            data.batch["rollout_is_weights"] = corr.weights
        if corr.keep is not None:
            mask = batch["response_mask"]
            data.batch["response_mask"] = (mask * corr.keep).to(mask.dtype)
        return data, "batch"

    def _update_keys(self, data: DataProto, on_policy: bool, settings) -> list[str]:
        cfg = self.config
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "response_mask", "advantages"]
        if not on_policy:
            keys.append("old_log_probs")
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        present = data.batch.keys()
        if "rollout_log_probs" in present and (settings is not None or on_policy):
            keys.append("rollout_log_probs")
        if "rollout_is_weights" in present:
            keys.append("rollout_is_weights")
        return keys


def _all_reduce(values: torch.Tensor, kind: str) -> torch.Tensor:
    """Element-wise sum, max or min of float64 `values` over all ranks."""
    if world_size() == 1:
        return values
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[kind]
    reduced = values.to(device=current_device(), dtype=torch.float64)
    dist.all_reduce(reduced, op=op)
    return reduced.to(values.device)


class _PolicyMicroLoss:
    """The policy loss of one micro-batch (a `MicroLoss` for the shared optimizer step):
    policy gradient, minus the entropy bonus, plus the KL loss; metrics weighted."""

    def __init__(
        self,
        actor: DataParallelPPOActor,
        config: ActorConfig,
        temperature: float,
        on_policy: bool,
        has_rollout_lp: bool,
        settings: CorrectionSettings | None = None,
        where: str | None = None,
        stats: Stats | None = None,
    ):
        self.actor = actor
        self.config = config
        self.temperature = temperature
        self.on_policy = on_policy
        self.has_rollout_lp = has_rollout_lp
        self.settings = settings
        self.where = where  # None, "batch", "micro" or "bypass" (DataParallelPPOActor._correct)
        self.stats = stats
        # Bypass mode skipped the old log-prob pass too: the update reports what it would have.
        self.reports_pass_metrics = on_policy or where == "bypass"
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.logp_diff_max = 0.0

    def __call__(self, micro: dict, weight: float, counts: MiniBatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        mode = cfg.loss_agg_mode
        entropy_coeff = cfg.entropy_coeff
        mask = micro["response_mask"]
        metrics: dict[str, float] = {}
        log_prob, entropy = self.actor.forward_micro(
            micro, self.temperature, entropy_coeff != 0 or self.reports_pass_metrics, entropy_grad=entropy_coeff != 0
        )
        if self.reports_pass_metrics:
            metrics.update(self._skipped_pass_metrics(micro, log_prob.detach(), entropy, counts, weight))
        old_log_prob = log_prob.detach() if self.on_policy else micro["old_log_probs"]
        pg_loss, pg_metrics = self._policy_gradient(micro, log_prob, old_log_prob)
        loss = pg_loss
        if entropy_coeff != 0:
            ent = agg_loss(entropy, mask, mode, cfg.loss_scale_factor)
            loss = loss - entropy_coeff * ent
            metrics["actor/entropy_loss"] = float(ent.detach()) * weight
        if cfg.use_kl_loss:
            kl = agg_loss(
                kl_penalty(log_prob, micro["ref_log_prob"], cfg.kl_loss_type), mask, mode, cfg.loss_scale_factor
            )
            loss = loss + float(cfg.kl_loss_coef) * kl
            metrics["actor/kl_loss"] = float(kl.detach()) * weight
        metrics["actor/pg_loss"] = float(pg_loss.detach()) * weight
        for name, value in pg_metrics.items():
            metrics[name] = float(value) * weight
        return loss, metrics

    def _policy_gradient(self, micro: dict, log_prob: torch.Tensor, old_log_prob: torch.Tensor):
        """The policy loss with rollout correction applied where this update computes it."""
        cfg, mask, advantages = self.config, micro["response_mask"], micro["advantages"]
        weights = micro.get("rollout_is_weights")  # "batch": computed for the whole batch
        if self.where in ("micro", "bypass"):
            current = log_prob.detach() if self.where == "bypass" else old_log_prob
            corr = compute_correction(current, micro["rollout_log_probs"], mask, self.settings, _all_reduce)
            self.stats.merge(corr.stats)
            weights = corr.weights
        if self.where != "bypass":
            return self.policy_loss_fn(
                old_log_prob=old_log_prob,
                log_prob=log_prob,
                advantages=advantages,
                response_mask=mask,
                loss_agg_mode=cfg.loss_agg_mode,
                config=cfg,
                rollout_is_weights=weights,
            )
        # Bypass: the engine's log-probs are the anchor (the driver also sends them as
        # old_log_probs); rejected tokens leave the numerator only.
        anchor = micro["rollout_log_probs"]
        kept = mask if corr.keep is None else (mask * corr.keep).to(mask.dtype)
        if self.settings.loss_type == "reinforce":
            pg_loss, pg_metrics = compute_policy_loss_reinforce(
                anchor, log_prob, advantages, kept, cfg.loss_agg_mode, cfg, rollout_is_weights=weights
            )
        else:  # ppo_clip: the ratio pi_theta / pi_rollout already is the correction; weights are metrics only
            pg_loss, pg_metrics = self.policy_loss_fn(
                old_log_prob=anchor,
                log_prob=log_prob,
                advantages=advantages,
                response_mask=kept,
                loss_agg_mode=cfg.loss_agg_mode,
                config=cfg,
                rollout_is_weights=None,
            )
        if corr.keep is not None:
            pg_loss = pg_loss * rejected_loss_scale(mask, kept, cfg.loss_agg_mode).to(pg_loss.dtype)
        return pg_loss, pg_metrics

    def _skipped_pass_metrics(
        self, micro: dict, current_log_prob, entropy, counts: MiniBatchCounts, weight: float
    ) -> dict:
        """What the skipped old log-prob pass would have reported: entropy, engine/trainer gap."""
        mask = micro["response_mask"]
        cfg = self.config
        metrics = {
            "actor/entropy": float(agg_loss(entropy.detach(), mask, cfg.loss_agg_mode, cfg.loss_scale_factor)) * weight
        }
        if self.has_rollout_lp:
            diff = (micro["rollout_log_probs"] - current_log_prob).abs()[mask.bool()]
            metrics["rollout/logp_abs_diff_mean"] = float(diff.sum()) / counts.tokens
            self.logp_diff_max = max(self.logp_diff_max, float(diff.max()) if diff.numel() else 0.0)
        return metrics


def _check_old_log_probs(cfg: ActorConfig, has_old: bool, rows: int) -> None:
    """The driver runs the old log-prob pass exactly when the config's `on_policy_update` is
    false; a batch that disagrees would train on the wrong anchor, so it stops here."""
    if cfg.on_policy_update and has_old:
        raise ValueError(
            "update_actor got old_log_probs, but the config's actor.on_policy_update says this update takes its own "
            "forward's log-probs as the old ones (skip_old_log_prob_on_policy=true, one optimizer step on the whole "
            "batch); do not run compute_log_prob before it, or set "
            "actor_rollout_ref.actor.skip_old_log_prob_on_policy=false"
        )
    if not cfg.on_policy_update and not has_old:
        raise ValueError(
            f"update_actor got no old_log_probs; skipping that pass is only valid for one optimizer step on the whole "
            f"batch with nothing reading old log-probs first (actor.on_policy_update), and this update has "
            f"ppo_epochs={cfg.ppo_epochs} and mini-batches of {cfg.mini_batch_samples_per_rank} samples per rank for "
            f"{rows} rows; run compute_log_prob first"
        )
