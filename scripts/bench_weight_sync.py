"""Weight sync cost: hybrid's bucketed in-memory sync against the engine's own reload.

    python -m scripts.bench_weight_sync [--repeats 5] [--prompts 8] [--n 4] [--tokens 64] [--tp 2]

In one process, the fused worker of the default job (SmolLM2-135M, default dtypes) is
built, then timed:

- `hybrid sync`: the worker's `update_rollout_weights()`: FSDP2 DTensors gathered bucket
  by bucket (`full_tensor()`), cast to the engine dtype and streamed into the engine's
  `reload_weights`;
- `engine reload_weights`: the engine's own `reload_weights` fed the same tensors,
  already gathered and cast (a lower bound on any sync through that API);
- the phases of one training step on a rollout of `--prompts x --n` samples
  (generate, old log-probs, actor update) for scale.

The table prints the best of `--repeats` for each and the ratios sync / reload (goal
<= 1.5) and sync / step.

With `--tp 2` (the default; `--tp 1` skips it) a second table compares a tensor-parallel
rollout with one engine per rank (workers/rollout/tensor_parallel.py) on two ranks through
Ray: a tiny Llama that TP=2 can split (4 layers, hidden 256, 4 heads, 2 key/value heads, the
default tokenizer, fp32) is pushed `--repeats` times (the slower rank's seconds) and generates
the rollout, at TP=1 and at TP=2; the JSON report carries `ratio_tp2_push_vs_tp1` (and
`ratio_tp2_generate_vs_tp1`) at its top level.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from scripts.bench_report import add_json_argument, write_report


def _step_phases(group, train_dl) -> dict[str, float]:
    """Seconds of one training step's phases on a real rollout, for scale."""
    import torch

    from protocol import DataProto

    batch = DataProto.from_single_dict(next(iter(train_dl)))
    prompts = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    phases = {}
    start = time.perf_counter()
    rollout = group.generate_sequences(prompts)
    phases["generate"] = time.perf_counter() - start
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
    return phases


def _reload_times(worker, repeats: int) -> tuple[list[float], int]:
    """The engine's own reload_weights fed tensors already gathered and cast; and their bytes."""
    from workers.weight_sync import iter_full_weights

    sync, engine = worker.weight_sync, worker.rollout
    pairs = list(iter_full_weights(sync.state_fn(), engine.engine_dtype, sync.bucket_bytes, sync.tie_word_embeddings))
    num_bytes = sum(t.numel() * t.element_size() for _, t in pairs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})
        times.append(time.perf_counter() - start)
    return times, num_bytes


def _tiny_tp_model(tokenizer, out_dir: str) -> str:
    """A random Llama whose heads and key/value heads split over 2 (and 4) shards."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _tp_case(model_dir: str, tp: int, overrides: list[str], repeats: int) -> dict:
    """Seconds of the weight push (slower rank) and of one rollout on two Ray ranks at `tp`."""
    from hybrid.config import build_config
    from hybrid.defaults import resolve_default_assets
    from hybrid.roles import build_worker_groups
    from hybrid.run import build_dataloaders
    from protocol import DataProto
    from workers.model_loading import load_tokenizer

    config = resolve_default_assets(
        build_config(
            [
                *overrides,
                f"actor_rollout_ref.model.path={model_dir}",
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
                "actor_rollout_ref.rollout.dtype=float32",
                "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "trainer.n_gpus_per_node=2",
                "trainer.worker_group=ray",
            ]
        )
    )
    train_dl, _ = build_dataloaders(config, load_tokenizer(model_dir, False))
    batch = DataProto.from_single_dict(next(iter(train_dl)))
    prompts = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    groups = build_worker_groups(config)
    try:
        group = groups["actor_rollout"]
        group.init_model()
        pushes = [max(group.update_rollout_weights()) for _ in range(repeats)]
        generate = []
        for _ in range(2):
            start = time.perf_counter()
            group.generate_sequences(prompts)
            generate.append(time.perf_counter() - start)
    finally:
        groups["actor_rollout"].shutdown()
        groups["pool"].remove()
    return {"tp": tp, "push_s": min(pushes), "generate_s": min(generate), "push_times_s": pushes}


def _tp_comparison(args, overrides: list[str]) -> dict:
    import tempfile

    from hybrid.defaults import default_model_path
    from workers.model_loading import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="bench_tp_") as tmp:
        model_dir = _tiny_tp_model(load_tokenizer(default_model_path(), False), tmp)
        cases = [_tp_case(model_dir, tp, overrides, args.repeats) for tp in (1, args.tp)]
    one, many = cases
    print("\ntensor-parallel rollout on 2 ranks (tiny Llama, 4 layers, hidden 256, 4/2 heads, fp32)")
    print(f"{'what':<34} {'TP=1 s':>8} {f'TP={args.tp} s':>8} {'ratio':>6}")
    for key, name in (("push_s", "weight push (slower rank)"), ("generate_s", "generate")):
        print(f"{name:<34} {one[key]:>8.3f} {many[key]:>8.3f} {many[key] / one[key]:>6.2f}")
    return {
        "cases": cases,
        f"ratio_tp{args.tp}_push_vs_tp1": many["push_s"] / one["push_s"],
        f"ratio_tp{args.tp}_generate_vs_tp1": many["generate_s"] / one["generate_s"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_weight_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size to compare with 1 (1: skip)")
    add_json_argument(parser, "bench_weight_sync")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

    from hybrid.config import build_config
    from hybrid.defaults import resolve_default_assets
    from hybrid.roles import build_worker_groups
    from hybrid.run import build_dataloaders
    from workers.model_loading import load_tokenizer

    sizes = [
        f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_response_length={args.tokens}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        # The step's phases time the old log-prob pass too (one mini-batch would skip it).
        "actor_rollout_ref.actor.skip_old_log_prob_on_policy=false",
    ]
    config = resolve_default_assets(build_config([*sizes, "trainer.worker_group=local"]))
    model = config.actor_rollout_ref.model
    train_dl, _ = build_dataloaders(config, load_tokenizer(model.tokenizer, model.trust_remote_code))
    group = build_worker_groups(config)["actor_rollout"]
    group.init_model()
    worker = group.worker
    sync_times = [group.update_rollout_weights()[0] for _ in range(args.repeats)]
    reload_times, num_bytes = _reload_times(worker, args.repeats)
    phases = _step_phases(group, train_dl)
    step = sum(phases.values())
    after_update = group.update_rollout_weights()[0]  # the sync the next step pays

    best_sync, best_reload = min(sync_times), min(reload_times)
    sync, engine = worker.weight_sync, worker.rollout
    print(
        f"\nweight sync: {model.path}, {num_bytes / 2**20:.0f} MiB in "
        f"{str(engine.engine_dtype).removeprefix('torch.')}, bucket {sync.bucket_bytes // 2**20} MiB, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {platform.machine()} with {os.cpu_count()} cores"
    )
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
    rows = [
        {"what": "engine reload_weights (baseline)", "seconds": best_reload, "ratio": 1.0},
        {"what": "hybrid sync (gather + reload)", "seconds": best_sync, "ratio": best_sync / best_reload},
        {"what": "sync after an update (in step)", "seconds": after_update, "ratio": after_update / best_reload},
    ]
    doc = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "bytes": num_bytes,
        "rows": rows,
        "step_phases_s": phases,
        "step_s": step,
        "sync_times_s": sync_times,
        "reload_times_s": reload_times,
    }
    if args.tp > 1:
        tp = _tp_comparison(args, sizes)
        doc["tensor_parallel"] = tp.pop("cases")
        doc.update(tp)
    write_report("bench_weight_sync", doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
