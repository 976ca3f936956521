"""The rules of step-wise trajectories (`multi_turn.step_wise_trajectories`, a sample per model
turn: workers/rollout/step_wise.py, hybrid/step_wise.py) across keys; hybrid/config/rules.py runs
them. Each key that cannot combine with it is refused in one line with the reason."""

from __future__ import annotations

from hybrid.config.schema import HybridConfig
from hybrid.core_algos import estimator_spec
from protocol.config_schema import INVALID, Problems, fmt, valid
from workers.losses import policy_loss_spec

ARR = "actor_rollout_ref"
STEP_WISE = f"{ARR}.rollout.multi_turn.step_wise_trajectories=true"
STEP_WISE_LOOPS = (None, "environment_agent", "tool_agent")


def check_step_wise(config: HybridConfig, problems: Problems) -> None:
    arr, algorithm = config.actor_rollout_ref, config.algorithm
    multi_turn = arr.rollout.multi_turn
    if not valid(multi_turn) or multi_turn.step_wise_trajectories is not True:
        return

    def refuse(key_value: str, reason: str) -> None:
        problems.add(f"{key_value} with {STEP_WISE}: {reason}")

    if multi_turn.enable is not True:
        problems.add(f"{STEP_WISE} splits episodes into their model turns: set {ARR}.rollout.multi_turn.enable=true")
    if multi_turn.use_conversation_multi_turn is False:
        refuse(
            f"{ARR}.rollout.multi_turn.use_conversation_multi_turn=false",
            "the chat history is rendered with the chat template before every turn (SkyRL refuses it too)",
        )
    # An estimator whose advantages are not one value per trajectory from its score: the broadcast
    # of the last turn's would discard their per-token structure (SkyRL refuses gae and reinforce++
    # alike) or their input (remax's greedy baseline rollout, opo's lengths, no_op's token rewards).
    spec = estimator_spec(algorithm.adv_estimator) if valid(algorithm, algorithm.adv_estimator) else None
    if spec is not None and not spec.outcome_only:
        refuse(
            f"algorithm.adv_estimator={algorithm.adv_estimator}",
            f"each turn takes its trajectory's last-turn outcome advantage, and this estimator needs "
            f"{spec.beyond_outcome}; use an outcome estimator (grpo, rloo, maxrl, gpg, "
            f"reinforce_plus_plus_baseline)",
        )
    if valid(algorithm):
        for key, value, reason in (
            ("algorithm.filter_groups.enable", algorithm.filter_groups.enable, "it counts a prompt's n rows"),
            ("algorithm.batch_adjust.multiple", algorithm.batch_adjust.multiple, "it copies or drops rows"),
            ("algorithm.use_pf_ppo", algorithm.use_pf_ppo, "it resamples rows"),
            ("algorithm.difficulty_mask.enable", algorithm.difficulty_mask.enable, "it averages a group's rows"),
            ("algorithm.whiten_advantages", algorithm.whiten_advantages, "it whitens over every turn's tokens"),
            ("algorithm.advantages_per_domain", algorithm.advantages_per_domain, "not combined with it"),
            ("algorithm.on_policy_distillation", algorithm.on_policy_distillation, "its rewards are per token"),
        ):
            if value not in (None, False):
                refuse(f"{key}={fmt(value)}", f"{reason}, and a prompt has a sample per turn")
    if config.use_critic:
        refuse("critic.enable=true", "the advantages are the last turn's outcome advantages; no value function")
    if arr.actor.shuffle is True:
        refuse(f"{ARR}.actor.shuffle=true", "a mini-batch holds the samples of whole prompts (SkyRL's); set it false")
    actor = arr.actor
    dummy_rows = "a mini-batch of a varying number of samples is padded with dummy rows (response mask 0)"
    loss_mode = actor.policy_loss.loss_mode if valid(actor.policy_loss) else INVALID
    loss_spec = policy_loss_spec(loss_mode) if valid(loss_mode) else None
    if loss_spec is not None and loss_spec.rows_whatever_mask:
        refuse(
            f"{ARR}.actor.policy_loss.loss_mode={loss_mode}",
            f"{dummy_rows}, and {loss_spec.row_mean_by} averages its loss over a micro-batch's rows whatever their "
            f"mask",
        )
    correction = algorithm.rollout_correction if valid(algorithm) else None
    cap = actor.tis_imp_ratio_cap
    if (
        correction is not None
        and (correction.rollout_is is not None or correction.rollout_rs is not None or correction.bypass_mode is True)
    ) or (valid(cap) and cap > 0):
        refuse(
            "rollout correction (algorithm.rollout_correction or actor.tis_imp_ratio_cap)",
            f"{dummy_rows}, and its metrics count rows whatever their mask",
        )
    agent = arr.rollout.agent
    if agent.default_agent_loop not in STEP_WISE_LOOPS or agent.agent_loop_config_path or agent.enable_http_endpoint:
        refuse(
            f"{ARR}.rollout.agent (default_agent_loop={fmt(agent.default_agent_loop)}, agent_loop_config_path="
            f"{fmt(agent.agent_loop_config_path)}, enable_http_endpoint={fmt(agent.enable_http_endpoint)})",
            "only the environment_agent and tool_agent loops split a trajectory into its turns",
        )
    if config.reward_model.use_reward_loop is True:
        refuse("reward_model.use_reward_loop=true", "the reward loop scores whole trajectories as they finish")
    if config.async_mode is not None:
        refuse(f"{ARR}.hybrid_engine=false", "asynchronous training streams whole trajectories")


__all__ = ["check_step_wise"]
