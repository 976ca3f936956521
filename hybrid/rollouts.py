"""The driver's side of generating and scoring: prompts to the rollout engine (padded to
the world size), responses and their rewards back, as DataProto. One training step takes
one batch (`rollout_and_score`), or with DAPO's dynamic sampling several until enough
prompt groups vary (`filtered_batch`); validation (hybrid/validation.py) generates and
judges through the same calls.

Scores come from the reward manager (reward/manager.py), the environments' rewards in
multi-turn rollouts, and the reward model's worker group when `reward_model.enable`; with
`reward_model.use_reward_loop` from the reward loop (hybrid/reward_loop.py), which scores the
rows the agent loops did not already score as they finished.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch

from hybrid.batch_ops import assign_uids, group_metric_values, kept_group_indices
from hybrid.config import HybridConfig
from hybrid.config.rules_log_probs import drop_unrequested
from hybrid.core_algos import estimator_spec
from hybrid.step_wise import drop_trajectories, is_step_wise, join_steps, last_steps
from protocol.data_proto import DataProto, pad_dataproto_to_divisor
from workers.rollout.agent_rollout import summarize_agents
from workers.rollout.multi_turn import summarize as summarize_multi_turn
from workers.vision import MULTI_MODAL_INPUTS

GEN_KEYS = ["input_ids", "attention_mask", "position_ids"]


@contextmanager
def timed(name: str, timing: dict):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


class Rollouts:
    """`reward_fn`: the training reward manager. Worker groups arrive with `attach` once built;
    `reward_metrics` gathers the step's reward metrics until the trainer takes them."""

    def __init__(self, config: HybridConfig, reward_fn):
        self.config = config
        self.reward_fn = reward_fn
        self.world_size = config.world_size
        self.multi_turn = config.actor_rollout_ref.rollout.multi_turn.enable
        self.agent_loops = config.actor_rollout_ref.rollout.mode == "async"
        self.use_rm = config.reward_model.enable
        self.generator = None  # what generates: the fused worker group, or the engines of async training
        self.divisor = 1  # the generator's rows must split evenly over this many ranks
        self.rm_wg = None
        self.reward_loop = None
        self.reward_metrics: dict[str, float] = {}

    def attach(self, groups: dict, generator=None, reward_loop=None) -> None:
        """The worker groups once built; `generator` (anything with `generate_sequences`)
        when not the fused worker group (asynchronous training's engines, which split rows
        themselves); `reward_loop` (hybrid/reward_loop.py) when the reward loop scores."""
        self.reward_loop = reward_loop
        if generator is None:
            self.generator, self.divisor = groups["actor_rollout"], self.world_size
        else:
            self.generator, self.divisor = generator, 1
        self.rm_wg = groups.get("rm")

    def take_metrics(self) -> dict[str, float]:
        """The reward metrics gathered since the last call (the step's)."""
        metrics, self.reward_metrics = self.reward_metrics, {}
        return metrics

    def generate(self, gen_batch: DataProto) -> DataProto:
        """Pad the prompts to the generator's ranks, generate, and drop the padding's samples."""
        padded, pad = pad_dataproto_to_divisor(gen_batch, self.divisor)
        output = self.generator.generate_sequences(padded)
        if is_step_wise(output):  # a sample per model turn (hybrid/step_wise.py)
            output = drop_trajectories(output, pad * int(output.meta_info["n"]))
            # Validation judges each trajectory by its last sample, as SkyRL's evaluate_step_wise.
            return last_steps(output) if gen_batch.meta_info.get("validate", False) else output
        if pad:
            n = int(output.meta_info.get("n", len(output) // len(padded)))
            output = output[: len(output) - pad * n]
        return output

    def gen_batch(self, batch: DataProto) -> DataProto:
        """The prompts' tensors (popped from `batch`); a multi-turn rollout or agent loops also
        get a copy of the rows' non-tensor fields their environments and agents read
        (raw_prompt, agent_name, env_class, reward_model, extra_info, data_source, index, ...),
        which stay in `batch` for the reward function."""
        gen_batch = batch.pop(batch_keys=GEN_KEYS)
        if self.multi_turn or self.agent_loops:
            gen_batch.non_tensor_batch.update(batch.non_tensor_batch)
            # Each episode's sample comes back with its own images (workers/rollout/multi_turn_images.py).
            batch.non_tensor_batch.pop(MULTI_MODAL_INPUTS, None)
        elif MULTI_MODAL_INPUTS in batch.non_tensor_batch:  # the engine generates with the images too
            for key in (MULTI_MODAL_INPUTS, "multi_modal_data"):  # the HF engine's, vLLM's
                if key in batch.non_tensor_batch:
                    gen_batch.non_tensor_batch[key] = batch.non_tensor_batch[key]
        return gen_batch

    def multi_turn_metrics(self, output: DataProto) -> dict[str, float]:
        """`multi_turn/*` and `agent/*` of the whole batch, from its per-sample fields: the
        workers' meta_info holds rank 0's only."""
        output.meta_info.pop("metrics", None)
        output = last_steps(output) if is_step_wise(output) else output  # per trajectory
        metrics = summarize_multi_turn(output.non_tensor_batch) if self.multi_turn else {}
        return metrics | (summarize_agents(output.non_tensor_batch) if self.agent_loops else {})

    def judge(self, batch: DataProto, reward_fn) -> dict:
        """The reward function's result. With multi-turn the environments judge the rows:
        the scores are `env_rewards`, plus the reward function's only when
        custom_reward_function.path is set (the built-in scorers would read the whole
        trajectory, observations included, as the answer)."""
        if not self.multi_turn:
            return reward_fn(batch, return_dict=True)
        env_rewards = batch.batch["env_rewards"]
        if not self.config.custom_reward_function.path:
            return {"reward_tensor": env_rewards.clone()}
        result = dict(reward_fn(batch, return_dict=True))
        result["reward_tensor"] = result["reward_tensor"] + env_rewards
        return result

    def score(self, batch: DataProto, reward_fn, into: dict | None = None) -> tuple[torch.Tensor, dict]:
        """Token-level scores and the reward function's extra info; its metrics go to `into`
        (default: the step's reward metrics)."""
        into = self.reward_metrics if into is None else into
        if self.reward_loop is not None:
            use_reward_fn = not self.multi_turn or bool(self.config.custom_reward_function.path)
            env_rewards = batch.batch["env_rewards"] if self.multi_turn else None
            result = self.reward_loop.score(batch, use_reward_fn, env_rewards)
        else:
            result = self.judge(batch, reward_fn)
        scores = result["reward_tensor"]
        extra = dict(result.get("reward_extra_info", {}))
        into.update(result.get("reward_metrics", {}))
        # Extra keys of a dict-valued score become metrics (their batch mean).
        for key, values in numeric_columns(extra, len(batch)).items():
            into[f"reward_extra/{key}/mean"] = float(np.mean(values))
        if self.use_rm and self.reward_loop is None:
            rm = self.rm_wg.compute_rm_score(batch).batch["rm_scores"]
            scores = rm if self.config.reward_model.combine == "rm_only" else scores + rm
            extra["rm_score"] = rm.sum(-1).tolist()
        return scores, extra

    def prepare(self, batch: DataProto) -> DataProto:
        """A uid per prompt (into `batch`), and the prompts to generate from (popped from it)."""
        assign_uids(batch)
        # No do_sample in meta_info: the engine samples as actor_rollout_ref.rollout.do_sample says (verl).
        return self.gen_batch(batch)

    def complete(
        self, batch: DataProto, gen_out: DataProto, timing: dict, into: dict | None = None
    ) -> tuple[DataProto, dict]:
        """The prompts' rows repeated n times with their responses, scored; the rollout's and
        the reward's metrics go to `into` (default: the step's reward metrics)."""
        into = self.reward_metrics if into is None else into
        gen_out = drop_unrequested(gen_out, self.config)  # calculate_log_probs=false: no engine log-probs kept
        gen_out.meta_info.pop("timing", None)  # the driver times the call itself (timing_s/gen)
        # Logged with the step's metrics (a dynamic-sampling step: its last generation batch).
        into.update(self.multi_turn_metrics(gen_out))
        n = int(gen_out.meta_info.get("n", self.config.actor_rollout_ref.rollout.n))
        batch = batch.repeat(repeat_times=n, interleave=True)
        if is_step_wise(gen_out):
            batch, step_metrics = join_steps(batch, gen_out)
            into.update(step_metrics)
        else:
            batch = batch.union(gen_out)
        with timed("reward", timing):
            scores, extra = self.score(batch, self.reward_fn, into)
        batch.batch["token_level_scores"] = scores
        return batch, extra

    def rollout_and_score(self, batch: DataProto, timing: dict) -> tuple[DataProto, dict]:
        gen_batch = self.prepare(batch)
        with timed("gen", timing):
            gen_out = self.generate(gen_batch)
        if estimator_spec(self.config.algorithm.adv_estimator).greedy_baseline:  # ReMax's baseline
            with timed("gen_max", timing):
                greedy = gen_batch.select(batch_keys=GEN_KEYS)
                greedy.meta_info["do_sample"] = False
                greedy_out = self.generate(greedy)
                self.multi_turn_metrics(greedy_out)  # not the step's rollout: not logged
                base = batch.select().union(greedy_out)  # union fills its receiver: keep batch as it was
                base_scores, _ = self.score(base, self.reward_fn)
            # remax's baseline joins the rows before they are repeated and scored.
            batch.batch["reward_baselines"] = base_scores.sum(-1)
        return self.complete(batch, gen_out, timing)

    def filtered_batch(self, batch_iter, timing: dict, metrics: dict) -> DataProto | None:
        """DAPO dynamic sampling: keep groups whose metric varies; generate more until full."""
        cfg = self.config.algorithm.filter_groups
        n = self.config.actor_rollout_ref.rollout.n
        want = self.config.data.train_batch_size * n
        kept: list[DataProto] = []
        num_gen, kept_rows = 0, 0
        current = next(batch_iter, None)
        while current is not None:
            batch, extra = self.rollout_and_score(current, timing)
            num_gen += 1
            values = group_metric_values(batch, cfg.metric, extra)
            keep = kept_group_indices(batch.non_tensor_batch["uid"], values)
            metrics["train/num_gen_batches"] = num_gen
            if keep:
                kept.append(batch.select_idxs(keep))
                kept_rows += len(keep)
            limit = cfg.max_num_gen_batches
            if kept_rows >= want:
                break
            if limit and num_gen >= limit:
                if not kept:
                    raise RuntimeError(
                        f"algorithm.filter_groups: {num_gen} generation batches in a row had no group whose "
                        f"{cfg.metric!r} varies, so there is nothing to train on; the data may be too hard or too "
                        "easy for the model, or raise algorithm.filter_groups.max_num_gen_batches (0 = no limit)"
                    )
                break
            current = next(batch_iter, None)
        if not kept:
            return None
        merged = DataProto.concat(kept)
        usable = min(len(merged), want)
        usable -= usable % (n * self.world_size) if usable >= n * self.world_size else 0
        metrics["train/kept_group_fraction"] = kept_rows / max(num_gen * want, 1)
        return merged[:usable] if usable else None


def numeric_columns(extra_info: dict, rows: int) -> dict[str, list[float]]:
    """The per-sample numeric columns of a reward manager's extra info (one value per row)."""
    columns = {}
    for key, values in extra_info.items():
        values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
        if values is None or len(values) != rows:
            continue
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
            columns[key] = [float(v) for v in values]
    return columns
