"""Frozen parameters (workers/freeze.py): ROLL's freeze_module_prefix on a text model, verl's
freeze_vision_tower on a vision-language one, and the refusals."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_prefixes_as_roll_splits_them():
    from workers.freeze import prefixes_of

    assert prefixes_of(" model.visual , lm_head") == ["model.visual", "lm_head"]
    assert prefixes_of(("a", "b")) == ["a", "b"] and prefixes_of(None) == []


def test_module_prefix_on_a_text_model(llama):
    from workers.freeze import freeze

    llama.requires_grad_(True)
    frozen = freeze(llama, False, "model.embed_tokens,model.layers.0.", is_lora=False)
    expected = ["model.embed_tokens.weight"] + [
        n for n, _ in llama.named_parameters() if n.startswith("model.layers.0.")
    ]
    assert frozen == expected and len(expected) == 10
    assert all(p.requires_grad for n, p in llama.named_parameters() if n not in expected)


def test_refusals(llama):
    from workers.freeze import freeze

    with pytest.raises(ValueError) as err:
        freeze(llama, False, "visual", is_lora=False)
    assert str(err.value) == (
        "actor_rollout_ref.actor.freeze_module_prefix: no parameter name starts with 'visual' (names start with "
        "lm_head., model.; e.g. model.embed_tokens.weight)"
    )
    with pytest.raises(ValueError, match="freeze_module_prefix with LoRA: the adapters already leave the base model"):
        freeze(llama, False, "model.layers.0.", is_lora=True)


def test_vision_tower(llama, default_model_dir, capsys):
    import torch
    from transformers.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    from tests.integration.vision_helpers import tiny_qwen25_vl_config, vision_tokenizer
    from workers.freeze import freeze

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(tiny_qwen25_vl_config(vision_tokenizer(default_model_dir)))
    frozen = freeze(model, True, None, is_lora=False)
    visual = [n for n, _ in model.named_parameters() if n.startswith("model.visual.")]
    assert frozen == visual and len(visual) > 10
    llama.requires_grad_(True)
    assert freeze(llama, True, None, is_lora=False) == []
    assert "the model has no vision tower; all of it trains" in capsys.readouterr().out
