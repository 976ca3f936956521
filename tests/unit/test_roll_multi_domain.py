"""ROLL's multi-domain RLVR files (examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml and its kin in
tests/data/peer_examples/roll.json): what the dialect accepts of them (actor_infer's LoRA settings
when they are actor_train's) and the exact reasons it refuses the rest."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError
from hybrid.dialects import translate_argv
from tests.integration.roll_helpers import write_example

LORA_EXAMPLE = "examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_fsdp2.yaml"
MULTI_DOMAIN = "examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml"


def _problems(path, *extra) -> list[str]:
    with pytest.raises(ConfigError) as err:
        translate_argv(["--roll-config", str(path), *extra])
    return [line[4:] for line in str(err.value).splitlines() if line.startswith("  - ")]


def test_actor_infer_lora_settings_are_accepted_when_they_are_actor_trains(tmp_path):
    path = write_example(tmp_path, LORA_EXAMPLE)
    assert not [p for p in _problems(path) if "lora" in p]  # rank 32, alpha 32, targets o,q,k,v on both
    problems = _problems(path, "actor_infer.model_args.lora_rank=16")
    assert (
        "actor_infer.model_args.lora_rank=16: must equal actor_train.model_args.lora_rank (32): the engine serves "
        "the adapter actor_train trains" in problems
    )


def test_multi_domain_refusals_name_what_roll_does(tmp_path):
    problems = _problems(write_example(tmp_path, MULTI_DOMAIN))
    interleave = next(p for p in problems if p.startswith("actor_train.data_args.domain_interleave_probs."))
    assert "gives 5 domains: ROLL's RLVR pipeline splits every batch into fixed per-domain quotas" in interleave
    workers = {p.split("=", 1)[0]: p for p in problems if ".worker_cls=" in p}
    assert sorted(workers) == [
        "rewards.code_sandbox.worker_cls",
        "rewards.crossthinkqa.worker_cls",
        "rewards.ifeval.worker_cls",
        "rewards.llm_judge.worker_cls",
    ]
    assert "its first capital letter against the ground truth's" in workers["rewards.crossthinkqa.worker_cls"]
    assert "ROLL's IFEval checks" in workers["rewards.ifeval.worker_cls"]
    assert "hybrid has no code sandbox" in workers["rewards.code_sandbox.worker_cls"]
