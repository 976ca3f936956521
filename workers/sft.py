"""The SFT model on one rank of a run: the actor's FSDP2 machinery with a cross-entropy loss.

Nothing here is a second training stack. The model is loaded and sharded by
workers/model_loading.py (LoRA from workers/lora.py, gradient checkpointing, liger); the
forward is the actor's (`DataParallelPPOActor.forward_micro`: padded, or packed without
padding with `use_remove_padding`, through workers/packed_attention.py, and log-probs from
the fused, chunked output layer where the model allows it); the update is the shared
optimizer step (workers/optimizer_step.py: micro-batches whose gradients accumulate, each
weighted by its share of the global loss tokens, clipping, one scheduler step per call);
checkpoints are the actor's (workers/checkpoint.py), so the merge tool reads them.

Several ranks (torchrun): FSDP2 shards the model over all of them (one 1-D mesh, as for the
actor) and each data-parallel rank trains its contiguous share of every global batch. The
loss weights are global (each micro-batch's share of the step's target tokens summed over
all ranks, times the world size that FSDP's gradient average divides by), so the step equals
the one-rank step on the whole batch. With `ulysses_sequence_parallel_size` = sp, sp
consecutive ranks form a sequence-parallel group (workers/ulysses.py, the actor's): they hold
the same rows (data-parallel ranks = world / sp) and split each packed row's tokens.

An SFT sample is seen by that forward as a "response" that starts at the second token:
`responses = input_ids[:, 1:]`, `response_mask = loss_mask[:, 1:]`, so each target token's
log-prob comes from the position before it, and the loss is the mean negative log-prob
over the batch's target tokens (verl's SFT loss, token-mean over all ranks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from protocol.data_proto import DataProto
from workers.actor import DataParallelPPOActor
from workers.base import Worker
from workers.checkpoint import FSDPCheckpointer
from workers.config.batching import MicroBatching
from workers.device import current_device
from workers.fsdp_utils import build_optimizer
from workers.lora import is_peft_model, merged_state
from workers.micro_batch import micro_batch_indices
from workers.model_loading import load_hf_model, load_tokenizer, model_path_in_shm
from workers.optimizer_step import MiniBatchCounts, OptimizerStep, UpdatePlan, all_reduce_sum
from workers.response_head import uses_fused_head
from workers.ulysses import check_heads, data_parallel_size, sequence_parallel_group

SP_KEY = "ulysses_sequence_parallel_size"

KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


def sft_batch(tensors: dict[str, torch.Tensor]) -> DataProto:
    """Collated SFT tensors (input_ids, attention_mask, position_ids, loss_mask) as the
    actor's forward reads them: targets are the tokens from the second on."""
    mask = tensors["loss_mask"][:, 1:] * tensors["attention_mask"][:, 1:]
    return DataProto.from_dict(
        {
            "input_ids": tensors["input_ids"],
            "attention_mask": tensors["attention_mask"],
            "position_ids": tensors["position_ids"],
            "responses": tensors["input_ids"][:, 1:],
            "response_mask": mask.to(torch.float32),
        }
    )


def build_sft_scheduler(optimizer, name: str, warmup_ratio: float, total_steps: int):
    """verl's SFT schedules (transformers' implementations): cosine with linear warmup, or
    warmup-stable-decay with 90% of the steps after warmup stable and a cosine decay."""
    from transformers import get_cosine_schedule_with_warmup
    from transformers.optimization import get_wsd_schedule

    total_steps = max(int(total_steps), 1)
    warmup = int(total_steps * float(warmup_ratio))
    if name == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
    if name == "wsd":
        remaining = max(total_steps - warmup, 0)
        stable = int(remaining * 0.9)
        return get_wsd_schedule(
            optimizer, num_warmup_steps=warmup, num_stable_steps=stable, num_decay_steps=remaining - stable
        )
    raise ValueError(f"optim.lr_scheduler={name!r} is not one of cosine, wsd")


class _SFTLoss:
    """Mean negative log-prob of one micro-batch's target tokens (a `MicroLoss`)."""

    def __init__(self, actor: DataParallelPPOActor):
        self.actor = actor

    def __call__(self, micro: dict, weight: float, counts: MiniBatchCounts):
        log_probs, _ = self.actor.forward_micro(micro, 1.0, False)
        mask = micro["response_mask"]
        loss = -(log_probs * mask).sum() / mask.sum().clamp(min=1.0)
        return loss, {"train/loss": float(loss.detach()) * weight}


class SFTWorker(Worker):
    """One rank of an SFT run. `config` is the typed SFT config (hybrid/config/sft_schema.py);
    `total_steps` sizes the LR schedule."""

    def __init__(self, config, total_steps: int):
        super().__init__()
        self.config = config
        self.total_steps = int(total_steps)

    def init_model(self) -> None:
        model_cfg, optim = self.config.model, self.config.optim
        path = model_path_in_shm(model_cfg.partial_pretrain) if model_cfg.use_shm else model_cfg.partial_pretrain
        from transformers import AutoModelForCausalLM

        self.tokenizer = load_tokenizer(path, model_cfg.trust_remote_code)
        # Every rank builds every group, in the same order, before the model (as the actor worker does).
        self.sp = sequence_parallel_group(self.config.ulysses_sequence_parallel_size, SP_KEY)
        fsdp = model_cfg.fsdp_config
        fsdp_view = _FSDPView(fsdp.mixed_precision)
        self.module, self.hf_config = load_hf_model(
            AutoModelForCausalLM,
            path,
            fsdp_view,
            seed=self.config.trainer.seed,
            trainable=True,
            trust_remote_code=model_cfg.trust_remote_code,
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
            use_liger=model_cfg.use_liger,
            lora_config=model_cfg if model_cfg.is_lora else None,
            offload_policy=fsdp.cpu_offload,
        )
        if self.sp is not None:
            check_heads(self.hf_config, self.sp.size, SP_KEY)
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, optim)
        schedule = optim.lr_scheduler
        self.lr_scheduler = build_sft_scheduler(self.optimizer, schedule, optim.warmup_ratio, self.total_steps)
        self.actor = DataParallelPPOActor(
            self.module, self.config.use_remove_padding, chunk_logits=uses_fused_head(None, self.module), sp=self.sp
        )
        self.step = OptimizerStep(self.module, self.optimizer, self.lr_scheduler, optim.clip_grad, prefix="train")
        tie = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        self.checkpointer = FSDPCheckpointer(
            self.module,
            self.optimizer,
            self.lr_scheduler,
            self.hf_config,
            self.tokenizer,
            model_cfg.partial_pretrain,
            hf_state_fn=self._hf_state,
            tie_word_embeddings=tie,
        )

    def _hf_state(self):
        return merged_state(self.module) if is_peft_model(self.module) else self.module.state_dict()

    @property
    def micro_batching(self) -> MicroBatching:
        batching = MicroBatching(self.config.data.micro_batch, False, self.config.data.max_length)
        return batching.for_model(False, self.sp)

    @property
    def dp_size(self) -> int:
        return data_parallel_size(self.world_size, self.sp)

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel group; the members of a sequence-parallel group share it."""
        return self.rank // (self.sp.size if self.sp else 1)

    def own_rows(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This data-parallel rank's contiguous share of a batch (the batch's size divides by the
        data-parallel size: the config's rule), without the padding columns no row of it uses."""
        rows = tensors["input_ids"].shape[0] // self.dp_size
        width = int(tensors["attention_mask"][self.dp_rank * rows : (self.dp_rank + 1) * rows].sum(-1).max())
        return {k: v[self.dp_rank * rows : (self.dp_rank + 1) * rows, :width] for k, v in tensors.items()}

    def train_batch(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer step on the global batch `tensors` (every rank is given the same), of
        which this rank trains its own rows; returns the global metrics."""
        data = sft_batch(self.own_rows(tensors))
        plan = UpdatePlan(
            samples_per_rank=len(data), epochs=1, shuffle=False, seed=0, micro=self.micro_batching, seq_level=False
        )
        metrics = self.step.run(data, KEYS, plan, _SFTLoss(self.actor))
        metrics["train/tokens"] = float(tensors["attention_mask"].sum())
        return metrics

    @torch.no_grad()
    def loss_sums(self, tensors: dict[str, torch.Tensor]) -> tuple[float, float]:
        """(sum of the target tokens' negative log-probs, their count) over every data-parallel
        rank; `tensors` are this rank's rows (every rank runs as many calls, with as many rows)."""
        self.module.eval()
        data = sft_batch(tensors)
        batch = data.batch.to(current_device())
        total = count = 0.0
        for idx in micro_batch_indices(batch["attention_mask"], self.micro_batching, self.world_size):
            index = torch.tensor(idx, device=batch["input_ids"].device)
            micro = {k: batch[k][index] for k in KEYS}
            log_probs, _ = self.actor.forward_micro(micro, 1.0, False)
            total -= float((log_probs * micro["response_mask"]).sum())
            count += float(micro["response_mask"].sum())
        total, count = all_reduce_sum([total, count])
        # The members of a sequence-parallel group each computed their group's rows.
        group = self.sp.size if self.sp else 1
        return total / group, count / group

    # The worker-group interface hybrid/checkpointing.RunCheckpoints calls.
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep=None) -> dict:
        # Rank 0 makes the temporary folder before it calls this; the others wait for it here.
        self.barrier()
        return self.checkpointer.save(local_path, global_step, self.config.trainer.checkpoint.save_contents)

    def load_checkpoint(self, local_path: str) -> dict:
        return self.checkpointer.load(local_path, self.config.trainer.checkpoint.load_contents)

    def barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()


class _FSDPView:
    """What load_hf_model reads of a sharding section, from verl's SFT fsdp_config."""

    reshard_after_forward = True

    def __init__(self, mixed_precision: str):
        self.mixed_precision = mixed_precision


__all__ = ["SFTWorker", "build_sft_scheduler", "sft_batch"]
