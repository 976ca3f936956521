"""rollout.max_model_len_caps_response (what ROLL's vLLM engine does when prompt_length +
response_length exceed its max_model_len: each response stops at max_model_len - its prompt):
the config rules around it, and ROLL's ascend qwen3_8b example (2048 + 8192 over 8000) read with
it. tests/integration/test_roll_examples.py runs an engine so capped."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from tests.integration.roll_helpers import write_example

R = "actor_rollout_ref.rollout"
LENGTHS = ["data.max_prompt_length=2048", "data.max_response_length=8192", f"{R}.max_model_len=8000"]


def test_prompt_and_response_past_max_model_len_need_the_cap():
    with pytest.raises(ConfigError, match=rf"= 10240 exceeds {R}.max_model_len=8000"):
        build_config(LENGTHS)
    assert build_config([*LENGTHS, f"{R}.max_model_len_caps_response=true"]).actor_rollout_ref.rollout.max_model_len
    with pytest.raises(ConfigError, match=rf"needs {R}.name=vllm .*, not 'hf'"):
        build_config([*LENGTHS, f"{R}.max_model_len_caps_response=true", f"{R}.name=hf"])
    with pytest.raises(ConfigError, match=rf"needs {R}.max_model_len above data.max_prompt_length=2048 \(got 2048\)"):
        build_config([*LENGTHS[:2], f"{R}.max_model_len=2048", f"{R}.max_model_len_caps_response=true"])


def test_rolls_ascend_qwen3_8b_example_is_read_with_the_cap(tmp_path):
    path = write_example(tmp_path, "examples/ascend_examples/qwen3_8b_rlvr_fsdp2.yaml")
    out = dict(item.partition("=")[::2] for item in translate_argv(["--roll-config", str(path)]))
    assert (out["data.max_prompt_length"], out["data.max_response_length"]) == ("2048", "8192")
    assert out[f"{R}.max_model_len"] == "8000" and out[f"{R}.max_model_len_caps_response"] == "true"
