"""Shared fixtures: the default model folder, its tokenizer, and tiny random models built
from a config (2 layers, hidden 64) that reuse the SmolLM2 tokenizer; the end-of-run report
of threads and resident memory each test module left behind (xdist workers' included)."""

from __future__ import annotations

import collections
import os
import resource
import sys
import tempfile
import threading

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Under pytest-xdist (make test runs two worker processes) each worker keeps its Ray clusters
# in a temp folder of its own: ray.init() without an address joins the newest cluster of its
# temp folder, which would be the other worker's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("RAY_TMPDIR", os.path.join(tempfile.gettempdir(), f"ray_{os.environ['PYTEST_XDIST_WORKER']}"))


@pytest.fixture(scope="module", autouse=True)
def no_ray_cluster_left_behind():
    """A test that trains through Ray in this process (hybrid.run starts the cluster and leaves
    it up, as a driver script does) must not hand it to the next module: the modules that start
    their own with ray.init would fail with "ray.init twice"."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


# Threads each test module left running and the growth of the process's resident memory
# across it, reported at the end of the run (the suite's process has been seen holding ~290
# threads and 12 GB late in a run: this says which modules leave them).
THREADS_LEFT: dict[str, dict[str, int]] = {}
RSS_GROWTH_MB: dict[str, float] = {}


def resident_mb() -> float:
    """This process's resident memory now (Linux: /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


@pytest.fixture(scope="module", autouse=True)
def report_threads_left_behind(request):
    before = {t.ident for t in threading.enumerate()}
    rss_before = resident_mb()
    yield
    RSS_GROWTH_MB[request.module.__name__] = resident_mb() - rss_before
    left = [t for t in threading.enumerate() if t.is_alive() and t.ident not in before]
    if left:
        # Names end in counters (Thread-12, env-worker-3): grouped by their stem.
        names = collections.Counter(t.name.rstrip("0123456789-_ ()") for t in left)
        THREADS_LEFT[request.module.__name__] = dict(names)


def pytest_sessionfinish(session):
    # An xdist worker hands its report to the controller, which prints it (pytest_testnodedown).
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["threads_left"] = THREADS_LEFT
        workeroutput["rss_growth_mb"] = RSS_GROWTH_MB
        workeroutput["threads_alive"] = len(threading.enumerate())
        workeroutput["peak_rss_mb"] = peak_resident_mb()


def peak_resident_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class WorkerReports:
    """Collects the xdist workers' reports (registered only where xdist is installed: its hook
    is unknown to pytest otherwise)."""

    def __init__(self):
        self.alive: list[str] = []

    def pytest_testnodedown(self, node, error):
        out = getattr(node, "workeroutput", {})
        THREADS_LEFT.update(out.get("threads_left", {}))
        RSS_GROWTH_MB.update(out.get("rss_growth_mb", {}))
        if "threads_alive" in out:
            worker = node.gateway.id
            self.alive.append(f"{worker}: {out['threads_alive']} threads, peak {out['peak_rss_mb']:.0f} MB")


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(WorkerReports(), "hybrid_worker_reports")


def pytest_terminal_summary(terminalreporter, config):
    workers = config.pluginmanager.get_plugin("hybrid_worker_reports")
    if THREADS_LEFT:
        terminalreporter.section("threads left running by test modules")
        ranked = sorted(THREADS_LEFT.items(), key=lambda item: -sum(item[1].values()))
        for module, names in ranked[:15]:
            top = dict(collections.Counter(names).most_common(4))
            terminalreporter.write_line(f"{sum(names.values()):4d} {module}: {top}")
        terminalreporter.write_line(f"{len(THREADS_LEFT)} modules left some")
    if RSS_GROWTH_MB:
        terminalreporter.section("resident memory growth by test module (MB, across the module)")
        for module, grown in sorted(RSS_GROWTH_MB.items(), key=lambda item: -item[1])[:15]:
            terminalreporter.write_line(f"{grown:7.0f} {module}")
    if workers is not None and workers.alive:
        terminalreporter.write_line("at the end: " + "; ".join(workers.alive))
    else:
        terminalreporter.write_line(
            f"at the end: {len(threading.enumerate())} threads, peak {peak_resident_mb():.0f} MB resident"
        )


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


@pytest.fixture(scope="session")
def tp_model_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny model a 2-way tensor-parallel engine can split: 4 attention heads, 2 KV heads, head
    size 32 (the smallest vLLM's CPU attention takes)."""
    return build_tiny_model_dir(
        tmp_path_factory.mktemp("tiny_tp"),
        tokenizer,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
