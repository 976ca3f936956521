"""The fused worker of the hybrid engine, one per device slot.

It holds, in one process, what its `Role` names: the FSDP2 actor (training), the rollout
engine (vLLM in process, or transformers' generate) and the frozen reference policy. The
engine is built with dummy weights; `update_rollout_weights` gathers the actor's shards and
loads them into it in memory (workers/weight_sync.py). That call is the driver's: after the
worker is built or has loaded a checkpoint, and after every `update_actor`.
`generate_sequences` samples from whatever the engine holds and refuses to run before the
engine has received the actor's weights. For engines in their own processes (asynchronous
training, workers/rollout_engine_worker.py) `export_weights` gathers the same weights and
places them once in Ray's object store for every engine to load.

Every public method declares how a worker group splits its input (`@register`); the
DataProto ones take and return a DataProto. Parameters and optimizer state are on the device
only inside a call when the `fsdp_config` offload switches are set (workers/fsdp_utils.on_device).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from protocol.data_proto import DataProto
from protocol.dispatch import Dispatch, register
from workers.actor import DataParallelPPOActor
from workers.base import Worker
from workers.checkpoint import FSDPCheckpointer
from workers.colocation import ColocatedEngine, check_free_memory_for_engine
from workers.flops import update_mfu
from workers.freeze import freeze
from workers.fsdp_utils import build_lr_scheduler, build_optimizer, offload_params, on_device
from workers.lora import is_peft_model, merged_state
from workers.model_loading import load_hf_model, load_tokenizer, model_path_in_shm
from workers.profiling import ProfiledWorker, StepProfiler
from workers.response_head import uses_fused_head
from workers.roles import Role
from workers.rollout.engine import build_engine, engine_spec
from workers.rollout.tensor_parallel import check_engine_heads, own_samples, share_prompts, tensor_parallel_group
from workers.ulysses import (
    check_data_parallel_size,
    check_heads,
    gather_group_rows,
    own_rows,
    sequence_parallel_group,
)
from workers.vision import class_for
from workers.weight_sync import EngineWeightSync, SharedWeights, collect_full_weights

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ActorRolloutRefConfig, FSDPConfig

ARR = "actor_rollout_ref"
LANGUAGE_MODEL_KEY = "actor_rollout_ref.model.language_model_only"
SP_KEY = f"{ARR}.actor.ulysses_sequence_parallel_size"


class ActorRolloutRefWorker(ProfiledWorker, Worker):
    """config: the `actor_rollout_ref` section of the trainer config; role: a `Role` (or its value)."""

    def __init__(self, config: ActorRolloutRefConfig, role: Role | str):
        super().__init__()
        self.config = config
        self.role = Role.parse(role)
        self.actor = self.ref = self.rollout = self.weight_sync = self.colocated = self.checkpointer = None
        self.actor_module = None
        self.sp = None  # sequence-parallel group of the actor and the reference (workers/ulysses.py)
        self.rollout_tp = None  # the engine's tensor-parallel group (workers/rollout/tensor_parallel.py)
        # LoRA: the reference policy is the actor's own module with its adapters disabled.
        self.is_lora = config.model.is_lora
        self.ref_in_actor = False
        # verl's rule: a worker with the actor role profiles by the actor's section.
        section, name = (
            (config.actor.profiler, "actor")
            if self.role.has_actor or not self.role.has_ref
            else (config.ref.profiler, "ref")
        )
        self.profiler = StepProfiler(section, name, self.rank)

    # ------------------------------------------------------------------ building
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        if self.config.model.use_shm:
            # Actor, reference, engine and tokenizer all read the copy in shared memory.
            path = model_path_in_shm(self.config.model.path)
            self.config = replace(self.config, model=replace(self.config.model, path=path))
        model = self.config.model
        self.tokenizer = load_tokenizer(model.tokenizer, model.trust_remote_code)
        if self.role.has_actor or self.role.has_ref:
            self.sp = sequence_parallel_group(self.config.actor.ulysses_sequence_parallel_size, SP_KEY)
            if self.role.has_actor:
                check_data_parallel_size(self.config.actor.data_parallel_size, self.world_size, self.sp, ARR)
        if self.role.has_actor or self.role.has_rollout:
            self._build_policy()
        if self.role.has_ref:
            self._build_ref()
        if self.role.has_actor:
            self._build_checkpointer()
        # Built on the device; between calls the parameters live where the switches say. The
        # engine comes after the offload, so it finds the memory the switches free.
        if self.actor_module is not None and self.config.actor.fsdp_config.param_offload:
            offload_params(self.actor_module)
        if self.ref is not None and not self.ref_in_actor and self.config.ref.fsdp_config.param_offload:
            offload_params(self.ref.module)
        if self.role.has_rollout:
            self._build_rollout()
        return True

    def _load_causal_lm(
        self,
        fsdp_config: FSDPConfig,
        trainable: bool,
        offload_policy: bool = False,
        lora: bool = False,
        path: str | None = None,
    ):
        """The policy (`lora`: with its adapters) or the reference policy (the base model, or the
        model at `path`), both on the actor's device mesh (`actor.fsdp_config.fsdp_size`), as
        verl's fused worker."""
        from transformers import AutoModelForCausalLM

        model = self.config.model
        # A vision-language checkpoint loaded whole gets its image-text-to-text class (workers/vision.py).
        whole = not model.language_model_only
        model_cls = class_for(path or model.path, model.trust_remote_code) if whole else AutoModelForCausalLM
        return load_hf_model(
            model_cls,
            path or model.path,
            fsdp_config,
            seed=self.config.rollout.seed,
            trainable=trainable,
            trust_remote_code=model.trust_remote_code,
            override_config=model.override_config,
            gradient_checkpointing=model.enable_gradient_checkpointing,
            use_liger=model.use_liger,
            lora_config=model if lora else None,
            offload_policy=offload_policy,
            forward_prefetch=fsdp_config.forward_prefetch,
            fsdp_size=self.config.actor.fsdp_config.fsdp_size,
            language_model_only=LANGUAGE_MODEL_KEY if model.language_model_only else None,
        )

    def _build_policy(self):
        """The policy's FSDP module: trained (optimizer, LR schedule) with the actor role, a
        frozen copy that only feeds the engine with the rollout role alone."""
        actor = self.config.actor
        trainable = self.role.has_actor
        # A frozen policy copy (rollout role alone) still needs a saved adapter: it is the policy.
        lora = self.is_lora and (trainable or self.config.model.lora_adapter_path is not None)
        self.actor_module, self.hf_config = self._load_causal_lm(
            actor.fsdp_config, trainable, actor.fsdp_config.offload_policy, lora
        )
        optimizer = scheduler = None
        if trainable:
            # verl's freeze_vision_tower, ROLL's freeze_module_prefix (workers/freeze.py).
            freeze(self.actor_module, actor.freeze_vision_tower, actor.freeze_module_prefix, self.is_lora)
            # Only what trains: under LoRA (or frozen modules) the frozen weights get no optimizer state.
            optimizer = build_optimizer([p for p in self.actor_module.parameters() if p.requires_grad], actor.optim)
            scheduler = build_lr_scheduler(optimizer, actor.optim, actor.optim.total_training_steps)
        self.actor = DataParallelPPOActor(
            self.actor_module,
            self.config.model.use_remove_padding,
            actor,
            optimizer,
            scheduler,
            share_prompts=actor.share_prompts,
            chunk_logits=uses_fused_head(self.config.model.use_fused_kernels, self.actor_module),
            sp=self.sp,
            use_torch_compile=actor.use_torch_compile,
        )
        if self.sp:
            check_heads(self.hf_config, self.sp.size, SP_KEY)

    def _build_ref(self):
        """The reference policy: the actor's base model (under LoRA the actor's own module with its
        adapters off), or another model at `ref.model.path` (a distillation teacher; loaded on its
        own even under LoRA, where verl would take the actor's base)."""
        use_remove_padding = self.config.model.use_remove_padding
        other = self.config.ref.model.path
        if other is not None and other != self.config.model.path:
            path = model_path_in_shm(other) if self.config.model.use_shm else other
            ref_module, ref_config = self._load_causal_lm(self.config.ref.fsdp_config, trainable=False, path=path)
            # The engine, the checkpoints and the FLOPs count keep the policy's own config.
            self.hf_config = self.hf_config if self.actor_module is not None else ref_config
        elif self.is_lora and self.role.has_actor:
            self.ref_in_actor = True
            ref_module, ref_config = self.actor_module, self.hf_config
        else:
            ref_module, self.hf_config = self._load_causal_lm(self.config.ref.fsdp_config, trainable=False)
            ref_config = self.hf_config
        chunk_logits = uses_fused_head(self.config.model.use_fused_kernels, ref_module)
        self.ref = DataParallelPPOActor(
            ref_module,
            use_remove_padding,
            share_prompts=self.config.actor.share_prompts,
            chunk_logits=chunk_logits,
            sp=self.sp,
            use_torch_compile=self.config.ref.use_torch_compile,
        )
        if self.sp:
            check_heads(ref_config, self.sp.size, SP_KEY)

    def _build_rollout(self):
        cfg = self.config.rollout
        # TP: this rank's engine is one shard of its group's engine; the group shares its prompts.
        self.rollout_tp = tensor_parallel_group(int(cfg.tensor_model_parallel_size))
        check_engine_heads(self.hf_config, int(cfg.tensor_model_parallel_size))
        spec = engine_spec(cfg.name)
        if spec.takes_memory_share:
            # vLLM takes gpu_memory_utilization of the device or refuses to start: say so first.
            check_free_memory_for_engine(cfg.gpu_memory_utilization)
        self.rollout = build_engine(self.config.model, cfg, self.tokenizer, self.hf_config)
        tie = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        # An engine started on the checkpoint's own architecture reads its names.
        rename = self._engine_names() if spec.checkpoint_names else None
        self.weight_sync = EngineWeightSync(
            self.rollout, self._hf_state, cfg.update_weights_bucket_megabytes, tie, rename=rename
        )
        self.colocated = ColocatedEngine(
            self.rollout, self.weight_sync.sync, self._actor_on_device, bool(cfg.free_cache_engine)
        )
        self.colocated.release()  # its first weights are replaced before it generates

    def _engine_names(self):
        """None, or (language_model_only) the multimodal checkpoint's name of each trained weight:
        the names an engine started on that checkpoint reads (workers/language_model.py)."""
        model = self.config.model
        if not model.language_model_only:
            return None
        from workers.language_model import engine_namer

        return engine_namer(model.path, bool(model.trust_remote_code), LANGUAGE_MODEL_KEY)

    def _build_checkpointer(self):
        model = self.config.model
        self.checkpointer = FSDPCheckpointer(
            self.actor_module,
            self.actor.optimizer,
            self.actor.lr_scheduler,
            self.hf_config,
            self.tokenizer,
            model.path,
            hf_state_fn=self._hf_state,
            extra_state_fn=self._extra_state,
            load_extra_fn=self._load_extra_state,
            tie_word_embeddings=bool(getattr(self.hf_config, "tie_word_embeddings", False)),
        )

    def _hf_state(self):
        """The actor's state under Hugging Face names: LoRA adapters merged into the base."""
        return merged_state(self.actor_module) if is_peft_model(self.actor_module) else self.actor_module.state_dict()

    def _extra_state(self) -> dict:
        state_dict = getattr(self.rollout, "state_dict", None)
        return {"rollout": state_dict()} if state_dict is not None else {}

    def _load_extra_state(self, state: dict) -> None:
        if "rollout" in state and hasattr(self.rollout, "load_state_dict"):
            self.rollout.load_state_dict(state["rollout"])

    def _actor_on_device(self, optimizer: bool = False):
        optim = self.actor.optimizer if optimizer else None
        return on_device(self.actor_module, self.config.actor.fsdp_config, optim)

    def _ref_on_device(self):
        if self.ref_in_actor:
            return self._actor_on_device()
        return on_device(self.ref.module, self.config.ref.fsdp_config)

    def _require(self, what, method: str, role: str):
        if what is None:
            raise RuntimeError(f"{method} needs the {role} role; this worker's role is {self.role.value!r}")

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_reward_loop(self, handles: list, use_reward_fn: bool, reward_fn_key: str) -> None:
        """The reward loop's workers (hybrid/reward_loop.py): with agent loops (mode=async) each
        trajectory is scored by one as soon as it finishes; the lock-step rollout leaves
        scoring to the driver."""
        self._require(self.rollout, "set_reward_loop", "rollout")
        agents = getattr(self.rollout, "agents", None)
        if agents is not None:
            agents.set_reward_loop(handles, use_reward_fn, reward_fn_key)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_rollout_weights(self) -> float:
        """Load the actor's current weights into the rollout engine, in memory (a collective:
        every rank takes part). Returns this rank's seconds; the group call returns a list
        with one float per rank. The engine stays awake until its next generation."""
        self._require(self.weight_sync, "update_rollout_weights", "rollout")
        return self.colocated.load_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self, dtype_name: str):
        """The actor's full weights for rollout engines in other processes (a collective: every
        rank takes part), gathered as `update_rollout_weights` gathers them (the same names,
        LoRA merged, tied embeddings under both names) and cast to `dtype_name`, the engines'
        dtype ("bfloat16", "float32", ...). Rank 0 returns `[ObjectRef]` of a `SharedWeights`
        put once in Ray's object store (in a list, so the driver receives the reference, not
        the value); without Ray the list of (name, tensor) pairs itself. Other ranks: None."""
        self._require(self.actor, "export_weights", "actor")
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"export_weights: dtype_name={dtype_name!r} is not a torch floating-point dtype")
        tie = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        bucket_bytes = int(self.config.rollout.update_weights_bucket_megabytes) * 1024 * 1024
        with torch.no_grad(), self._actor_on_device():
            pairs = collect_full_weights(self._hf_state(), dtype, bucket_bytes, tie, keep=self.rank == 0)
        if pairs is None:
            return None
        # Engines started on the checkpoint read its names (HF generate: the trained class's).
        rename = self._engine_names() if engine_spec(self.config.rollout.name).checkpoint_names else None
        if rename is not None:
            pairs = [(rename(name), tensor) for name, tensor in pairs]
        import ray

        if not ray.is_initialized():
            return pairs
        same_as = {"lm_head.weight": "model.embed_tokens.weight"} if tie else None
        if same_as is not None and rename is not None:
            same_as = {rename(a): rename(b) for a, b in same_as.items()}
        return [ray.put(SharedWeights.from_pairs(pairs, same_as))]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self._require(self.rollout, "generate_sequences", "rollout")
        # A TP group's engine generates every member's prompts; each member returns its own samples.
        prompts = share_prompts(prompts, self.rollout_tp)
        start = time.perf_counter()
        # The engine's memory is taken for the call and released after it (workers/colocation.py).
        output = self.colocated.generate(lambda: self.rollout.generate_sequences(prompts))
        output.meta_info.setdefault("timing", {})["generate"] = time.perf_counter() - start
        return own_samples(output, self.rollout_tp)

    # ------------------------------------------------------------------ log-probs
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        self._require(self.actor, "compute_log_prob", "actor or rollout")
        rollout = self.config.rollout
        with self._actor_on_device():
            log_probs, entropy = self.actor.compute_log_prob(
                gather_group_rows(data, self.sp),
                rollout.log_prob_batching,
                rollout.temperature,
                calculate_entropy=True,
            )
        return DataProto.from_dict(
            tensors={"old_log_probs": own_rows(log_probs, self.sp), "entropys": own_rows(entropy, self.sp)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        self._require(self.ref, "compute_ref_log_prob", "ref")
        batching, temperature = self.config.ref.log_prob_batching, self.config.rollout.temperature
        data = gather_group_rows(data, self.sp)
        with self._ref_on_device():
            if self.ref_in_actor:
                with self.actor_module.disable_adapter():
                    log_probs, _ = self.ref.compute_log_prob(data, batching, temperature)
            else:
                log_probs, _ = self.ref.compute_log_prob(data, batching, temperature)
        return DataProto.from_dict(tensors={"ref_log_prob": own_rows(log_probs, self.sp)})

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update; the engine keeps the old weights until update_rollout_weights."""
        self._require(None if self.actor is None else self.actor.optimizer, "update_actor", "actor")
        with self._actor_on_device(optimizer=True):
            start = time.perf_counter()
            metrics = self.actor.update_policy(gather_group_rows(data, self.sp), self.config.rollout.temperature)
            seconds = time.perf_counter() - start
            metrics["perf/update_actor_s"] = seconds
        metrics.update(update_mfu("actor", self.hf_config, data, seconds, self.config.actor.ppo_epochs))
        return DataProto(meta_info={"metrics": metrics})

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> dict:
        """Write this rank's actor shard, optimizer, scheduler and RNG into `local_path`.

        `local_path` is the driver's temporary folder; it renames it once every rank of
        every role has returned, and only then applies `max_ckpt_to_keep` (deleting old
        checkpoints before the new one is complete could leave none), so the argument is
        accepted here for verl's call signature and used by the driver.
        """
        self._require(self.checkpointer, "save_checkpoint", "actor")
        with self._actor_on_device():
            return self.checkpointer.save(local_path, global_step, list(self.config.actor.checkpoint.save_contents))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf_model(self, local_path: str) -> float:
        """The actor as a Hugging Face folder in `local_path` (trainer.hf_save_freq); seconds."""
        self._require(self.checkpointer, "export_hf_model", "actor")
        with self._actor_on_device():
            return self.checkpointer.export_hf(local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        """Load this rank's actor state; the engine needs update_rollout_weights before it generates again."""
        self._require(self.checkpointer, "load_checkpoint", "actor")
        with self._actor_on_device(optimizer=True):
            timing = self.checkpointer.load(local_path, list(self.config.actor.checkpoint.load_contents))
        if self.colocated is not None:
            self.colocated.forget_weights()  # the engine holds the weights the checkpoint replaced
        return timing

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weights_digest(self) -> dict[str, float]:
        """Sum and sum of squares of every full actor parameter: a cheap fingerprint."""
        from torch.distributed.tensor import DTensor

        from workers.device import for_collective

        total = sq = 0.0
        with self._actor_on_device():
            for _, p in self.actor_module.named_parameters():
                # An offloaded shard goes to the device first: NCCL gathers device tensors only.
                t = for_collective(p).full_tensor() if isinstance(p, DTensor) else p
                t = t.detach().double()
                total += float(t.sum())
                sq += float(t.pow(2).sum())
        return {"sum": total, "sumsq": sq}
