"""The ROLL dialect's rules for the `rewards` section (one reward worker per domain) and ROLL's
shared reward-model cluster, as rules of the ROLL dialect (roll.py): which of ROLL's reward
workers hybrid's scorers stand for, and the worker settings that only a refused worker reads.

With several domains (domain_interleave_probs), each domain's rows are scored by the scorer its
worker_cls stands for (`data.domain_scorers`, reward/domain_scorers.py) and its tag_included
routes rows to it (`data.domain_tags`, hybrid/domains.py). `WORKER_SCORERS` is the one table
from a ROLL worker class to a scorer module of reward/scorers: a new scorer is one line there.
An LLM-judge domain (LLMJudgeRewardWorker) is hybrid's judge on that domain's rows
(reward_model.judge.domains): roll_judge.py maps it and its worker settings.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.roll_convert import multi_domain
from hybrid.dialects.roll_judge import JUDGE_WORKER, judge_option, judge_worker
from hybrid.dialects.table import Context, Refusal, Rule, custom, ignore, refuse
from reward.domain_scorers import keyword_options, load_scorer

# ROLL reward worker class -> the module of reward/scorers that scores its domain's rows.
WORKER_SCORERS = {
    "MathRuleRewardWorker": "math",
    "CrossThinkQARuleRewardWorker": "roll_crossthinkqa",
    "GeneralRuleRewardWorker": "roll_ifeval",
    "CodeSandboxRewardWorker": "roll_code",
    # each row's reward_model settings and image size reach it (reward/row_fields.py)
    "DetectionRewardWorker": "roll_detection",
}
RULE_REWARD_WORKERS = tuple(WORKER_SCORERS)
REWARD_WORKER_REFUSALS = {
    "IfEvalRuleRewardWorker": (
        "no class of that name in ROLL (its IFEval worker is GeneralRuleRewardWorker, which maps to roll_ifeval)"
    ),
}


def _reward_worker(value: Any, ctx: Context) -> dict[str, Any]:
    """One domain: the math rule accepted, each row's data_source picks hybrid's scorer (as
    before domains). Several: the domain's rows go to the scorer WORKER_SCORERS names."""
    name = str(value).rsplit(".", 1)[-1]
    if name == JUDGE_WORKER:
        return judge_worker(ctx)
    if name in WORKER_SCORERS:
        if not multi_domain(ctx):
            if name != "MathRuleRewardWorker":
                raise Refusal(
                    f"{name} in a one-domain file: hybrid routes rows to a worker's scorer "
                    f"(reward/scorers/{WORKER_SCORERS[name]}.py) only with several domains "
                    "(domain_interleave_probs); with one, each row's data_source picks a scorer of verl's"
                )
            return {}
        domain = ctx.key.split(".")[1]
        return {f"data.domain_scorers.{domain}": WORKER_SCORERS[name]}
    raise Refusal(
        REWARD_WORKER_REFUSALS.get(
            name,
            (
                "hybrid's rule scorers for ROLL's workers: "
                + ", ".join(f"{w} -> reward/scorers/{m}.py" for w, m in WORKER_SCORERS.items())
                + f"; {JUDGE_WORKER} -> hybrid's judge on its domain; write a custom_reward_function for others"
            ),
        )
    )


def _tags(value: Any, ctx: Context) -> dict[str, Any]:
    """Several domains: the rows whose tag this lists belong to the domain (ROLL's tag_2_domain)."""
    if not multi_domain(ctx):
        return {}
    if value is None:
        return {}
    tags = [value] if isinstance(value, str) else list(value)
    return {f"data.domain_tags.{ctx.key.split('.')[1]}": [str(t) for t in tags]}


def _domain_scorer(ctx: Context, domain: str) -> str | None:
    """The scorer module of a domain's worker_cls in WORKER_SCORERS, if any."""
    worker = ctx.get(f"rewards.{domain}.worker_cls", None)
    return None if worker is None else WORKER_SCORERS.get(str(worker).rsplit(".", 1)[-1])


def _scorer_option(rule: Rule) -> Rule:
    """A worker setting its domain's scorer takes as a keyword argument (reward_type, use_local,
    ...): with several domains it goes to data.domain_scorer_kwargs.<domain>; otherwise `rule`
    (the setting read only by a refused worker, or refused itself) decides."""
    option = rule.key.rsplit(".", 1)[-1]

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        domain = ctx.key.split(".")[1]
        scorer = _domain_scorer(ctx, domain)
        if multi_domain(ctx) and scorer is not None:
            if option in keyword_options(load_scorer(scorer, f"rewards.{domain}.worker_cls")):
                return {f"data.domain_scorer_kwargs.{domain}.{option}": value}
        return rule.convert(value, ctx)

    how = f"several domains, when the domain's scorer takes {option}: data.domain_scorer_kwargs.<domain>.{option}"
    return Rule(rule.key, (f"data.domain_scorer_kwargs.<domain>.{option}",), convert, how, rule.note, "map")


REWARD_RULES: tuple[Rule, ...] = (
    custom(
        "rewards.<domain>.worker_cls",
        ("data.domain_scorers.<domain>",),
        _reward_worker,
        "one domain: the rule-based math worker accepted, each row's data_source picks hybrid's scorer (gsm8k, "
        "math, arithmetic); several domains: the domain's scorer, "
        + ", ".join(f"{w} -> {m}" for w, m in WORKER_SCORERS.items())
        + f"; {JUDGE_WORKER} (one domain of several): reward_model.judge.domains=[<domain>], the judge's model, "
        "prompt, sampling and ROLL's verdict rule (1 when 'yes' is in the lower-cased verdict, else 0; "
        "hybrid/dialects/roll_judge.py)",
        "with several domains each domain's rows are scored by its own scorer (reward/domain_scorers.py); hybrid's "
        "math scorer compares the last \\boxed{} answer after MATH normalisation, ROLL's math rule uses math_verify; "
        "the judge's verdicts without 'yes' (ROLL's 0) are counted as reward_loop/judge_unparsable",
    ),
    custom(
        "rewards.<domain>.tag_included",
        ("data.domain_tags.<domain>",),
        _tags,
        "several domains: same list (the rows whose tag column it lists have this domain); one domain: unread",
        "a row's own domain column wins; a row whose tag no domain lists has domain math_rule, as in ROLL",
    ),
    judge_option(
        ignore(
            "rewards.<domain>.world_size",
            "hybrid's rule scorers run in the driver (or reward_model.reward_manager=prime's pool)",
        ),
        "world_size",
    ),
    judge_option(
        ignore("rewards.<domain>.infer_batch_size", "rule scorers score one response at a time"), "infer_batch_size"
    ),
    judge_option(ignore("rewards.<domain>.model_args.*", "rule scorers load no model"), "model_args"),
    judge_option(ignore("rewards.<domain>.strategy_args.*", "rule scorers load no model"), "strategy_args"),
    judge_option(ignore("rewards.<domain>.generating_args.*", "rule scorers generate nothing"), "generating_args"),
    judge_option(
        ignore("rewards.<domain>.device_mapping", "hybrid's rule scorers run in the driver"), "device_mapping"
    ),
    judge_option(ignore("rewards.<domain>.judge_prompt", "read only by LLMJudgeRewardWorker"), "judge_prompt"),
    judge_option(ignore("rewards.<domain>.judge_model_type", "read only by LLMJudgeRewardWorker"), "judge_model_type"),
    _scorer_option(
        ignore("rewards.<domain>.reward_type", "otherwise unread (ROLL's CrossThinkQA worker reads it, IFEval's not)")
    ),
    _scorer_option(ignore("rewards.<domain>.use_local", "otherwise read only by CodeSandboxRewardWorker")),
    judge_option(ignore("rewards.<domain>.data_args.*", "rule scorers read the decoded response"), "data_args"),
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
    _scorer_option(
        refuse(
            "rewards.<domain>.response_length_penalty_coef",
            "no length penalty key (reward_model.reward_manager=dapo has an overlong penalty)",
            accept=(0, 0.0),
        )
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
    _scorer_option(
        refuse("rewards.<domain>.code_url", "a code sandbox: write a custom_reward_function", accept=(None,))
    ),
    refuse("reward_model.*", "ROLL's shared reward-model cluster: use reward_model.* in verl keys"),
)

__all__ = ["REWARD_RULES", "REWARD_WORKER_REFUSALS", "RULE_REWARD_WORKERS", "WORKER_SCORERS"]
