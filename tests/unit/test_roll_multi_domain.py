"""ROLL's multi-domain RLVR files (examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml and its kin in
tests/data/peer_examples/roll.json): what the dialect accepts of them (actor_infer's LoRA settings
when they are actor_train's; several domains as per-domain quotas, tags and scorers; the
megatron_infer reference; actor_infer on part of actor_train's devices) and the exact reasons it
refuses the rest."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from hybrid.dialects.roll_rewards import WORKER_SCORERS
from hybrid.domains import domain_quotas
from tests.integration.roll_helpers import write_example
from tests.unit.dialect_helpers import as_dict

LORA_EXAMPLE = "examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_fsdp2.yaml"
MULTI_DOMAIN = "examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml"


def _problems(path, *extra) -> list[str]:
    with pytest.raises(ConfigError) as err:
        translate_argv(["--roll-config", str(path), *extra])
    return [line[4:] for line in str(err.value).splitlines() if line.startswith("  - ")]


def test_actor_infer_lora_settings_are_accepted_when_they_are_actor_trains(tmp_path):
    path = write_example(tmp_path, LORA_EXAMPLE)
    translate_argv(["--roll-config", str(path)])  # understood: rank 32, alpha 32, targets o,q,k,v on both
    problems = _problems(path, "actor_infer.model_args.lora_rank=16")
    assert (
        "actor_infer.model_args.lora_rank=16: must equal actor_train.model_args.lora_rank (32): the engine serves "
        "the adapter actor_train trains" in problems
    )


def test_multi_domain_file_is_understood_with_its_llm_judge(tmp_path):
    # domain_interleave_probs, actor_infer on 12 of actor_train's 16 devices, the megatron_infer
    # reference, the rule workers (math, CrossThinkQA, IFEval, code sandbox) and the LLM judge's
    # domain (tests/unit/test_roll_judge.py) are understood.
    path = write_example(tmp_path, MULTI_DOMAIN)
    config = build_config(translate_argv(["--roll-config", str(path)]))
    assert config.reward_model.judge.domains == ("llm_judge",)
    assert "llm_judge" not in dict(config.data.domain_scorers)


def test_each_rule_workers_domain_goes_to_its_scorer(tmp_path):
    path = write_example(tmp_path, MULTI_DOMAIN)
    math = "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"
    argv = translate_argv(["--roll-config", str(path), f"rewards.llm_judge.worker_cls={math}"])
    data = build_config(argv).data
    assert dict(data.domain_scorers) == {
        "math_rule": "math",
        "code_sandbox": "roll_code",
        "llm_judge": "math",
        "crossthinkqa": "roll_crossthinkqa",
        "ifeval": "roll_ifeval",
    }
    assert dict(data.domain_scorer_kwargs["crossthinkqa"]) == {"reward_type": "soft", "response_length_penalty_coef": 0}
    assert dict(data.domain_scorer_kwargs["code_sandbox"]) == {"use_local": True}
    assert WORKER_SCORERS["GeneralRuleRewardWorker"] == "roll_ifeval"


def test_a_rule_worker_other_than_math_in_a_one_domain_file_is_refused(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text(
        "rewards:\n  crossthinkqa:\n    worker_cls: "
        "roll.pipeline.rlvr.rewards.crossthinkqa_rule_reward_worker.CrossThinkQARuleRewardWorker\n"
    )
    problems = _problems(one)
    assert any(
        "CrossThinkQARuleRewardWorker in a one-domain file: hybrid routes rows to a worker's scorer "
        "(reward/scorers/roll_crossthinkqa.py) only with several domains" in p
        for p in problems
    ), problems


TWO_DOMAINS = """
rollout_batch_size: 10
seed: 7
actor_train:
  training_args:  # 2 x 5 x 4 devices = 40 samples: one optimizer step of the 10 prompts x 4
    per_device_train_batch_size: 2
    gradient_accumulation_steps: 5
  data_args:
    domain_interleave_probs:
      school: 0.29
      math_rule: 0.5
  device_mapping: list(range(0,4))
actor_infer:
  device_mapping: list(range(0,2))
reference:
  strategy_args:
    strategy_name: megatron_infer
    strategy_config:
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 1
rewards:
  math_rule:
    worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker
    tag_included: [deepmath_103k, aime]
  school:
    worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker
    tag_included: gsm8k
"""


def test_two_domains_become_quotas_tags_and_scorers(tmp_path, capsys):
    path = tmp_path / "rlvr.yaml"
    path.write_text(TWO_DOMAINS)
    overrides = as_dict(translate_argv(["--roll-config", str(path)]))
    assert {k: v for k, v in overrides.items() if k.startswith("data.") and "domain" in k or k.endswith("fn_key")} == {
        "data.domain_quotas.school": 0.29,
        "data.domain_quotas.math_rule": 0.5,
        "data.reward_fn_key": "domain",
        "data.default_domain": "math_rule",
        "data.domain_tags.math_rule": ["deepmath_103k", "aime"],
        "data.domain_tags.school": ["gsm8k"],
        "data.domain_scorers.math_rule": "math",
        "data.domain_scorers.school": "math",
    }
    assert overrides["algorithm.advantages_per_domain"] is True  # ROLL computes each domain's advantages apart
    # the reference's Megatron forward is hybrid's FSDP2 forward; the engines colocate on all 4 devices
    assert overrides["actor_rollout_ref.ref.strategy"] == "fsdp2"
    assert (overrides["trainer.nnodes"], overrides["trainer.n_gpus_per_node"]) == (1, 4)
    assert "hybrid colocates its engines on all 4 of them" in capsys.readouterr().out
    config = build_config(translate_argv(["--roll-config", str(path)]))
    assert list(config.data.domain_quotas) == ["school", "math_rule"]  # ROLL's batch order
    assert domain_quotas(config.data.domain_quotas, config.data.train_batch_size) == {"school": 2, "math_rule": 8}


@pytest.mark.parametrize(
    "override, reason",
    [
        ("actor_infer.device_mapping='list(range(2,6))'", "shares some of actor_train's devices"),
        ("+async_generation_ratio=1", "shares some of actor_train's devices"),
        ("reference.strategy_args.strategy_config.tensor_model_parallel_size=null", None),
        ("+reference.strategy_args.strategy_config.recompute_granularity=full", "not a layout setting"),
        ("+add_token_level_kl=true", None),  # a fixed KL coefficient: the same in each domain
        ("+add_token_level_kl=true +target_kl=0.1", "updates its adaptive KL controller once per domain"),
    ],
)
def test_what_stays_refused_around_the_multi_domain_mappings(tmp_path, override, reason):
    path = tmp_path / "rlvr.yaml"
    path.write_text(TWO_DOMAINS)
    if reason is None:
        translate_argv(["--roll-config", str(path), *override.split()])
        return
    assert any(reason in p for p in _problems(path, *override.split()))
