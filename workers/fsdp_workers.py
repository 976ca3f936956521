"""The workers a worker group places on each device slot.

`ActorRolloutRefWorker` fuses the roles of the hybrid engine in one process: the FSDP2
actor (training), the rollout engine (vLLM in process, or transformers' generate) fed
with the actor's weights in memory, and the frozen reference policy. Its role string
picks what it holds: `actor`, `rollout`, `ref`, `actor_rollout`, `actor_rollout_ref`.
`CriticWorker` holds the value model, `RewardModelWorker` a sequence-classification
reward model. Every public method takes and returns a DataProto and declares how a
worker group splits its input (`@register`).
"""

from __future__ import annotations

import time

import torch
from codetiming import Timer

from protocol.data_proto import DataProto
from protocol.dispatch import Dispatch, register
from workers.actor import DataParallelPPOActor
from workers.base import Worker
from workers.critic import DataParallelPPOCritic
from workers.device import current_device, require_cuda
from workers.fsdp_utils import (
    apply_fsdp2,
    build_lr_scheduler,
    build_optimizer,
    load_optimizer,
    load_params,
    offload_optimizer,
    offload_params,
    resolve_mixed_precision,
)
from workers.checkpoint import FSDPCheckpointer
from workers.lora import apply_lora, is_peft_model, lora_rank, merged_state
from workers.packed_attention import register_packed_attention
from workers.sharding import EngineWeightSync

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


def _load_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_hf_model(auto_cls, model_config, fsdp_config, seed: int, trainable: bool, lora: bool = False, **extra):
    """fp32 master weights on the host, then FSDP2 over all ranks with the chosen compute dtype.

    With `lora` the model is wrapped in peft LoRA adapters before sharding (workers/lora.py).
    """
    from transformers import AutoConfig

    path = model_config.path
    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=bool(model_config.get("trust_remote_code", False)))
    for key, value in dict(model_config.get("override_config") or {}).items():
        setattr(hf_config, key, value)
    for key, value in extra.items():
        setattr(hf_config, key, value)
    torch.manual_seed(seed)  # freshly initialised heads (the critic's) must agree across ranks
    module = auto_cls.from_pretrained(
        path, config=hf_config, dtype=torch.float32, attn_implementation=register_packed_attention(),
        trust_remote_code=bool(model_config.get("trust_remote_code", False)),
    )
    if model_config.get("use_liger", False):
        require_cuda("actor_rollout_ref.model.use_liger")
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=module)
    if trainable and model_config.get("enable_gradient_checkpointing", False):
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not trainable:
        module.requires_grad_(False)
    if lora:
        if trainable and model_config.get("enable_gradient_checkpointing", False):
            # Frozen embeddings give checkpointed blocks inputs without grad; peft's fix.
            module.enable_input_require_grads()
        module = apply_lora(module, model_config)
    module.to(current_device())
    param_dtype = resolve_mixed_precision(fsdp_config.get("mixed_precision", "auto"))
    apply_fsdp2(module, fsdp_config, param_dtype)
    return module, hf_config


def _timed(meta: dict, name: str, seconds: float) -> None:
    meta.setdefault("timing", {})[name] = seconds


class ActorRolloutRefWorker(Worker):
    """config: the `actor_rollout_ref` section of the trainer config."""

    def __init__(self, config, role: str):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"role={role!r} is not one of {', '.join(ROLES)}")
        self.config = config
        self.role = role
        self.is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self.is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self.is_ref = role in ("ref", "actor_rollout_ref")
        self.actor = self.ref = self.rollout = self.weight_sync = self.checkpointer = None
        # LoRA: the reference policy is the actor's own module with its adapters disabled.
        self.is_lora = lora_rank(config.model) > 0
        self.ref_in_actor = False

    def _per_rank(self, prompts_or_samples: int) -> int:
        return max(prompts_or_samples // self.world_size, 1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        cfg = self.config
        model_cfg = cfg.model
        self.tokenizer = _load_tokenizer(model_cfg.get("tokenizer_path") or model_cfg.path, bool(model_cfg.get("trust_remote_code", False)))
        seed = int(cfg.rollout.get("seed", 0))
        if self.is_actor or (self.is_rollout and not self.is_actor):
            from transformers import AutoModelForCausalLM

            fsdp = cfg.actor.fsdp_config
            module, self.hf_config = _load_hf_model(
                AutoModelForCausalLM, model_cfg, fsdp, seed, trainable=self.is_actor, lora=self.is_lora and self.is_actor
            )
            self.actor_module = module
            optimizer = scheduler = None
            if self.is_actor:
                # Only what trains: under LoRA the frozen base weights get no optimizer state.
                optimizer = build_optimizer([p for p in module.parameters() if p.requires_grad], cfg.actor.optim)
                scheduler = build_lr_scheduler(optimizer, cfg.actor.optim, int(cfg.actor.optim.get("total_training_steps", 1)))
            actor_cfg = cfg.actor
            self.actor = DataParallelPPOActor(actor_cfg, module, optimizer, scheduler)
            self.actor.use_remove_padding = bool(model_cfg.get("use_remove_padding", True))
        if self.is_ref and self.is_lora and self.is_actor:
            self.ref_in_actor = True
            self.ref = DataParallelPPOActor(cfg.actor, self.actor_module)
            self.ref.use_remove_padding = bool(model_cfg.get("use_remove_padding", True))
        elif self.is_ref:
            from transformers import AutoModelForCausalLM

            ref_module, self.hf_config = _load_hf_model(AutoModelForCausalLM, model_cfg, cfg.ref.fsdp_config, seed, trainable=False)
            self.ref = DataParallelPPOActor(cfg.actor, ref_module)
            self.ref.use_remove_padding = bool(model_cfg.get("use_remove_padding", True))
        if self.is_rollout:
            self._build_rollout()
        if self.is_actor:
            tie = bool(getattr(self.hf_config, "tie_word_embeddings", False))
            self.checkpointer = FSDPCheckpointer(
                self.actor_module, self.actor.optimizer, self.actor.lr_scheduler, self.hf_config, self.tokenizer,
                model_cfg.path, hf_state_fn=self._hf_state, extra_state_fn=self._extra_state,
                load_extra_fn=self._load_extra_state, tie_word_embeddings=tie,
            )
        return True

    def _hf_state(self):
        """The actor's state under Hugging Face names: LoRA adapters merged into the base."""
        return merged_state(self.actor_module) if is_peft_model(self.actor_module) else self.actor_module.state_dict()

    def _extra_state(self) -> dict:
        state_dict = getattr(self.rollout, "state_dict", None)
        return {"rollout": state_dict()} if state_dict is not None else {}

    def _load_extra_state(self, state: dict) -> None:
        if "rollout" in state and hasattr(self.rollout, "load_state_dict"):
            self.rollout.load_state_dict(state["rollout"])

    def _build_rollout(self):
        cfg = self.config.rollout
        name = cfg.get("name", "vllm")
        if name == "vllm":
            from workers.rollout.vllm_rollout import VLLMRollout as engine_cls
        elif name == "hf":
            from workers.rollout.hf_rollout import HFRollout as engine_cls
        else:
            raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not supported; supported: vllm, hf")
        self.rollout = engine_cls(self.config.model.path, cfg, self.tokenizer, self.hf_config)
        tie = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        self.weight_sync = EngineWeightSync(
            self.rollout, self._hf_state, int(cfg.get("update_weights_bucket_megabytes", 128)), tie
        )

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        fsdp = self.config.actor.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.actor_module)
        sync_s = self.weight_sync.sync()
        if fsdp.get("param_offload", False):
            offload_params(self.actor_module)
        # A sync only happens when the weights changed; after a validation pass the engine
        # may be asleep with unchanged weights, so wake it in any case (no-op when awake).
        self.rollout.wake_up()
        with Timer(name="gen", logger=None) as timer:
            output = self.rollout.generate_sequences(prompts)
        if self.config.rollout.get("free_cache_engine", False):
            self.rollout.sleep()
        _timed(output.meta_info, "update_weights", sync_s)
        _timed(output.meta_info, "generate", timer.last)
        return output

    # ------------------------------------------------------------------ log-probs
    def _log_prob_meta(self, data: DataProto, section) -> None:
        data.meta_info.setdefault("temperature", float(self.config.rollout.temperature))
        data.meta_info["micro_batch_size"] = int(section.get("log_prob_micro_batch_size_per_gpu") or 16)
        data.meta_info["use_dynamic_bsz"] = bool(section.get("log_prob_use_dynamic_bsz", False))
        data.meta_info["max_token_len"] = int(section.get("log_prob_max_token_len_per_gpu", 16384))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        self._log_prob_meta(data, self.config.rollout)
        if self.config.actor.fsdp_config.get("param_offload", False):
            load_params(self.actor_module)
        log_probs, entropy = self.actor.compute_log_prob(data, calculate_entropy=True)
        return DataProto.from_dict(
            tensors={"old_log_probs": log_probs, "entropys": entropy},
            meta_info={"temperature": data.meta_info["temperature"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref is None:
            raise RuntimeError(f"compute_ref_log_prob needs the ref role; this worker's role is {self.role!r}")
        self._log_prob_meta(data, self.config.ref)
        if self.ref_in_actor:
            with self.actor_module.disable_adapter():
                log_probs, _ = self.ref.compute_log_prob(data, calculate_entropy=False)
        else:
            log_probs, _ = self.ref.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs})

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        if self.actor is None or self.actor.optimizer is None:
            raise RuntimeError(f"update_actor needs the actor role; this worker's role is {self.role!r}")
        cfg = self.config
        fsdp = cfg.actor.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.actor_module)
        if fsdp.get("optimizer_offload", False):
            load_optimizer(self.actor.optimizer)
        data.meta_info.setdefault("temperature", float(cfg.rollout.temperature))
        data.meta_info["ppo_mini_batch_size"] = self._per_rank(int(cfg.actor.ppo_mini_batch_size) * int(cfg.rollout.n))
        start = time.perf_counter()
        metrics = self.actor.update_policy(data)
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        if self.weight_sync is not None:
            self.weight_sync.mark_dirty()
        if fsdp.get("optimizer_offload", False):
            offload_optimizer(self.actor.optimizer)
        if fsdp.get("param_offload", False):
            offload_params(self.actor_module)
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
        if self.checkpointer is None:
            raise RuntimeError(f"save_checkpoint needs the actor role; this worker's role is {self.role!r}")
        fsdp = self.config.actor.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.actor_module)
        timing = self.checkpointer.save(local_path, global_step, list(self.config.actor.checkpoint.save_contents))
        if fsdp.get("param_offload", False):
            offload_params(self.actor_module)
        return timing

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        if self.checkpointer is None:
            raise RuntimeError(f"load_checkpoint needs the actor role; this worker's role is {self.role!r}")
        fsdp = self.config.actor.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.actor_module)
        timing = self.checkpointer.load(local_path, list(self.config.actor.checkpoint.load_contents))
        if fsdp.get("param_offload", False):
            offload_params(self.actor_module)
        if fsdp.get("optimizer_offload", False) and self.actor.optimizer is not None:
            offload_optimizer(self.actor.optimizer)
        if self.weight_sync is not None:
            self.weight_sync.mark_dirty()  # the engine still holds the initial weights
        return timing

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def sync_rollout_weights(self) -> float:
        """Force a weight sync now (benchmarks); returns the seconds it took."""
        return self.weight_sync.sync(force=True)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weights_digest(self) -> dict[str, float]:
        """Sum and sum of squares of every full actor parameter: a cheap fingerprint."""
        from torch.distributed.tensor import DTensor

        total = sq = 0.0
        for _, p in self.actor_module.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            t = t.detach().double()
            total += float(t.sum())
            sq += float(t.pow(2).sum())
        return {"sum": total, "sumsq": sq}


class CriticWorker(Worker):
    """config: the `critic` section of the trainer config."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from transformers import AutoModelForTokenClassification

        cfg = self.config
        module, self.hf_config = _load_hf_model(
            AutoModelForTokenClassification, cfg.model, cfg.model.fsdp_config, seed=0, trainable=True, num_labels=1,
            # As verl: no dropout on the value head, so values are deterministic functions of the weights.
            classifier_dropout=0.0
        )
        if cfg.model.get("enable_gradient_checkpointing", False):
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = build_optimizer(module.parameters(), cfg.optim)
        scheduler = build_lr_scheduler(optimizer, cfg.optim, int(cfg.optim.get("total_training_steps", 1)))
        self.critic = DataParallelPPOCritic(cfg, module, optimizer, scheduler)
        self.critic.use_remove_padding = bool(cfg.model.get("use_remove_padding", True))
        self.module = module
        tokenizer_path = cfg.model.get("tokenizer_path") or cfg.model.path
        self.checkpointer = FSDPCheckpointer(
            module, optimizer, scheduler, self.hf_config,
            _load_tokenizer(tokenizer_path, bool(cfg.model.get("trust_remote_code", False))), cfg.model.path,
            tie_word_embeddings=bool(getattr(self.hf_config, "tie_word_embeddings", False)),
        )
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> dict:
        """As ActorRolloutRefWorker.save_checkpoint (retention is the driver's, after the rename)."""
        fsdp = self.config.model.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.module)
        timing = self.checkpointer.save(local_path, global_step, list(self.config.checkpoint.save_contents))
        if fsdp.get("param_offload", False):
            offload_params(self.module)
        return timing

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        fsdp = self.config.model.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.module)
        timing = self.checkpointer.load(local_path, list(self.config.checkpoint.load_contents))
        if fsdp.get("param_offload", False):
            offload_params(self.module)
        if fsdp.get("optimizer_offload", False):
            offload_optimizer(self.critic.optimizer)
        return timing

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        cfg = self.config
        data.meta_info["micro_batch_size"] = int(cfg.get("forward_micro_batch_size_per_gpu") or 16)
        data.meta_info["use_dynamic_bsz"] = bool(cfg.get("use_dynamic_bsz", False))
        data.meta_info["max_token_len"] = int(cfg.get("forward_max_token_len_per_gpu", 32768))
        if cfg.model.fsdp_config.get("param_offload", False):
            load_params(self.module)
        values = self.critic.compute_values(data)
        return DataProto.from_dict(tensors={"values": values})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        cfg = self.config
        fsdp = cfg.model.fsdp_config
        if fsdp.get("param_offload", False):
            load_params(self.module)
        if fsdp.get("optimizer_offload", False):
            load_optimizer(self.critic.optimizer)
        n = int(data.meta_info.get("rollout_n", 1))
        data.meta_info["ppo_mini_batch_size"] = max(int(cfg.ppo_mini_batch_size) * n // self.world_size, 1)
        metrics = self.critic.update_critic(data)
        if fsdp.get("optimizer_offload", False):
            offload_optimizer(self.critic.optimizer)
        if fsdp.get("param_offload", False):
            offload_params(self.module)
        return DataProto(meta_info={"metrics": metrics})


class RewardModelWorker(Worker):
    """config: the `reward_model` section. A sequence classifier scores prompt+response.

    When the reward model's tokenizer or chat template differs from the policy's
    (`reward_model.model.input_tokenizer`), each sample is decoded with the policy's
    tokenizer and re-templated with the reward model's before scoring.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from transformers import AutoModelForSequenceClassification

        cfg = self.config
        self.rm_tokenizer = _load_tokenizer(cfg.model.path, bool(cfg.model.get("trust_remote_code", False)))
        input_path = cfg.model.get("input_tokenizer")
        self.input_tokenizer = _load_tokenizer(input_path, False) if input_path else None
        self.retemplate = self.input_tokenizer is not None and (
            self.input_tokenizer.chat_template != self.rm_tokenizer.chat_template
            or self.input_tokenizer.get_vocab() != self.rm_tokenizer.get_vocab()
        )
        self.module, _ = _load_hf_model(
            AutoModelForSequenceClassification, cfg.model, cfg.model.fsdp_config, seed=0, trainable=False,
            num_labels=1, pad_token_id=self.rm_tokenizer.pad_token_id,
        )
        return True

    def _retemplated_batch(self, data: DataProto):
        tok_in, tok_rm = self.input_tokenizer, self.rm_tokenizer
        prompts = data.batch["prompts"]
        responses = data.batch["responses"]
        response_mask = data.batch["response_mask"]
        prompt_mask = data.batch["attention_mask"][:, : prompts.shape[1]]
        rows = []
        for i in range(len(data)):
            prompt_text = tok_in.decode(prompts[i][prompt_mask[i].bool()], skip_special_tokens=True)
            raw = data.non_tensor_batch.get("raw_prompt")
            chat = list(raw[i]) if raw is not None else [{"role": "user", "content": prompt_text}]
            response_text = tok_in.decode(responses[i][response_mask[i].bool()], skip_special_tokens=True)
            chat = chat + [{"role": "assistant", "content": response_text}]
            ids = tok_rm.apply_chat_template(chat, tokenize=True)
            ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
            max_len = self.config.get("max_length")
            rows.append(ids[-int(max_len):] if max_len else ids)
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), tok_rm.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
            attention_mask[i, : len(r)] = 1
        return input_ids, attention_mask

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def compute_rm_score(self, data: DataProto) -> DataProto:
        self.module.eval()
        if self.retemplate:
            input_ids, attention_mask = self._retemplated_batch(data)
            position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
        else:
            input_ids = data.batch["input_ids"]
            attention_mask = data.batch["attention_mask"]
            position_ids = data.batch["position_ids"]
        micro = int(self.config.get("micro_batch_size_per_gpu") or 16)
        scores = []
        device = current_device()
        for start in range(0, len(data), micro):
            sl = slice(start, start + micro)
            out = self.module(
                input_ids=input_ids[sl].to(device), attention_mask=attention_mask[sl].to(device),
                position_ids=position_ids[sl].to(device), use_cache=False,
            )
            scores.append(out.logits[:, 0].float().cpu())
        scores = torch.cat(scores) if scores else torch.zeros(0)
        response_mask = data.batch["response_mask"]
        rm_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
        last = (response_mask.sum(-1) - 1).clamp(min=0)
        rm_scores[torch.arange(len(data)), last] = scores
        return DataProto.from_dict(tensors={"rm_scores": rm_scores})
