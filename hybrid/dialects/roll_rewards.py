"""The ROLL dialect's rules for the `rewards` section (one reward worker per domain) and ROLL's
shared reward-model cluster, as rules of the ROLL dialect (roll.py): which of ROLL's reward
workers hybrid's scorers stand for, and the worker settings that only a refused worker reads.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.table import Context, Refusal, Rule, custom, ignore, refuse

RULE_REWARD_WORKERS = ("MathRuleRewardWorker",)
REWARD_WORKER_REFUSALS = {
    "CodeSandboxRewardWorker": (
        "runs each response's code against its row's test cases in a sandbox service (code_url) or in local "
        "processes (use_local): hybrid has no code sandbox; write a custom_reward_function"
    ),
    "LLMJudgeRewardWorker": (
        "ROLL's judge scores 1 when 'yes' appears anywhere in its lower-cased verdict (else 0), with a prompt "
        "from ROLL's prompt_maps, on its domain's rows only; hybrid's judge (reward_model.judge.*, "
        "docs/reward_loop.md) reads a verdict pattern on every row: set it up in verl keys"
    ),
    "GeneralRuleRewardWorker": (
        "ROLL's IFEval checks (ifeval_rule_reward_worker.py: about 25 instruction verifiers, some on nltk, each "
        "row's constraints from its ground truth, plus a repetition penalty): no hybrid scorer does these; write a "
        "custom_reward_function"
    ),
    "IfEvalRuleRewardWorker": "ROLL's IFEval checks: no hybrid scorer does these; write a custom_reward_function",
    "CrossThinkQARuleRewardWorker": (
        "ROLL's multiple-choice rule (the last \\boxed{} answer, else the text after the last 'answer is'; its "
        "first capital letter against the ground truth's; reward_type loose/soft/strict, plus a 3-gram repetition "
        "penalty): no hybrid scorer does this; write a custom_reward_function"
    ),
}


def _reward_worker(value: Any, ctx: Context) -> dict[str, Any]:
    name = str(value).rsplit(".", 1)[-1]
    if name in RULE_REWARD_WORKERS:
        return {}
    raise Refusal(
        REWARD_WORKER_REFUSALS.get(
            name,
            (
                "hybrid's rule scorers are gsm8k, math and arithmetic, picked by each row's data_source "
                "(reward/scorers); write a custom_reward_function for others"
            ),
        )
    )


REWARD_RULES: tuple[Rule, ...] = (
    custom(
        "rewards.<domain>.worker_cls",
        (),
        _reward_worker,
        "rule-based math workers accepted",
        "hybrid picks the scorer from each row's data_source (gsm8k, math, arithmetic)",
    ),
    ignore("rewards.<domain>.tag_included", "hybrid routes rows to scorers by their data_source column"),
    ignore(
        "rewards.<domain>.world_size",
        "hybrid's rule scorers run in the driver (or reward_model.reward_manager=prime's pool)",
    ),
    ignore("rewards.<domain>.infer_batch_size", "rule scorers score one response at a time"),
    ignore("rewards.<domain>.model_args.*", "rule scorers load no model"),
    ignore("rewards.<domain>.strategy_args.*", "rule scorers load no model (an LLM judge's worker_cls is refused)"),
    ignore(
        "rewards.<domain>.generating_args.*", "rule scorers generate nothing (an LLM judge's worker_cls is refused)"
    ),
    ignore("rewards.<domain>.device_mapping", "hybrid's rule scorers run in the driver"),
    ignore("rewards.<domain>.judge_prompt", "read only by LLMJudgeRewardWorker, whose worker_cls is refused"),
    ignore("rewards.<domain>.judge_model_type", "read only by LLMJudgeRewardWorker, whose worker_cls is refused"),
    ignore("rewards.<domain>.reward_type", "read only by ROLL's ifeval/crossthinkqa rule workers, which are refused"),
    ignore("rewards.<domain>.use_local", "read only by CodeSandboxRewardWorker, which is refused"),
    ignore("rewards.<domain>.data_args.*", "rule scorers read the decoded response"),
    refuse(
        "rewards.<domain>.query_filter_config.type",
        "no reward-based query filter in hybrid",
        accept=("no_filter",),
    ),
    refuse(
        "rewards.<domain>.response_filter_config.type",
        "no reward-based response filter in hybrid",
        accept=("no_filter",),
    ),
    ignore("rewards.<domain>.query_filter_config.filter_args.*", "read only with a filter type, which is refused"),
    ignore("rewards.<domain>.response_filter_config.filter_args.*", "read only with a filter type, which is refused"),
    refuse(
        "rewards.<domain>.response_length_penalty_coef",
        "no length penalty key (reward_model.reward_manager=dapo has an overlong penalty)",
        accept=(0, 0.0),
    ),
    refuse(
        "rewards.<domain>.reward_manager_config",
        "no reward plug-in system besides custom_reward_function",
        accept=lambda v: not v,
        accepts="[]",
    ),
    refuse(
        "rewards.<domain>.judge_model_name",
        "an LLM judge: use reward_model.* or a custom_reward_function",
        accept=(None,),
    ),
    refuse(
        "rewards.<domain>.judge_api_url",
        "an LLM judge: use reward_model.* or a custom_reward_function",
        accept=(None,),
    ),
    refuse("rewards.<domain>.code_url", "a code sandbox: write a custom_reward_function", accept=(None,)),
    refuse("reward_model.*", "ROLL's shared reward-model cluster: use reward_model.* in verl keys"),
)

__all__ = ["REWARD_RULES", "REWARD_WORKER_REFUSALS", "RULE_REWARD_WORKERS"]
