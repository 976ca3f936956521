"""Shared pieces of the checkpoint tests: a deterministic tiny-model run configuration
(one in-process rank, fp32 everywhere, the seeded Hugging Face rollout engine) and a
function that trains one PPOTrainer to the end and returns what the tests compare."""

from __future__ import annotations

import math

import torch

# Metrics that measure time or memory differ between any two runs; everything else must match.
TIME_KEYS = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "perf/update_actor_s")


def tiny_run(model_dir, files, out_dir) -> list[str]:
    """The overrides every small run of the tiny model shares: the hf engine in fp32, 4
    prompts x 2 samples of up to 8 tokens, no validation, the file logger. Callers add the
    run's length, saving, worker group and ranks (each key once: Hydra refuses repeats)."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={out_dir}",
    ]


def run_config(model_dir, files, out_dir, *extra):
    from hybrid.config import load_config, validate_config

    # Saving and merging at the end costs a child process; tests that want it say so.
    pinned = [] if any(e.startswith("trainer.merge_on_finish=") for e in extra) else ["trainer.merge_on_finish=false"]
    cfg = load_config(
        [
            *pinned,
            *tiny_run(model_dir, files, out_dir),
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "trainer.n_gpus_per_node=1",
            "trainer.worker_group=local",
            "trainer.total_training_steps=4",
            *extra,
        ]
    )
    validate_config(cfg)
    return cfg


def train(cfg, probe_ids: torch.Tensor | None = None, inspect=None) -> dict:
    """Run `cfg` to the end in this process; returns the trainer's history and, when asked,
    the trained actor's fp32 logits on `probe_ids` (read from the live FSDP module) and
    whatever `inspect(trainer)` returns, called before the workers shut down."""
    from transformers import AutoTokenizer

    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer
    from reward.loader import load_reward_manager

    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    from hybrid.trainer import as_typed

    cfg = as_typed(cfg)
    if cfg.async_training.simulate_training:
        from hybrid.async_sim import SimulatedAsyncTrainer as trainer_cls
    elif cfg.async_mode is not None:
        from hybrid.async_trainer import AsyncPPOTrainer as trainer_cls
    else:
        trainer_cls = PPOTrainer
    trainer = trainer_cls(cfg, tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    out = {}
    try:
        trainer.init_workers()
        out["result"] = trainer.fit()
        out["history"] = trainer.history
        if probe_ids is not None:
            module = trainer.actor_rollout_wg.worker.actor_module
            with torch.no_grad():
                out["logits"] = module(input_ids=probe_ids, use_cache=False).logits.float().cpu()
        if inspect is not None:
            out.update(inspect(trainer))
    finally:
        trainer.shutdown()
    return out


def comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(TIME_KEYS) and "memory" not in k and k != "step"}


def assert_metrics_close(a: dict, b: dict, tol: float = 1e-6) -> None:
    a, b = comparable(a), comparable(b)
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for key in a:
        x, y = float(a[key]), float(b[key])
        if math.isnan(x) and math.isnan(y):
            continue
        assert abs(x - y) <= tol, f"{key}: {x!r} vs {y!r}"


def probe_batch(tokenizer, n: int = 3, length: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, len(tokenizer), (n, length), generator=gen)


def response_log_probs(model, batch) -> torch.Tensor:
    """Log-probs of `responses` under a plain Hugging Face model (temperature 1), (B, R)."""
    b = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
            use_cache=False,
        ).logits.float()
    response_len = b["responses"].shape[1]
    logits = logits[:, -response_len - 1 : -1]
    return torch.gather(logits.log_softmax(-1), -1, b["responses"].unsqueeze(-1)).squeeze(-1)


def vllm_greedy_vs_hf(folder: str, prompts: list[list[int]], max_tokens: int = 8) -> tuple[list[list[int]], float]:
    """Load `folder` in an in-process vLLM engine (fp32), generate greedily, and return the
    tokens and the largest |vLLM - transformers| log-prob of the generated tokens."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=folder,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_batched_tokens=256,
        seed=0,
        enable_prefix_caching=False,
    )
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0),
        use_tqdm=False,
    )
    del llm
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokens, worst = [], 0.0
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        tokens.append(ids)
        engine = torch.tensor([step[t].logprob for step, t in zip(completion.logprobs, ids)])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids]), use_cache=False).logits[0].float()
        hf = logits[len(prompt) - 1 : -1].log_softmax(-1)[torch.arange(len(ids)), torch.tensor(ids)]
        worst = max(worst, (engine - hf).abs().max().item())
    return tokens, worst
