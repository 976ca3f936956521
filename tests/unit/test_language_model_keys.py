"""SkyRL's three language_model_only keys as hybrid's (hybrid/dialects/skyrl_language_model.py),
and the name arithmetic of workers/language_model.py on hand-written checkpoint names."""

from __future__ import annotations

import pytest

from tests.unit.dialect_helpers import skyrl, skyrl_error
from workers.language_model import checkpoint_namer, language_model_prefix, language_model_problem

POLICY, REF, ENGINE = (
    "trainer.policy.language_model_only",
    "trainer.ref.language_model_only",
    "generator.inference_engine.language_model_only",
)
MODEL = "actor_rollout_ref.model.language_model_only"
VLLM = "actor_rollout_ref.rollout.engine_kwargs.vllm.language_model_only"


def test_the_three_keys_map_to_the_model_and_vllm():
    out = skyrl(f"{POLICY}=true", f"{REF}=true", f"{ENGINE}=true")
    assert out[MODEL] is True and out[VLLM] is True
    # SkyRL's reference loads the whole multimodal model with false: same text log-probs.
    out = skyrl(f"{POLICY}=true", f"{ENGINE}=true", f"{REF}=false")
    assert out[MODEL] is True and out[VLLM] is True
    assert MODEL not in skyrl(f"{REF}=false")


@pytest.mark.parametrize("key", [REF, ENGINE])
def test_language_model_alone_only_with_the_policy(key):
    assert (
        f"{key}=true: true while {POLICY}=false: hybrid loads the whole checkpoint for every role or the language "
        f"model for every role ({MODEL}); set {POLICY}=true as well"
    ) in skyrl_error(f"{key}=true")
    assert f"{POLICY}=1: {POLICY} takes true or false, not 1" in skyrl_error(f"{POLICY}=1")


LM = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"]


def test_prefix_is_where_the_checkpoint_keeps_the_language_model():
    stored = [
        "model.language_model.embed_tokens.weight",
        "model.language_model.layers.0.mlp.up_proj.weight",
        "model.language_model.norm.weight",
        "model.visual.blocks.0.mlp.up_proj.weight",
    ]
    assert language_model_prefix(LM, "model.", stored) == "model.language_model."
    assert language_model_prefix(LM, "model.", [n.replace("language_model.", "") for n in stored[:3]]) == "model."
    name = checkpoint_namer("model.", "model.language_model.")
    assert [name(n) for n in LM] == stored[:3] + ["lm_head.weight"]
    with pytest.raises(ValueError, match=r"under 0 prefixes \(\[\]\)"):
        language_model_prefix(LM, "model.", stored[1:])  # no embedding stored: not the text model's weights


def test_checkpoint_kind_refusals():
    key = "critic.model.language_model_only"
    assert language_model_problem(key, "'m'", {"model_type": "qwen3_5", "vision_config": {}}, True) is None
    assert language_model_problem(key, "'m'", {"model_type": "llama"}, False) is None
    assert language_model_problem(key, "'m'", {"model_type": "llama"}, True) == (
        f"{key}=true loads the language model of a multimodal checkpoint, and 'm' is not one (model_type llama, "
        f"no vision_config); set {key}=false"
    )
