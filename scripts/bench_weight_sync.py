"""Weight sync cost: hybrid's bucketed in-memory sync against the engine's own reload.

    python -m scripts.bench_weight_sync [--repeats 5] [--prompts 8] [--n 4] [--tokens 64]

In one process, the fused worker of the default job (SmolLM2-135M, default dtypes) is
built, then timed:

- `hybrid sync`: `EngineWeightSync.sync(force=True)`: FSDP2 DTensors gathered bucket by
  bucket (`full_tensor()`), cast to the engine dtype and streamed into the engine's
  `reload_weights`;
- `engine reload_weights`: the engine's own `reload_weights` fed the same tensors,
  already gathered and cast (a lower bound on any sync through that API);
- the phases of one training step on a rollout of `--prompts x --n` samples
  (generate, old log-probs, actor update) for scale.

The table prints the best of `--repeats` for each and the ratios sync / reload (goal
<= 1.5) and sync / step.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_weight_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from hybrid.config import load_config
    from hybrid.defaults import register_resolvers
    from hybrid.roles import build_worker_groups
    from hybrid.trainer import build_dataloaders
    from protocol import DataProto
    from workers.sharding import iter_full_weights

    register_resolvers()
    config = load_config([
        f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_response_length={args.tokens}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "trainer.worker_group=local",
    ])
    OmegaConf.resolve(config)
    tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
    train_dl, _ = build_dataloaders(config, tokenizer)
    group = build_worker_groups(config)["actor_rollout"]
    group.init_model()
    worker = group.worker
    sync = worker.weight_sync
    engine = worker.rollout

    sync_times = []
    for _ in range(args.repeats):
        sync_times.append(sync.sync(force=True))

    pairs = list(iter_full_weights(sync.state_fn(), engine.engine_dtype, sync.bucket_bytes, sync.tie_word_embeddings))
    num_bytes = sum(t.numel() * t.element_size() for _, t in pairs)
    reload_times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})
        reload_times.append(time.perf_counter() - start)
    del pairs

    # One training step's phases on a real rollout, for scale.
    batch = DataProto.from_single_dict(next(iter(train_dl)))
    prompts = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    phases = {}
    start = time.perf_counter()
    rollout = group.generate_sequences(prompts)
    phases["generate"] = time.perf_counter() - start
    rollout.meta_info["temperature"] = float(config.actor_rollout_ref.rollout.temperature)
    start = time.perf_counter()
    old = group.compute_log_prob(rollout)
    phases["old_log_prob"] = time.perf_counter() - start
    rollout.batch["old_log_probs"] = old.batch["old_log_probs"]
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(len(rollout), 1, generator=gen).expand_as(rollout.batch["response_mask"])
    rollout.batch["advantages"] = advantages * rollout.batch["response_mask"]
    start = time.perf_counter()
    group.update_actor(rollout)
    phases["update_actor"] = time.perf_counter() - start
    step = sum(phases.values())
    after_update = sync.sync()  # dirty after the update: the sync the next step pays

    best_sync, best_reload = min(sync_times), min(reload_times)
    print(f"\nweight sync: {config.actor_rollout_ref.model.path}, {num_bytes / 2**20:.0f} MiB in "
          f"{str(engine.engine_dtype).removeprefix('torch.')}, bucket {sync.bucket_bytes // 2**20} MiB, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {platform.machine()} with {os.cpu_count()} cores")
    print(f"{'what':<34} {'seconds':>8} {'ratio':>6}")
    print(f"{'engine reload_weights (baseline)':<34} {best_reload:>8.3f} {1.0:>6.2f}")
    print(f"{'hybrid sync (gather + reload)':<34} {best_sync:>8.3f} {best_sync / best_reload:>6.2f}")
    print(f"{'sync after an update (in step)':<34} {after_update:>8.3f} {after_update / best_reload:>6.2f}")
    for name, seconds in phases.items():
        print(f"{'step: ' + name:<34} {seconds:>8.3f}")
    print(f"{'step: total':<34} {step:>8.3f}")
    print(f"sync / reload = {best_sync / best_reload:.2f} (goal <= 1.5); sync / step = {best_sync / step:.3f}")
    print(f"  all sync s {[round(t, 3) for t in sync_times]}; all reload s {[round(t, 3) for t in reload_times]}")
    group.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
