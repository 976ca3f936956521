"""Loading a Hugging Face tokenizer and model, and sharding the model with FSDP2.

Every worker builds its models here: the actor and reference policy (causal LMs), the
critic (a token classifier with one label) and the reward model (a sequence classifier).
The caller passes what its own config section says; nothing here reads a section key that
only some sections have.
"""

from __future__ import annotations

import torch

from workers.device import current_device, require_cuda
from workers.fsdp_utils import apply_fsdp2, resolve_mixed_precision
from workers.lora import apply_lora
from workers.packed_attention import register_packed_attention


def load_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_hf_model(
    auto_cls,
    path: str,
    fsdp_config,
    *,
    seed: int,
    trainable: bool,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    gradient_checkpointing: bool = False,
    use_liger: bool = False,
    lora_config=None,
    offload_policy: bool = False,
    **hf_config_overrides,
):
    """fp32 master weights on the host, then FSDP2 over all ranks with the compute dtype of
    `fsdp_config.mixed_precision`; returns (module, hf_config).

    `override_config` and `hf_config_overrides` are set on the Hugging Face config before the
    weights load. With `lora_config` (the actor's model section, lora_rank > 0) the model is
    wrapped in peft LoRA adapters before sharding (workers/lora.py). A frozen model
    (`trainable=False`) gets no gradients and no gradient checkpointing.
    """
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in {**dict(override_config or {}), **hf_config_overrides}.items():
        setattr(hf_config, key, value)
    torch.manual_seed(seed)  # freshly initialised heads (the critic's) must agree across ranks
    module = auto_cls.from_pretrained(
        path, config=hf_config, dtype=torch.float32, attn_implementation=register_packed_attention(),
        trust_remote_code=trust_remote_code,
    )
    if use_liger:
        require_cuda("actor_rollout_ref.model.use_liger")
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=module)
    checkpointing = trainable and gradient_checkpointing
    if checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not trainable:
        module.requires_grad_(False)
    if lora_config is not None:
        if checkpointing:
            # Frozen embeddings give checkpointed blocks inputs without grad; peft's fix.
            module.enable_input_require_grads()
        module = apply_lora(module, lora_config)
    module.to(current_device())
    param_dtype = resolve_mixed_precision(fsdp_config.mixed_precision)
    apply_fsdp2(module, param_dtype, fsdp_config.reshard_after_forward, offload_policy)
    return module, hf_config
