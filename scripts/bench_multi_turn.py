"""Multi-turn rollout throughput against single-turn rollout of the same model tokens.

    python -m scripts.bench_multi_turn [--prompts 16] [--n 4] [--turns 3] [--tokens-per-turn 16]
        [--repeats 2] [key=value ...]

One in-process vLLM engine (the rollout engine of the hybrid worker, SmolLM2-135M read from
the default model folder, the default config's dtype) serves both runs, in the same
process, on the default arithmetic validation prompts:

- multi-turn: every trajectory runs exactly `--turns` model turns of exactly
  `--tokens-per-turn` tokens (`ignore_eos`, `max_tokens_per_turn`, `max_assistant_turns`)
  against an environment that answers each turn with one short user message and is never
  done (so the work is fixed);
- single-turn: the same prompts, one turn of turns x tokens-per-turn tokens (`ignore_eos`).

Both produce prompts x n x turns x tokens-per-turn model tokens. The table gives each
run's best of `--repeats` timed calls (after one warm-up), its model tokens/s, the ratio
multi / single, and how the multi-turn time splits: engine calls (vLLM's `generate`) versus
the turn overhead (environment steps, observation rendering, decoding the turns, the
output assembly), the latter as a share of the rollout time (goal < 10%). The engine's
own time grows with turns too: each turn sends the whole conversation again (the engine's
prefix cache, on for multi-turn rollouts, spares recomputing what it has seen). Trailing
`key=value` arguments are config overrides for both runs, e.g.
`actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_caching=false`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time

from reward.environments import BaseTextEnv, register_env
from scripts.bench_report import add_json_argument, write_report

MT = "actor_rollout_ref.rollout.multi_turn"


@register_env("bench_continue")
class ContinueEnv(BaseTextEnv):
    """The benchmark's workload: never done, one short reply per turn."""

    def step(self, action):
        self.turns += 1
        return {
            "observations": [{"role": "user", "content": "Continue."}],
            "reward": 0.0,
            "done": False,
            "metadata": {},
        }


def _config(args):
    from hybrid.config import build_config
    from hybrid.defaults import resolve_default_assets

    # Room for the observations (about 12 tokens each) besides the model's tokens.
    budget = args.turns * (args.tokens_per_turn + 16)
    config = build_config(
        [
            *args.overrides,
            f"actor_rollout_ref.rollout.n={args.n}",
            f"data.max_response_length={budget}",
            f"data.val_batch_size={args.prompts}",
            "data.return_raw_chat=true",
            "actor_rollout_ref.rollout.ignore_eos=true",
            "actor_rollout_ref.rollout.load_format=hf",
            f"{MT}.enable=true",
            f"{MT}.env_class=bench_continue",
            f"{MT}.max_assistant_turns={args.turns}",
            f"{MT}.max_tokens_per_turn={args.tokens_per_turn}",
        ]
    )
    return resolve_default_assets(config)


def _engine_and_prompts(config, count: int):
    from transformers import AutoConfig, AutoTokenizer

    from hybrid.run import build_dataloaders
    from protocol import DataProto
    from workers.rollout.vllm_rollout import VLLMRollout

    model = config.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    _, val_dl = build_dataloaders(config, tokenizer)
    batch = DataProto.from_single_dict(next(iter(val_dl)))[:count]
    engine = VLLMRollout(model, config.actor_rollout_ref.rollout, tokenizer, AutoConfig.from_pretrained(model.path))
    return engine, batch


def _timed(engine, batch, repeats: int) -> dict:
    """Best of `repeats` calls (after a warm-up): seconds, seconds inside vLLM's generate, output."""
    inner = engine.llm.generate
    engine_seconds = [0.0]

    def generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            engine_seconds[0] += time.perf_counter() - start

    engine.llm.generate = generate
    engine.generate_sequences(batch)  # warm-up
    best = None
    for _ in range(repeats):
        engine_seconds[0] = 0.0
        start = time.perf_counter()
        out = engine.generate_sequences(batch)
        seconds = time.perf_counter() - start
        if best is None or seconds < best["seconds"]:
            best = {"seconds": seconds, "engine_seconds": engine_seconds[0], "out": out}
    del engine.llm.generate
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_multi_turn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens-per-turn", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for both runs")
    add_json_argument(parser, "bench_multi_turn")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

    config = _config(args)
    engine, batch = _engine_and_prompts(config, args.prompts)
    multi = _timed(engine, batch, args.repeats)
    rollout = config.actor_rollout_ref.rollout
    engine.config = dataclasses.replace(
        rollout,
        response_length=args.turns * args.tokens_per_turn,
        multi_turn=dataclasses.replace(rollout.multi_turn, enable=False),
    )
    single = _timed(engine, batch, args.repeats)

    # With ignore_eos the single turn always generates its full length, but its
    # response_mask stops at the first EOS the model happens to sample: count the columns.
    model_tokens = {
        "multi": int(multi["out"].batch["response_mask"].sum()),
        "single": int(single["out"].batch["responses"].numel()),
    }
    expected = args.prompts * args.n * args.turns * args.tokens_per_turn
    tps = {name: model_tokens[name] / r["seconds"] for name, r in (("multi", multi), ("single", single))}
    overhead = multi["seconds"] - multi["engine_seconds"]
    print(
        f"\nrollout: {args.prompts} prompts x {args.n} samples, {args.turns} turns x {args.tokens_per_turn} tokens "
        f"(ignore_eos) vs 1 turn x {args.turns * args.tokens_per_turn} tokens; engine dtype {engine.engine_dtype}, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {platform.processor() or platform.machine()} with "
        f"{os.cpu_count()} cores"
    )
    print(f"{'rollout':<12} {'model tokens':>12} {'seconds':>8} {'engine s':>9} {'tokens/s':>9} {'ratio':>6}")
    for name, r in (("single-turn", single), ("multi-turn", multi)):
        key = "multi" if name == "multi-turn" else "single"
        print(
            f"{name:<12} {model_tokens[key]:>12} {r['seconds']:>8.2f} {r['engine_seconds']:>9.2f} "
            f"{tps[key]:>9.1f} {tps[key] / tps['single']:>6.2f}"
        )
    obs = multi["out"].non_tensor_batch["multi_turn_observation_tokens"]
    print(f"multi-turn observation tokens per trajectory: {float(sum(obs)) / len(obs):.1f}")
    print(
        f"turn overhead (environment steps, rendering, decoding, assembly): {overhead:.3f} s = "
        f"{overhead / multi['seconds']:.1%} of the multi-turn rollout (goal < 10%)"
    )
    print(
        f"multi-turn engine time / single-turn engine time = {multi['engine_seconds'] / single['engine_seconds']:.2f}"
    )
    if any(tokens != expected for tokens in model_tokens.values()):
        print(f"warning: expected {expected} model tokens per run; got {model_tokens}")
    rows = [
        {
            "rollout": name,
            "model_tokens": model_tokens[key],
            "seconds": r["seconds"],
            "engine_seconds": r["engine_seconds"],
            "tokens_per_s": tps[key],
            "ratio": tps[key] / tps["single"],
        }
        for name, key, r in (("single-turn", "single", single), ("multi-turn", "multi", multi))
    ]
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    doc = {
        "settings": settings,
        "rows": rows,
        "turn_overhead_s": overhead,
        "turn_overhead_share": overhead / multi["seconds"],
    }
    write_report("bench_multi_turn", doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
