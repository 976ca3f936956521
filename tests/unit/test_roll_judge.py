"""ROLL's LLM-judge domain in hybrid: the judge limited to some domains' rows
(reward_model.judge.domains: reward/reward_loop.py's routing, hybrid/reward_loop.py's scores,
hybrid/domains.py's rules), ROLL's prompt (hybrid/dialects/roll_judge_prompts.py) and verdict
rule, and the ROLL dialect's mapping of the four multi-domain RLVR files' llm_judge domain
(hybrid/dialects/roll_judge.py)."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

import pytest
import torch

from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from hybrid.dialects.roll_judge import YES_PATTERN
from hybrid.dialects.roll_judge_prompts import PROMPT_MAPS, judge_template
from hybrid.dialects.table import Refusal
from hybrid.reward_loop import RewardLoop
from protocol.data_proto import DataProto
from reward.judge import OK, Verdict, compile_pattern, parse_verdict, render
from reward.reward_loop import NOT_JUDGED, RewardLoopWorker
from tests.integration.roll_helpers import write_example
from workers.reward_engine import GENERATIVE

RLVR_PROMPT = "Qwen2.5-7B-Instruct-RLVR-prompt"
FILES = (
    "examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml",
    "examples/qwen3-8B-rlvr_fsdp2/rlvr_config_wo_cpuoffload.yaml",
    "examples/qwen2.5-7B-rlvr_megatron/rlvr_fsdp2_sp2.yaml",
    "examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_fsdp2.yaml",
)


# ---------------------------------------------------------------- ROLL's prompt and verdict rule


def test_the_prompt_is_rolls_text_and_renders_as_rolls_format():
    # sha256 of prompt_maps["Qwen2.5-7B-Instruct-RLVR-prompt"] in ROLL's roll/utils/prompt.py (commit 8eb27cc2).
    text = PROMPT_MAPS[RLVR_PROMPT]
    digest = "610ec522a4757b467bdbd971eda0335dfe8aa506832fefae4afa69355814473d"
    assert hashlib.sha256(text.encode()).hexdigest() == digest
    question, response, reference = "What is {x} + 1?", "It is \\boxed{2}. {ground_truth}", "2"
    ours = render(judge_template(RLVR_PROMPT, "judge_prompt"), question, response, reference)
    assert ours == text.format(question=question, response=response, reference=reference)


def test_an_unknown_prompt_name_is_refused_in_one_line():
    with pytest.raises(Refusal) as err:
        judge_template("Qwen3-judge", "rewards.llm_judge.judge_prompt")
    assert str(err.value) == (
        "rewards.llm_judge.judge_prompt='Qwen3-judge' is not in ROLL's prompt_maps (roll/utils/prompt.py: "
        "Qwen2.5-7B-Instruct-RLVR-prompt); ROLL would fall back to its 0-10 prompt, whose score its yes/no rule "
        "does not read"
    )


@pytest.mark.parametrize(
    "verdict, roll_score",  # ROLL's _extract_score_v2: 1 when "yes" is in the lower-cased text, else 0
    [("YES", 1), ("yes.", 1), ("**Yes**", 1), ("NO", 0), ("No", 0), ("no, yes", 1), ("eyes", 1), ("", 0), ("N/A", 0)],
)
def test_rolls_verdict_rule(verdict, roll_score):
    parsed = parse_verdict(verdict, compile_pattern(YES_PATTERN), 0.0, 1.0, 0.0, {"yes": 1.0})
    assert parsed.score == roll_score


def _rolls_judge_prompt(judge_prompt: str, prompt: str, response: str, reference: str) -> str:
    """ROLL's LLMJudgeRewardWorker._format_judge_prompt (a judge_prompt named), as ROLL writes it."""
    if "user\n" in prompt:
        prompt = prompt.split("user\n")[-1].strip()
    return judge_prompt.format(question=prompt, response=response, reference=reference)


@pytest.mark.parametrize(
    "decoded",  # the policy's prompt decoded without special tokens: Qwen's chat template, and none
    ["system\nYou are helpful.\nuser\nWhat is 2+3?\nassistant\n", "What is 2+3? Put it in a box."],
)
def test_the_judges_question_is_rolls_cut_of_the_decoded_prompt(decoded):
    worker = RewardLoopWorker.__new__(RewardLoopWorker)
    template = judge_template(RLVR_PROMPT, "judge_prompt")
    judge = SimpleNamespace(prompt_after="user\n", prompt_template=template, system_prompt=None)
    worker.rm = SimpleNamespace(judge=judge)
    # A character-level tokenizer: ids are code points.
    worker.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: "".join(map(chr, ids)))
    raw = [{"role": "user", "content": "ignored: the decoded prompt is read"}]
    sample = {
        "prompt_ids": [ord(c) for c in decoded],
        "response_ids": [ord(c) for c in "It is 5."],
        "raw_prompt": raw,
        "reward_model": {"ground_truth": "5"},
    }
    expected = _rolls_judge_prompt(PROMPT_MAPS[RLVR_PROMPT], decoded, "It is 5.", "5")
    assert worker._judge_messages(sample) == [{"role": "user", "content": expected}]


# ---------------------------------------------------------------- the judge on some domains' rows


def _worker(domains, verdicts: dict[str, float]):
    """A reward-loop worker whose reward function and judge record which rows reach them."""
    worker = RewardLoopWorker.__new__(RewardLoopWorker)
    worker.rm = SimpleNamespace(enable=True)
    worker.kind, worker.pad_token_id = GENERATIVE, 0
    worker.judge_domains, worker.domain_key = domains, "domain"
    worker.ruled, worker.judged_rows = [], []

    def manager(row, return_dict):
        worker.ruled.append(row.non_tensor_batch["domain"][0])
        return {"reward_tensor": torch.tensor([[0.25]]), "reward_extra_info": {}}

    async def verdict(sample):
        worker.judged_rows.append(sample["domain"])
        return Verdict(verdicts[sample["domain"]], OK, "recorded")

    worker.manager, worker._verdict = manager, verdict
    return worker


def _score(worker, domain):
    sample = {"prompt_ids": [5, 6], "response_ids": [7], "domain": domain}
    return asyncio.run(worker.score(sample))


def test_a_domain_limited_judge_scores_only_its_domains_rows_and_the_rules_the_rest():
    worker = _worker(frozenset({"llm_judge"}), {"llm_judge": 1.0})
    judged, ruled = _score(worker, "llm_judge"), _score(worker, "math_rule")
    assert (judged["score"], judged["rm_score"], judged["judge_status"]) == (None, 1.0, OK)
    assert (ruled["score"], ruled["rm_score"], ruled["judge_status"]) == (0.25, 0.0, NOT_JUDGED)
    assert worker.judged_rows == ["llm_judge"] and worker.ruled == ["math_rule"]


def test_without_domains_the_judge_and_the_rules_score_every_row():
    worker = _worker(None, {"math_rule": 0.0})
    result = _score(worker, "math_rule")
    assert (result["score"], result["rm_score"], result["judge_status"]) == (0.25, 0.0, OK)
    assert worker.judged_rows == ["math_rule"] and worker.ruled == ["math_rule"]


def test_the_batch_scores_are_the_judges_on_its_rows_and_the_rules_on_the_others():
    loop = RewardLoop.__new__(RewardLoop)
    loop.config = SimpleNamespace(reward_model=SimpleNamespace(enable=True, combine="sum"))
    loop.kind = GENERATIVE
    rows = [  # a judged row (no rule score), a rule row (not judged)
        {"score": None, "rm_score": 1.0, "judge_status": OK, "extra": {}, "metrics": {}, "latency_s": 0.1},
        {"score": 0.25, "rm_score": 0.0, "judge_status": NOT_JUDGED, "extra": {}, "metrics": {}, "latency_s": 0.1},
    ]
    loop.results = lambda batch, use_reward_fn: rows
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # responses of 2 and 3 tokens
    batch = DataProto.from_dict(
        tensors={"prompts": torch.ones(2, 2, dtype=torch.long), "responses": torch.ones(2, 3), "attention_mask": mask}
    )
    out = loop.score(batch, True, None)
    assert out["reward_tensor"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.25]]
    assert out["reward_metrics"]["reward_loop/judge_ok"] == 1.0
    assert "reward_loop/judge_agrees_with_reward_fn" not in out["reward_metrics"]  # no row has both scores


JUDGED = [
    "data.domain_quotas={a: 0.5, b: 0.5}",
    "data.reward_fn_key=domain",
    "data.domain_scorers={a: math}",
    "reward_model.judge.domains=[b]",
]


@pytest.mark.parametrize(
    "extra, problem",
    [
        (
            [],
            "reward_model.judge.domains is read by the reward loop's judge: set reward_model.enable=true and "
            "reward_model.use_reward_loop=true, or unset it",
        ),
        (
            ["reward_model.combine=rm_only"],
            "reward_model.judge.domains: the other domains' rows are scored by their rule scorers alone, which "
            "reward_model.combine=rm_only would drop; set it to sum",
        ),
        (
            ["reward_model.judge.domains=[c]"],
            "reward_model.judge.domains: c not among data.domain_quotas' domains (a, b)",
        ),
        (
            ["data.domain_scorers={a: math, b: math}"],
            "reward_model.judge.domains and data.domain_scorers both score domain(s) b: keep one (the judge's rows "
            "get no rule score)",
        ),
    ],
)
def test_the_rules_of_a_domain_limited_judge(extra, problem):
    with pytest.raises(ConfigError) as err:
        build_config([*JUDGED, *extra])
    assert problem in str(err.value)


def test_a_judged_domain_needs_no_rule_scorer():
    on = ["reward_model.enable=true", "reward_model.use_reward_loop=true", "reward_model.model.path=/judge"]
    assert build_config([*JUDGED, *on]).reward_model.judge.domains == ("b",)
    with pytest.raises(ConfigError) as err:
        build_config([*JUDGED[:3], *on])
    assert "data.domain_scorers names no scorer for domain(s) b of data.domain_quotas" in str(err.value)


# ---------------------------------------------------------------- the ROLL dialect


def _config(tmp_path, example, *extra):
    path = write_example(tmp_path, example)
    return build_config(translate_argv(["--roll-config", str(path), *extra]))


@pytest.mark.parametrize("example", FILES)
def test_the_four_multi_domain_files_map_their_llm_judge(tmp_path, example):
    config = _config(tmp_path, example)
    rm = config.reward_model
    judge = rm.judge
    assert (rm.enable, rm.use_reward_loop, rm.combine) == (True, True, "sum")
    assert judge.domains == ("llm_judge",)
    assert judge.prompt_template == judge_template(RLVR_PROMPT, "judge_prompt")
    assert judge.prompt_after == "user\n"
    assert (judge.verdict_pattern, dict(judge.verdict_labels), judge.invalid_score) == ("(?i)(yes)", {"yes": 1.0}, 0)
    assert (judge.temperature, judge.top_p, judge.top_k, rm.rollout.response_length) == (0.8, 0.8, 50, 100)
    assert rm.rollout.dtype == "bfloat16"
    assert list(config.data.domain_tags["llm_judge"]) == ["RLVR"]
    assert "llm_judge" not in dict(config.data.domain_scorers)
    if "qwen3-8B" in example:  # vllm with its strategy_config
        assert rm.model.path == "virtuoussy/Qwen2.5-7B-Instruct-RLVR"
        assert (rm.rollout.gpu_memory_utilization, rm.rollout.max_model_len) == (0.8, 8000)
        assert dict(rm.rollout.engine_kwargs.vllm) == {"block_size": 16}


def test_rolls_sampling_defaults_apply_where_the_file_gives_none(tmp_path):
    drop = [f"~rewards.llm_judge.generating_args.{k}" for k in ("temperature", "top_p", "top_k", "max_new_tokens")]
    rm = _config(tmp_path, FILES[0], *drop).reward_model
    assert (rm.judge.temperature, rm.judge.top_p, rm.judge.top_k, rm.rollout.response_length) == (0.95, 0.7, 50, 8192)


@pytest.mark.parametrize(
    "override, reason",
    [
        ("rewards.llm_judge.judge_model_type=api", "judge_model_type=api (ROLL's default is api): only inference"),
        ("rewards.llm_judge.judge_prompt=mine", "rewards.llm_judge.judge_prompt='mine' is not in ROLL's prompt_maps"),
        ("rewards.llm_judge.generating_args.num_beams=4", "the judge samples one verdict; accepted: num_beams in [1]"),
        ("rewards.llm_judge.data_args.template=chatml", "the judge uses its tokenizer's own chat template"),
        ("rewards.llm_judge.strategy_args.strategy_name=sglang", "strategy_name vllm or hf_infer"),
        (
            "rewards.math_rule.worker_cls=roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker",
            "hybrid serves one judge: domains llm_judge and math_rule both name LLMJudgeRewardWorker",
        ),
    ],
)
def test_what_the_judge_mapping_refuses(tmp_path, override, reason):
    path = write_example(tmp_path, FILES[0])
    with pytest.raises(ConfigError) as err:
        translate_argv(["--roll-config", str(path), override])
    assert reason in str(err.value)
