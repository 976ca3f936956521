"""Shared fixtures: the default model folder, its tokenizer, and tiny random models built
from a config (2 layers, hidden 64) that reuse the SmolLM2 tokenizer."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="module", autouse=True)
def no_ray_cluster_left_behind():
    """A test that trains through Ray in this process (hybrid.run starts the cluster and leaves
    it up, as a driver script does) must not hand it to the next module: the modules that start
    their own with ray.init would fail with "ray.init twice"."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    from hybrid.defaults import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def tiny_llama_config(tokenizer, **overrides):
    """The tiny models' shape (2 layers, hidden 64, head size 32: the smallest the vLLM CPU
    attention backend supports) over the SmolLM2 tokenizer's vocabulary; `overrides` add to it
    or replace its sizes."""
    from transformers import LlamaConfig

    shape = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    return LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **{**shape, **overrides})


def build_tiny_model_dir(out_dir, tokenizer, seed: int = 0, tie_word_embeddings: bool = True, **shape) -> str:
    """A Llama with random weights and the SmolLM2 tokenizer: 2 layers, hidden 64, or the sizes
    `shape` gives (hidden_size, num_hidden_layers, num_attention_heads, ...)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_llama_config(
        tokenizer,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        **shape,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"), tokenizer)
