"""A tiny random Qwen3.5 multimodal checkpoint (transformers' Qwen3_5ForConditionalGeneration:
a vision encoder and a 2-layer, hidden-64 language model, one linear-attention and one
full-attention layer, its output layer tied to the embedding as Qwen3.5-0.8B's) over the
SmolLM2 tokenizer, for the tests of `model.language_model_only`."""

from __future__ import annotations


def build_tiny_qwen35_dir(out_dir, tokenizer, seed: int = 0) -> str:
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen3_5 import Qwen3_5Config

    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    torch.manual_seed(seed)
    AutoModelForImageTextToText.from_config(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)
