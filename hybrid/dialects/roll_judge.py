"""ROLL's LLM-judge domain (`rewards.<domain>.worker_cls=...LLMJudgeRewardWorker`) as hybrid's
judge limited to that domain's rows (reward_model.judge.domains, reward/reward_loop.py), for the
ROLL dialect's rewards rules (roll_rewards.py).

What ROLL's worker does (roll/pipeline/rlvr/rewards/llm_judge_reward_worker.py): each row of its
domain gets the prompt `judge_prompt` names in prompt_maps (roll_judge_prompts.py), filled with
the question (the decoded prompt's text after its last "user\n", stripped: with Qwen's template
the user's message and an "assistant" line), the decoded response and the row's ground truth,
as one user message in the
judge tokenizer's chat template (data_args.template qwen2_5/qwen3/native: apply_chat_template
with the generation prompt); the judge model (model_args.model_name_or_path, served by vLLM or
HF generate) samples with generating_args (ROLL's defaults where a key is not given), and the
score is 1 when "yes" appears anywhere in the lower-cased verdict, else 0. Here: the same prompt,
model and sampling in hybrid's reward engine, and the verdict rule as hybrid's pattern `(?i)(yes)`
with the label yes -> 1 and 0 for a verdict without it. The other domains keep their rule scorers.
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.roll_convert import multi_domain
from hybrid.dialects.roll_judge_prompts import judge_template
from hybrid.dialects.table import Context, Refusal, Rule

JUDGE_WORKER = "LLMJudgeRewardWorker"
# ROLL's verdict rule (_extract_score_v2): 1 when "yes" is in the lower-cased text, else 0.
YES_PATTERN = "(?i)(yes)"
# ROLL's {question}: the decoded prompt's text after its last "user\n", stripped (_format_judge_prompt).
ROLL_QUESTION_AFTER = "user\n"
# roll/configs/generating_args.py's defaults, for the keys a file does not give.
ROLL_GENERATING_DEFAULTS = {"temperature": 0.95, "top_p": 0.7, "top_k": 50, "max_new_tokens": 8192}
SAMPLING_KEYS = {
    "temperature": "reward_model.judge.temperature",
    "top_p": "reward_model.judge.top_p",
    "top_k": "reward_model.judge.top_k",
    "max_new_tokens": "reward_model.rollout.response_length",
}
# ROLL's data_args.template names that apply the judge tokenizer's own chat template
# (roll/datasets/chat_template.py; qwen3 adds enable_thinking=True, those templates' default).
OWN_TEMPLATE = ("native", "qwen2_5", "qwen3")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ENGINE_KEYS = {
    "gpu_memory_utilization": "reward_model.rollout.gpu_memory_utilization",
    "max_model_len": "reward_model.rollout.max_model_len",
    "load_format": "reward_model.rollout.load_format",
    "disable_log_stats": "reward_model.rollout.disable_log_stats",
    "block_size": "reward_model.rollout.engine_kwargs.vllm.block_size",
}
PLACEMENT_NOTE = (
    "the judge is hybrid's reward engine (vLLM, reward_model.rollout.*): on a CPU machine it shares the cores with "
    "the trainer; with GPUs a served judge is refused at start in this version (docs/reward_loop.md: its GPU "
    "placement is not built), so ROLL's device_mapping has no counterpart"
)


def _worker_name(ctx: Context, domain: str) -> str | None:
    worker = ctx.get(f"rewards.{domain}.worker_cls", None)
    return None if worker is None else str(worker).rsplit(".", 1)[-1]


def is_judge(ctx: Context) -> bool:
    """Whether the key's domain (rewards.<domain>....) is an LLM-judge domain of a multi-domain file."""
    return multi_domain(ctx) and _worker_name(ctx, ctx.key.split(".")[1]) == JUDGE_WORKER


def judge_worker(ctx: Context) -> dict[str, Any]:
    """worker_cls=LLMJudgeRewardWorker: hybrid's judge on this domain's rows, its prompt, verdict
    rule, model and sampling (the file's generating_args, else ROLL's defaults)."""
    domain = ctx.key.split(".")[1]
    if not multi_domain(ctx):
        raise Refusal(
            f"{JUDGE_WORKER} in a one-domain file: hybrid limits its judge to a domain's rows only with several "
            "domains (domain_interleave_probs); with one, set reward_model.judge.* in verl keys"
        )
    others = [
        d
        for d in sorted({k.split(".")[1] for k in ctx.given if k.startswith("rewards.")})
        if d != domain and _worker_name(ctx, d) == JUDGE_WORKER
    ]
    if others:
        raise Refusal(f"hybrid serves one judge: domains {domain} and {', '.join(others)} both name {JUDGE_WORKER}")
    prefix = f"rewards.{domain}"
    kind = ctx.get(f"{prefix}.judge_model_type", "api")
    if kind != "inference":
        raise Refusal(
            f"{prefix}.judge_model_type={kind} (ROLL's default is api): only inference (the judge model served "
            "here) is mapped; for a judge behind an API use reward_model.judge.base_url in verl keys"
        )
    name = ctx.get(f"{prefix}.judge_prompt", None)
    if name is None:
        raise Refusal(
            f"{prefix}.judge_prompt is not set: ROLL's fallback prompt asks for a 0-10 score that its yes/no rule "
            "does not read; name a prompt of ROLL's prompt_maps"
        )
    path = ctx.get(f"{prefix}.model_args.model_name_or_path", None)
    if path is None:
        raise Refusal(f"{prefix}.model_args.model_name_or_path is not set: the judge model's path")
    out: dict[str, Any] = {
        "reward_model.enable": True,
        "reward_model.use_reward_loop": True,
        "reward_model.combine": "sum",
        "reward_model.model.path": path,
        "reward_model.judge.domains": [domain],
        "reward_model.judge.prompt_template": judge_template(str(name), f"{prefix}.judge_prompt"),
        "reward_model.judge.prompt_after": ROLL_QUESTION_AFTER,
        "reward_model.judge.verdict_pattern": YES_PATTERN,
        "reward_model.judge.verdict_labels": {"yes": 1.0},
        "reward_model.judge.min_score": 0.0,
        "reward_model.judge.max_score": 1.0,
        "reward_model.judge.invalid_score": 0.0,
    }
    for key, verl in SAMPLING_KEYS.items():
        out[verl] = ctx.get(f"{prefix}.generating_args.{key}", ROLL_GENERATING_DEFAULTS[key])
    return out


def _option(ctx: Context) -> str:
    """The part of the key after rewards.<domain>.<section>."""
    return ".".join(ctx.key.split(".")[3:])


def _generating(value: Any, ctx: Context) -> dict[str, Any]:
    option = _option(ctx)
    if option in SAMPLING_KEYS:
        return {}  # judge_worker writes it (with ROLL's default when not given)
    accepted = {
        "do_sample": (True,),
        "num_beams": (1,),
        "num_return_sequences": (1,),
        "repetition_penalty": (1, 1.0),
        "length_penalty": (1, 1.0),  # read by beam search only
        "stop_strings": (None,),
        "include_stop_str_in_output": (None, False),
        "logprobs": (None, 0),
    }
    if option == "max_length" or (option in accepted and value in accepted[option]):
        return {}  # max_length: max_new_tokens (given or ROLL's default) overrides it, as in ROLL's to_dict
    if option in accepted:
        raise Refusal(f"the judge samples one verdict; accepted: {option} in {list(accepted[option])}")
    raise Refusal(f"no counterpart in hybrid's judge (it takes {', '.join(SAMPLING_KEYS)})")


def _model(value: Any, ctx: Context) -> dict[str, Any]:
    option = _option(ctx)
    if option == "model_name_or_path":
        return {"reward_model.model.path": value}
    if option == "dtype":
        if value not in DTYPES:
            raise Refusal(f"the judge's dtype: one of {', '.join(DTYPES)}")
        return {"reward_model.rollout.dtype": DTYPES[value]}
    if option in ("attn_implementation", "disable_gradient_checkpointing", "model_type"):
        return {}  # vLLM picks its attention kernels; the judge trains nothing; trl's value head is not used
    raise Refusal("no counterpart for the judge model (model_name_or_path, dtype are mapped)")


def _strategy(value: Any, ctx: Context) -> dict[str, Any]:
    option = _option(ctx)
    if option == "strategy_name":
        if value not in ("vllm", "hf_infer"):
            raise Refusal("the judge runs in hybrid's vLLM reward engine: strategy_name vllm or hf_infer")
        return {}
    if option == "strategy_config":  # null: the engine's defaults
        if value:
            raise Refusal("give the engine's settings as keys of strategy_config")
        return {}
    engine_key = option.removeprefix("strategy_config.")
    if engine_key in ENGINE_KEYS:
        if engine_key == "load_format" and value != "auto":
            raise Refusal("the judge loads real weights: load_format auto")
        return {ENGINE_KEYS[engine_key]: value}
    raise Refusal(f"no counterpart in reward_model.rollout (mapped: {', '.join(ENGINE_KEYS)})")


def _data(value: Any, ctx: Context) -> dict[str, Any]:
    if _option(ctx) == "template" and value not in OWN_TEMPLATE:
        raise Refusal(f"the judge uses its tokenizer's own chat template, which ROLL's {', '.join(OWN_TEMPLATE)} apply")
    return {}


JUDGE_CONVERTS = {
    "generating_args": _generating,
    "model_args": _model,
    "strategy_args": _strategy,
    "data_args": _data,
    "device_mapping": lambda value, ctx: {},
    "infer_batch_size": lambda value, ctx: {},  # the engine batches every verdict in flight
    "world_size": lambda value, ctx: {},
    "judge_prompt": lambda value, ctx: {},  # judge_worker reads it
    "judge_model_type": lambda value, ctx: {},  # judge_worker reads it
}
JUDGE_VERL = {
    "generating_args": tuple(SAMPLING_KEYS.values()),
    "model_args": ("reward_model.model.path", "reward_model.rollout.dtype"),
    "strategy_args": tuple(ENGINE_KEYS.values()),
}
JUDGE_NOTES = {
    "generating_args": "LLM judge: temperature, top_p, top_k -> reward_model.judge.*, max_new_tokens -> "
    "reward_model.rollout.response_length (ROLL's defaults 0.95, 0.7, 50, 8192 when not given); one verdict "
    "(num_beams, num_return_sequences 1)",
    "model_args": "LLM judge: model_name_or_path -> reward_model.model.path, dtype -> reward_model.rollout.dtype",
    "strategy_args": "LLM judge: vllm or hf_infer -> hybrid's vLLM reward engine; strategy_config "
    + ", ".join(ENGINE_KEYS)
    + " -> reward_model.rollout.*; without max_model_len the engine holds reward_model.rollout.prompt_length + "
    "response_length tokens (cut to the model's limit), where ROLL's hf_infer holds the model's: a longer judge "
    "prompt scores invalid_score with judge_status error, so raise prompt_length for long responses",
    "data_args": "LLM judge: template " + "/".join(OWN_TEMPLATE) + " = the judge tokenizer's own chat template",
    "device_mapping": "LLM judge: " + PLACEMENT_NOTE,
    "infer_batch_size": "LLM judge: no effect (the engine batches every verdict in flight)",
    "judge_prompt": "LLM judge: ROLL's prompt_maps name -> reward_model.judge.prompt_template "
    "(hybrid/dialects/roll_judge_prompts.py)",
    "judge_model_type": "LLM judge: inference only (api refused)",
}


def judge_option(rule: Rule, section: str) -> Rule:
    """`rule` for a rule worker's domain; the judge's mapping of `section` (JUDGE_CONVERTS) for the
    LLM-judge domain of a multi-domain file."""

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if is_judge(ctx):
            return JUDGE_CONVERTS[section](value, ctx)
        return rule.convert(value, ctx)

    how = f"rule workers: {rule.how or rule.note}" + (f"; {JUDGE_NOTES[section]}" if section in JUDGE_NOTES else "")
    return Rule(rule.key, rule.verl + JUDGE_VERL.get(section, ()), convert, how, "", "map")


__all__ = ["JUDGE_WORKER", "YES_PATTERN", "is_judge", "judge_option", "judge_worker"]
