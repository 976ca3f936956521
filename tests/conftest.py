"""Shared fixtures: the default model folder, its tokenizer, and tiny random models built
from a config (2 layers, hidden 64) that reuse the SmolLM2 tokenizer."""

from __future__ import annotations

import collections
import os
import sys
import threading

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


# Threads each test module left running, reported at the end of the run (the suite's process
# has been seen holding ~290 threads and 13 GB late in a run: this says which modules leave them).
THREADS_LEFT: dict[str, collections.Counter] = {}


@pytest.fixture(scope="module", autouse=True)
def report_threads_left_behind(request):
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t for t in threading.enumerate() if t.is_alive() and t.ident not in before]
    if left:
        # Names end in counters (Thread-12, env-worker-3): grouped by their stem.
        THREADS_LEFT[request.module.__name__] = collections.Counter(t.name.rstrip("0123456789-_ ()") for t in left)


def pytest_terminal_summary(terminalreporter):
    if not THREADS_LEFT:
        return
    terminalreporter.section("threads left running by test modules")
    ranked = sorted(THREADS_LEFT.items(), key=lambda item: -sum(item[1].values()))
    for module, names in ranked[:15]:
        terminalreporter.write_line(f"{sum(names.values()):4d} {module}: {dict(names.most_common(4))}")
    alive = len(threading.enumerate())
    terminalreporter.write_line(f"{alive} threads alive at the end, {len(THREADS_LEFT)} modules left some")


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
