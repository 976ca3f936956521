"""Shared pieces of the hybrid-engine tests: configs for tiny models and prompt batches."""

from __future__ import annotations

import numpy as np
import torch

from protocol.data_proto import DataProto

PROMPTS = [
    "What is 2 + 3?",
    "Name a colour.",
    "Count to five.",
    "What is the capital of France?",
]


def engine_config(model_dir: str, *extra: str, n: int = 2, response_length: int = 12, ranks: int = 1):
    """The typed config (HybridConfig) of a tiny-model job on `ranks` ranks; workers get its
    sections. Updates take old log-probs from the batch (the tests run that pass themselves);
    a test of the on-policy path sets actor.skip_old_log_prob_on_policy=true."""
    from hybrid.config import build_config

    overrides = [
        f"trainer.n_gpus_per_node={ranks}",
        "actor_rollout_ref.actor.skip_old_log_prob_on_policy=false",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.n={n}",
        f"data.max_response_length={response_length}",
        "data.max_prompt_length=32",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.max_num_batched_tokens=512",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.cpu_kvcache_space_gb=1",
        *extra,
    ]
    return build_config(overrides)


def prompt_batch(tokenizer, texts=PROMPTS, max_len: int = 32) -> DataProto:
    rows = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        for t in texts
    ]
    rows = [list(r["input_ids"]) if hasattr(r, "keys") else list(r) for r in rows]
    ids = torch.full((len(rows), max_len), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), max_len), dtype=torch.long)
    for i, r in enumerate(rows):
        r = r[-max_len:]
        ids[i, max_len - len(r) :] = torch.tensor(r)
        mask[i, max_len - len(r) :] = 1
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        non_tensors={"raw_text": np.array(list(texts), dtype=object)},
    )


def with_advantages(batch: DataProto, seed: int = 0) -> DataProto:
    """Attach old log-probs and random per-sequence advantages for an update."""
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn(len(batch), 1, generator=gen).expand_as(batch.batch["response_mask"]).clone()
    batch.batch["advantages"] = adv * batch.batch["response_mask"]
    return batch


def synthetic_rollout(tokenizer, n: int = 2, response_length: int = 12, seed: int = 0) -> DataProto:
    """A rollout-shaped batch (no engine needed): random responses of different lengths."""
    prompts = prompt_batch(tokenizer).repeat(repeat_times=n, interleave=True)
    gen = torch.Generator().manual_seed(seed)
    batch = len(prompts)
    responses = torch.randint(0, 1000, (batch, response_length), generator=gen)
    lengths = torch.randint(3, response_length + 1, (batch,), generator=gen)
    response_mask = (torch.arange(response_length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, tokenizer.pad_token_id))
    p_ids, p_mask, p_pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    r_pos = p_pos[:, -1:] + torch.arange(1, response_length + 1).unsqueeze(0)
    tensors = {
        "prompts": p_ids,
        "responses": responses,
        "input_ids": torch.cat([p_ids, responses], -1),
        "attention_mask": torch.cat([p_mask, response_mask], -1),
        "position_ids": torch.cat([p_pos, r_pos], -1),
        "response_mask": response_mask,
    }
    return with_advantages(DataProto.from_dict(tensors=tensors), seed=seed)


def actor_group(cfg, ray_ranks: int | None):
    """An actor-role worker group: one rank in process (None) or `ray_ranks` Ray ranks
    (Ray must be running; the group keeps its pool as `.pool`)."""
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    if ray_ranks is None:
        from hybrid.controller.local_worker_group import LocalWorkerGroup

        group = LocalWorkerGroup(ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor")
    else:
        from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup

        pool = RayResourcePool(nnodes=1, slots_per_node=ray_ranks, use_gpu=False, cpus_per_slot=1)
        group = RayWorkerGroup(
            pool, ActorRolloutRefWorker, cfg.actor_rollout_ref, role="actor", name=f"actor{ray_ranks}"
        )
        group.pool = pool
    group.init_model()
    return group


def logp_update_logp(group, batch):
    """Log-probs, one update's metrics, log-probs after it."""
    before = group.compute_log_prob(batch).batch["old_log_probs"]
    batch = batch.select(deepcopy=True).union(DataProto.from_dict(tensors={"old_log_probs": before}))
    metrics = group.update_actor(batch).meta_info["metrics"]
    after = group.compute_log_prob(batch).batch["old_log_probs"]
    return before, metrics, after


# How much the transformer layers' weights are scaled; see `sharp_weights`.
SHARPEN = 10.0


def sharp_weights(model_dir) -> dict[str, torch.Tensor]:
    """The folder model's weights with its layers (not norms or embeddings) scaled up. At the
    initial std of 0.02 the layers barely move the residual stream, and the tied output
    layer makes greedy decoding repeat the last prompt token whatever came before; scaled,
    the output depends on the context, so equal token ids across engines mean something."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {
        name: (t * SHARPEN if ".layers." in name and "norm" not in name else t).clone()
        for name, t in model.state_dict().items()
    }


def sharp_engine(model_dir: str, tokenizer, *overrides: str, n: int = 1, response_length: int = 12):
    """An in-process vLLM engine (VLLMRollout) on the tiny model with `sharp_weights` loaded."""
    from transformers import AutoConfig

    from workers.rollout.vllm_rollout import VLLMRollout

    cfg = engine_config(
        model_dir,
        "actor_rollout_ref.rollout.load_format=dummy_dtensor",
        *overrides,
        n=n,
        response_length=response_length,
    )
    hf_config = AutoConfig.from_pretrained(model_dir)
    engine = VLLMRollout(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, tokenizer, hf_config)
    engine.update_weights(list(sharp_weights(model_dir).items()))
    return engine


def chat_batch(tokenizer, chats, width=48, **columns) -> DataProto:
    """Prompts as the data loader makes them (template text -> tokens, left padded) with
    the non-tensor fields the worker passes (raw_prompt, index, reward_model, ...)."""
    ids = torch.full((len(chats), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(chats), width), dtype=torch.long)
    for i, chat in enumerate(chats):
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        row = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    non_tensors = {
        "raw_prompt": chats,
        "index": list(range(len(chats))),
        "reward_model": [{"ground_truth": "68"}] * len(chats),
        "extra_info": [{"index": i} for i in range(len(chats))],
        **columns,
    }
    arrays = {}
    for key, values in non_tensors.items():
        arrays[key] = np.empty(len(chats), dtype=object)
        arrays[key][:] = values
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
        non_tensors=arrays,
    )


def classifier_dir(out_dir, tokenizer, chat_template: str | None = None) -> str:
    """A tiny random one-output sequence classifier (a reward model) with the SmolLM2 tokenizer,
    optionally with another chat template."""
    from transformers import AutoModelForSequenceClassification

    from tests.conftest import tiny_llama_config

    config = tiny_llama_config(tokenizer, num_labels=1)
    torch.manual_seed(3)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out_dir)
    if chat_template is not None:
        tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)
