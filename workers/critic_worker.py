"""The critic worker: the value model (a causal LM body with a scalar head, initialised from
the actor's weights), its values and its update, and its sharded checkpoints.

It shares the device slots of the fused worker. Its mini-batches count prompts as the
actor's do; the driver's config fills the section's derived `rollout_n` for that.
"""

from __future__ import annotations

import time
import warnings

from protocol.data_proto import DataProto
from protocol.dispatch import Dispatch, register
from workers.base import Worker
from workers.checkpoint import FSDPCheckpointer
from workers.config import CriticConfig
from workers.critic import DataParallelPPOCritic
from workers.flops import update_mfu
from workers.fsdp_utils import build_lr_scheduler, build_optimizer, offload_params, on_device
from workers.lora import merged_state
from workers.model_loading import load_hf_model, load_tokenizer
from workers.profiling import ProfiledWorker, StepProfiler
from workers.ulysses import (
    check_data_parallel_size,
    check_heads,
    gather_group_rows,
    own_rows,
    sequence_parallel_group,
)


class CriticWorker(ProfiledWorker, Worker):
    """config: the typed `critic` section, its derived fields filled (rollout_n,
    data_parallel_size, share_prompts: hybrid/config/derived.py)."""

    def __init__(self, config: CriticConfig):
        super().__init__()
        self.config = config
        self.profiler = StepProfiler(config.profiler, "critic", self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from transformers import AutoModelForTokenClassification

        # FSDP2 warns that the value model's output is a view (the score layer's reshaped
        # result) because an in-place op on it would skip its backward hook; nothing here
        # modifies it in place (critic.forward_values indexes and casts), and the warning
        # reached the console of every run with a critic.
        warnings.filterwarnings(
            "ignore",
            message=r"FSDP2-wrapped module \(FSDP\w+ForTokenClassification\) returned a view tensor",
            category=UserWarning,
        )
        cfg = self.config
        model = cfg.model
        key = "critic.ulysses_sequence_parallel_size"
        self.sp = sequence_parallel_group(cfg.ulysses_sequence_parallel_size, key)
        check_data_parallel_size(cfg.data_parallel_size, self.world_size, self.sp, "critic")
        self.module, self.hf_config = load_hf_model(
            AutoModelForTokenClassification,
            model.path,
            model.fsdp_config,
            seed=0,
            trainable=True,
            trust_remote_code=model.trust_remote_code,
            override_config=model.override_config,
            gradient_checkpointing=model.enable_gradient_checkpointing,
            offload_policy=model.fsdp_config.offload_policy,
            fsdp_size=model.fsdp_config.fsdp_size,
            lora_config=model if model.is_lora else None,
            lora_causal_lm=False,
            language_model_only="critic.model.language_model_only" if model.language_model_only else None,
            # As verl: no dropout on the value head, so values are deterministic functions of the weights.
            num_labels=1,
            classifier_dropout=0.0,
        )
        # Only what trains: under LoRA the frozen base weights get no optimizer state.
        optimizer = build_optimizer([p for p in self.module.parameters() if p.requires_grad], cfg.optim)
        scheduler = build_lr_scheduler(optimizer, cfg.optim, cfg.optim.total_training_steps)
        self.critic = DataParallelPPOCritic(
            cfg,
            self.module,
            optimizer,
            scheduler,
            model.use_remove_padding,
            share_prompts=self.config.share_prompts,
            sp=self.sp,
        )
        if self.sp:
            check_heads(self.hf_config, self.sp.size, key)
        self.checkpointer = FSDPCheckpointer(
            self.module,
            optimizer,
            scheduler,
            self.hf_config,
            load_tokenizer(model.tokenizer, model.trust_remote_code),
            model.path,
            # The hf_model content and exports: the adapters merged into the base weights.
            hf_state_fn=(lambda: merged_state(self.module)) if model.is_lora else None,
            tie_word_embeddings=bool(getattr(self.hf_config, "tie_word_embeddings", False)),
        )
        if model.fsdp_config.param_offload:
            offload_params(self.module)
        return True

    def _on_device(self, optimizer: bool = False):
        return on_device(self.module, self.config.model.fsdp_config, self.critic.optimizer if optimizer else None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> dict:
        """As ActorRolloutRefWorker.save_checkpoint (retention is the driver's, after the rename)."""
        with self._on_device():
            return self.checkpointer.save(local_path, global_step, list(self.config.checkpoint.save_contents))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        with self._on_device(optimizer=True):
            return self.checkpointer.load(local_path, list(self.config.checkpoint.load_contents))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        with self._on_device():
            values = self.critic.compute_values(gather_group_rows(data, self.sp), self.config.values_batching)
        return DataProto.from_dict(tensors={"values": own_rows(values, self.sp)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        with self._on_device(optimizer=True):
            start = time.perf_counter()
            metrics = self.critic.update_critic(gather_group_rows(data, self.sp))
            seconds = time.perf_counter() - start
        metrics.update(update_mfu("critic", self.hf_config, data, seconds, self.config.ppo_epochs))
        return DataProto(meta_info={"metrics": metrics})
