"""Running a PPO job from a checked config: the Python API (`run_ppo`) and the one place a run
is put together: default assets prepared, seeds set, the tokenizer, the reward managers
(loaded, and failing, before any model), the data loaders, the trainer (PPOTrainer, or
AsyncPPOTrainer with asynchronous training), its workers, the training, and the summary.
`python -m hybrid.main_ppo` calls it after the command line.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import torch

from hybrid.domains import DomainError, DomainQuotaSampler, assign_domains, domain_quotas
from hybrid.interrupts import StopSignals
from hybrid.multimodal import vision_processor
from hybrid.trainer import PPOTrainer, as_typed
from protocol.data_proto import DataProto  # noqa: F401


def build_dataloaders(config, tokenizer, processor=None):
    from hybrid.data import collate_fn, create_rl_dataset
    from hybrid.data_loader import create_dataloader, create_rl_sampler

    data = config.data
    rollout = config.actor_rollout_ref.rollout
    if rollout.multi_turn.enable or rollout.mode == "async":
        # Multi-turn and agent loops start each trajectory from the row's chat messages (raw_prompt).
        data = dataclasses.replace(as_typed(config).data, return_raw_chat=True)
    train_ds = create_rl_dataset(data.train_files, data, tokenizer, processor, data.train_max_samples)
    sampler = create_rl_sampler(data, train_ds) if not data.domain_quotas else domain_sampler(data, train_ds)
    train_dl = create_dataloader(
        train_ds,
        data.train_batch_size,
        sampler,
        collate_fn,
        drop_last=True,
        num_workers=data.dataloader_num_workers,
    )
    val_dl = None
    if data.val_files:
        val_ds = create_rl_dataset(data.val_files, data, tokenizer, processor, data.val_max_samples)
        if data.domain_quotas:  # ROLL gives validation rows their domains too; each is scored by its domain's
            _scored_domains(
                data,
                assign_domains(val_ds.rows, data.domain_tags, data.default_domain, "validation", processor is not None),
            )
        val_dl = create_dataloader(
            val_ds,
            data.val_batch_size or len(val_ds),
            None,
            collate_fn,
            drop_last=False,
            num_workers=data.dataloader_num_workers,
        )
    return train_dl, val_dl


def domain_sampler(data, train_ds):
    """ROLL's per-domain quotas (hybrid/domains.py): each training row's domain, the sampler."""
    from hybrid.data_loader import shuffle_seed

    # a vision-language policy's rows take their tag from data_source, as in ROLL's VLM pipeline
    domains = assign_domains(
        train_ds.rows, data.domain_tags, data.default_domain, "training", train_ds.vision is not None
    )
    quotas = domain_quotas(data.domain_quotas, data.train_batch_size)
    _scored_domains(data, [d for d in domains if d in quotas])
    counts = {d: domains.count(d) for d in quotas}
    print(
        "domains: "
        + ", ".join(f"{d} {q} prompts per batch of {counts[d]} rows" for d, q in quotas.items())
        + f" (rows of other domains not drawn: {len(domains) - sum(counts.values())})"
    )
    return DomainQuotaSampler(domains, quotas, shuffle=data.shuffle, seed=shuffle_seed(data.seed))


def _scored_domains(data, domains: list[str]) -> None:
    """With data.domain_scorers, every row that will be scored has its domain's scorer."""
    missing = sorted(set(domains) - set(data.domain_scorers)) if data.domain_scorers else []
    if missing:
        raise DomainError(
            f"rows of domain(s) {', '.join(missing)} have no scorer in data.domain_scorers "
            f"(it names {', '.join(data.domain_scorers)}); add one"
        )


def val_num_examine(config) -> int:
    """How many validation samples per data source the reward manager prints. verl prints
    one (num_examine=1, as its main_ppo sets; not a config key); the console's table of
    validation samples (`trainer.log_val_generations` with the `console` logger) shows that
    same first sample, so then none: each sample once. Training prints none either way."""
    table = config.trainer.log_val_generations > 0 and "console" in config.trainer.logger
    return 0 if table else 1


def run_ppo(config) -> dict:
    """Train `config` (a HybridConfig, or a composed tree that is checked first): everything
    `python -m hybrid.main_ppo` does after the command line."""
    import random

    from transformers import AutoTokenizer

    from hybrid.console import print_header, print_summary
    from hybrid.defaults import resolve_default_assets
    from hybrid.roles import init_ray_if_needed, wants_ray, worker_env
    from reward.loader import load_reward_manager
    from workers.device import select_device
    from workers.engine_logs import ENGINE_LOG_DIR_ENV

    config = resolve_default_assets(as_typed(config))  # prepares the default model and data when named
    # trainer.worker_env_vars (ROLL's system_envs): in place before anything reads them; the local
    # worker group and Ray's workers (hybrid/roles.py) inherit them.
    os.environ.update(worker_env(config))
    select_device(config.trainer.device)
    seed = config.trainer.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    started = time.time()
    model = config.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, trust_remote_code=model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Reward functions load (and fail) before any model does.
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=val_num_examine(config))
    # A vision-language policy reads its prompts through the checkpoint's processor (hybrid/multimodal.py).
    processor = vision_processor(model)
    train_dl, val_dl = build_dataloaders(config, tokenizer, processor)
    os.makedirs(config.trainer.default_local_dir, exist_ok=True)
    # The engines' own log lines go to files there (workers/engine_logs.py), not the console.
    os.environ[ENGINE_LOG_DIR_ENV] = os.path.abspath(config.trainer.default_local_dir)
    if config.async_training.simulate_training:
        from hybrid.async_sim import SimulatedAsyncTrainer as trainer_cls
    elif config.async_mode is not None:
        from hybrid.async_trainer import AsyncPPOTrainer as trainer_cls
    else:
        trainer_cls = PPOTrainer
    trainer = trainer_cls(config, tokenizer, train_dl, val_dl, reward_fn, val_reward_fn)
    print_header(config, trainer)
    if wants_ray(config):
        init_ray_if_needed(config)  # before our handlers: ray.init replaces the driver's SIGTERM handler
    try:
        with StopSignals(defer=False):  # while the workers load, a signal ends the run at once
            trainer.init_workers()
        result = trainer.fit()
    finally:
        trainer.shutdown()
    result["minutes"] = (time.time() - started) / 60
    if config.trainer.plot_on_finish and "file" in config.trainer.logger:
        from hybrid.plots import plot_metrics

        run_dir = config.trainer.default_local_dir
        result["plots"] = plot_metrics(os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "plots"))
    print_summary(config, result)
    return result
