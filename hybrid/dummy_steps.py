"""trainer.num_dummy_steps (SkyRL's full-context trainer, examples/train_scripts/full_context):
the run trains that many steps on random batches of the longest sequences the config allows,
then ends, to find a configuration's memory limits in minutes instead of after hours of real
training.

What SkyRL's FullCtxTrainer.train does, and hybrid with it:
- every dummy step is a batch of data.train_batch_size prompts x rollout.n samples, each
  exactly data.max_prompt_length prompt tokens + data.max_response_length response tokens
  (SkyRL: generator.max_input_length + max_generate_length, which the SkyRL dialect maps
  onto these two), every position attended and every response token in the loss; the n
  samples of a prompt share its prompt tokens and its uid (one group);
- the rewards are 0 on every token but the last, which is 0 or 1 at random;
- no generation, no reward function, no validation (SkyRL's eval_before_train is not read
  either), no resume, no checkpoint: the batch goes through the real step after the rollout
  (PPOTrainer.update_step: old log-probs, reference log-probs, values, advantages, the
  critic's and the actor's updates), dispatched to the workers as a real step's batch is;
- each step logs its metrics (the updates', the lengths, timings, perf/max_memory_*);
- after the last dummy step the run ends, as SkyRL's does (it never starts real training).

Where hybrid differs, and why: the token ids are drawn per position (SkyRL repeats one random
id per sequence), from a generator seeded by trainer.seed and the step (SkyRL's Python
`random` is unseeded), so a dummy run repeats exactly; the last response token is the EOS
token, so algorithm.mask_truncated_responses keeps every row (a max-length response without
EOS would be masked, and the step would train nothing); the engine's log-probs
(rollout_log_probs, which a vLLM rollout always returns) are those of a uniform draw over the
vocabulary, -log(vocab size), which is how the ids were drawn; and after the actor's update
the weights go to the rollout engine as after every hybrid step (SkyRL's dummy steps only set
up its weight-sync group), so the step's peak includes that gather.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from hybrid.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from protocol.data_proto import DataProto
from workers.host_memory import process_stats
from workers.profiling import profiled_step


def dummy_generator(seed: int, step: int) -> torch.Generator:
    """The seeded generator of dummy step `step` (a different batch every step, the same in every run)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step + 13)


def dummy_batch(
    num_prompts: int,
    n: int,
    prompt_length: int,
    response_length: int,
    vocab_size: int,
    eos_token_id: int | None,
    generator: torch.Generator,
    step: int = 1,
) -> DataProto:
    """A scored batch as a rollout would hand it to PPOTrainer.update_step: `num_prompts` x `n`
    rows of exactly `prompt_length` + `response_length` tokens, random ids below `vocab_size`,
    no padding; token_level_scores 0 but the last response token (0 or 1 at random)."""
    rows = num_prompts * n
    prompts = torch.randint(0, vocab_size, (num_prompts, prompt_length), generator=generator)
    prompts = prompts.repeat_interleave(n, dim=0)
    responses = torch.randint(0, vocab_size, (rows, response_length), generator=generator)
    if eos_token_id is not None:
        responses[:, -1] = eos_token_id
    total = prompt_length + response_length
    scores = torch.zeros((rows, response_length), dtype=torch.float32)
    scores[:, -1] = torch.randint(0, 2, (rows,), generator=generator).float()
    uids = np.array([f"dummy-{step}-{i // n}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": torch.ones((rows, total), dtype=torch.long),
            "position_ids": torch.arange(total, dtype=torch.long).unsqueeze(0).repeat(rows, 1),
            "response_mask": torch.ones((rows, response_length), dtype=torch.long),
            "rollout_log_probs": torch.full((rows, response_length), -math.log(vocab_size), dtype=torch.float32),
            "token_level_scores": scores,
        },
        non_tensors={"uid": uids},
    )


def run_dummy_steps(trainer) -> dict:
    """trainer.num_dummy_steps steps of `trainer` (a PPOTrainer whose workers are up and whose
    tracker is open) on dummy batches, each logged; then the run ends. Returns fit's result."""
    cfg = trainer.config
    steps = cfg.trainer.num_dummy_steps
    data = cfg.data
    n = cfg.actor_rollout_ref.rollout.n
    tokenizer = trainer.tokenizer
    print(
        f"hybrid: trainer.num_dummy_steps={steps}: {steps} step{'s' if steps != 1 else ''} on random batches of "
        f"{data.train_batch_size} prompts x {n} samples, each {data.max_prompt_length} prompt + "
        f"{data.max_response_length} response tokens, then the run ends (no real training)",
        flush=True,
    )
    for step in range(1, steps + 1):
        trainer.state.global_step = step
        metrics: dict[str, float] = {}
        timing: dict[str, float] = {}
        with profiled_step(cfg.global_profiler, step, (trainer.actor_rollout_wg, trainer.critic_wg)):
            start = time.perf_counter()
            batch = dummy_batch(
                data.train_batch_size,
                n,
                data.max_prompt_length,
                data.max_response_length,
                tokenizer.vocab_size,
                tokenizer.eos_token_id,
                dummy_generator(cfg.trainer.seed, step),
                step,
            )
            batch = trainer.update_step(batch, metrics, timing)
            timing["step"] = time.perf_counter() - start
        metrics.update(compute_data_metrics(batch, use_critic=trainer.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, trainer.world_size))
        metrics.update(compute_memory_metrics(process_stats(), trainer.actor_rollout_wg.memory_stats()))
        trainer.tracker.log(metrics, step=step)
        trainer.history.append({"step": step, **metrics})
        if trainer.stop is not None and trainer.stop.requested:
            break  # SIGTERM or Ctrl-C: nothing to save (a dummy run keeps no checkpoint)
    print(f"hybrid: {step} of {steps} dummy steps done; the run ends here", flush=True)
    trainer.tracker.finish()
    return {"val_before": {}, "val_after": {}, "steps": step}
