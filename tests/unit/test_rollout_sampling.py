"""The rollout section's sampling keys and load_format, read the way verl documents them:
every SamplingParams key lands in vLLM's SamplingParams (built here without an engine),
the hf engine maps what transformers' generate supports and refuses the rest by key name,
greedy and validation calls follow verl's rules, and verl's load_format values mean
"random first weights" or "read the model folder"."""

from __future__ import annotations

import pytest

from hybrid.config import build_config, load_config
from workers.rollout.base import (
    CHECKPOINT_LOAD_FORMATS,
    DUMMY_LOAD_FORMATS,
    SamplingSettings,
    engine_load_format,
    repeat_greedy,
    sampling_settings,
)
from workers.rollout.hf_rollout import hf_generation_config
from workers.rollout.vllm_params import vllm_sampling_params

R = "actor_rollout_ref.rollout"

# Every SamplingParams key of the rollout section, away from its default.
SAMPLING_OVERRIDES = [
    f"{R}.temperature=0.7",
    f"{R}.top_k=20",
    f"{R}.top_p=0.9",
    f"{R}.min_p=0.05",
    f"{R}.repetition_penalty=1.3",
    f"{R}.presence_penalty=0.4",
    f"{R}.frequency_penalty=-0.3",
    f"{R}.stop=['</answer>',STOP]",
    f"{R}.stop_token_ids=[7,11]",
    f"{R}.ignore_eos=true",
    f"{R}.n=3",
    "data.max_response_length=40",
]


def rollout_section(*overrides: str, typed: bool = False):
    """The rollout section as the engines get it: a DictConfig today, a frozen dataclass soon."""
    config = build_config(list(overrides)) if typed else load_config(list(overrides))
    return config.actor_rollout_ref.rollout


@pytest.fixture(params=[False, True], ids=["dictconfig", "frozen"])
def typed(request):
    return request.param


# ---------------------------------------------------------------- load_format


@pytest.mark.parametrize(
    "verl_value,engine_value",
    [
        ("dummy_dtensor", "dummy"),
        ("dummy_hf", "dummy"),
        ("dummy", "dummy"),
        ("dtensor", "auto"),
        ("hf", "auto"),
        ("auto", "auto"),
        ("safetensors", "safetensors"),
    ],
)
def test_load_format_means_what_verl_says(verl_value, engine_value):
    assert engine_load_format(verl_value) == engine_value
    assert verl_value in DUMMY_LOAD_FORMATS + CHECKPOINT_LOAD_FORMATS


@pytest.mark.parametrize("value", ["megatron", "dummy_megatron"])
def test_megatron_load_formats_are_refused_with_the_reason(value):
    with pytest.raises(
        ValueError,
        match=rf"{R}.load_format='{value}' is verl's weight loader for a Megatron actor.*FSDP only.*dummy_dtensor",
    ):
        engine_load_format(value)


def test_unknown_load_format_lists_the_valid_ones():
    with pytest.raises(ValueError, match=rf"{R}.load_format='pt' is not supported; use one of dummy_dtensor, .*auto"):
        engine_load_format("pt")


# ---------------------------------------------------------------- vLLM SamplingParams


def test_every_sampling_key_lands_in_vllm_sampling_params(typed):
    params = vllm_sampling_params(sampling_settings(rollout_section(*SAMPLING_OVERRIDES, typed=typed), {}))
    assert params.n == 3
    assert params.temperature == pytest.approx(0.7)
    assert params.top_k == 20
    assert params.top_p == pytest.approx(0.9)
    assert params.min_p == pytest.approx(0.05)
    assert params.repetition_penalty == pytest.approx(1.3)
    assert params.presence_penalty == pytest.approx(0.4)
    assert params.frequency_penalty == pytest.approx(-0.3)
    assert params.stop == ["</answer>", "STOP"]
    assert set(params.stop_token_ids) == {7, 11}
    assert params.ignore_eos is True
    assert params.max_tokens == 40
    # Stop strings are found in text, so vLLM must detokenize; log-probs of the sampled token.
    assert params.detokenize is True and params.logprobs == 0


def test_defaults_switch_every_extra_filter_off(typed):
    params = vllm_sampling_params(sampling_settings(rollout_section(typed=typed), {}))
    assert (params.min_p, params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == (
        0.0,
        1.0,
        0.0,
        0.0,
    )
    assert not params.stop and not params.stop_token_ids and params.ignore_eos is False
    assert params.detokenize is False  # token ids only: no text is needed


def test_repeat_greedy_gives_each_prompt_n_consecutive_copies():
    ids, log_probs = repeat_greedy([[1, 2], [3]], [[-0.1, -0.2], [-0.3]], 2)
    assert ids == [[1, 2], [1, 2], [3], [3]]
    assert log_probs == [[-0.1, -0.2], [-0.1, -0.2], [-0.3], [-0.3]]
    assert repeat_greedy([[4]], None, 3) == ([[4], [4], [4]], None)


def test_greedy_training_call_keeps_penalties_and_stops(typed):
    cfg = rollout_section(*SAMPLING_OVERRIDES, f"{R}.do_sample=false", typed=typed)
    settings = sampling_settings(cfg, {})
    # n identical greedy samples per prompt in training (verl decodes each of the n copies greedily)
    assert settings.greedy and (settings.n, settings.temperature, settings.top_p, settings.top_k, settings.min_p) == (
        3,
        0.0,
        1.0,
        -1,
        0.0,
    )
    assert sampling_settings(cfg, {"n": 5}).n == 5
    # a greedy call the driver asks for itself (ReMax's baseline) takes one sample per prompt
    sampling = rollout_section(*SAMPLING_OVERRIDES, typed=typed)
    assert sampling_settings(sampling, {"do_sample": False}).n == 1
    assert sampling_settings(sampling, {"do_sample": False}).greedy
    params = vllm_sampling_params(settings)  # one greedy sample: the engine repeats it
    assert params.temperature == 0.0 and params.n == 1
    assert params.repetition_penalty == pytest.approx(1.3) and params.presence_penalty == pytest.approx(0.4)
    assert params.stop == ["</answer>", "STOP"] and set(params.stop_token_ids) == {7, 11}
    # meta_info may ask for sampling (or not) per call, and for n and temperature.
    sampled = sampling_settings(cfg, {"do_sample": True, "n": 2, "temperature": 0.5})
    assert not sampled.greedy and (sampled.n, sampled.temperature, sampled.top_k, sampled.min_p) == (
        2,
        0.5,
        20,
        pytest.approx(0.05),
    )


def test_validation_uses_val_kwargs(typed):
    greedy = sampling_settings(rollout_section(*SAMPLING_OVERRIDES, typed=typed), {"validate": True})
    assert greedy.greedy and (greedy.n, greedy.temperature, greedy.top_k, greedy.top_p, greedy.min_p) == (
        1,
        0.0,
        -1,
        1.0,
        0.0,
    )
    assert greedy.repetition_penalty == pytest.approx(1.3) and greedy.stop == ("</answer>", "STOP")

    cfg = rollout_section(
        *SAMPLING_OVERRIDES,
        f"{R}.val_kwargs.do_sample=true",
        f"{R}.val_kwargs.temperature=0.6",
        f"{R}.val_kwargs.top_k=5",
        f"{R}.val_kwargs.top_p=0.8",
        f"{R}.val_kwargs.n=2",
        typed=typed,
    )
    sampled = sampling_settings(cfg, {"validate": True})
    assert not sampled.greedy
    assert (sampled.n, sampled.temperature, sampled.top_k, sampled.top_p) == (
        2,
        pytest.approx(0.6),
        5,
        pytest.approx(0.8),
    )
    assert sampled.min_p == pytest.approx(0.05)  # not a val_kwargs key: the rollout's
    # A sampling validation at temperature 0 is greedy (verl's rule).
    cold = rollout_section(
        f"{R}.val_kwargs.do_sample=true", f"{R}.val_kwargs.temperature=0", f"{R}.val_kwargs.n=4", typed=typed
    )
    assert sampling_settings(cold, {"validate": True}).n == 1


def test_one_stop_string_may_be_written_without_a_list():
    settings = sampling_settings(rollout_section(f"{R}.stop=END"), {})
    assert settings.stop == ("END",)
    assert vllm_sampling_params(settings).stop == ["END"]


@pytest.mark.parametrize(
    "override,message",
    [
        (f"{R}.stop=['']", rf"{R}.stop=.*must be null or a list of non-empty strings"),
        (f"{R}.stop=[1,2]", rf"{R}.stop=.*must be null or a list of non-empty strings"),
        (f"{R}.stop_token_ids=[a]", rf"{R}.stop_token_ids=.*must be null or a list of token ids"),
        (f"{R}.stop_token_ids=[-1]", rf"{R}.stop_token_ids=.*must be null or a list of token ids"),
        (f"{R}.stop_token_ids=5", rf"{R}.stop_token_ids=5: must be null or a list of token ids"),
    ],
)
def test_bad_stop_values_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        sampling_settings(rollout_section(override), {})


def test_values_vllm_refuses_name_the_section():
    # load_config does not validate; the engine's own check still names where to look.
    with pytest.raises(ValueError, match=rf"{R}: vLLM refuses the sampling settings: .*min_p"):
        vllm_sampling_params(sampling_settings(rollout_section(f"{R}.min_p=1.5"), {}))


# ---------------------------------------------------------------- transformers generate


def test_hf_generation_config_maps_what_generate_supports():
    cfg = rollout_section(
        *[o for o in SAMPLING_OVERRIDES if "presence" not in o and "frequency" not in o and "ignore_eos" not in o]
    )
    gen = hf_generation_config(sampling_settings(cfg, {}), pad_token_id=2, eos_token_ids={2})
    assert gen.do_sample is True and gen.num_return_sequences == 3 and gen.max_new_tokens == 40
    assert (gen.temperature, gen.top_k, gen.top_p, gen.min_p, gen.repetition_penalty) == (0.7, 20, 0.9, 0.05, 1.3)
    assert gen.eos_token_id == [2, 7, 11]  # stop_token_ids end a response like EOS
    assert gen.pad_token_id == 2 and gen.min_new_tokens is None
    # top_k -1 (vLLM's "off") becomes generate's "off" (0), not transformers' default 50.
    off = hf_generation_config(sampling_settings(rollout_section(), {}), 2, {2})
    assert off.top_k == 0 and off.min_p == 0.0 and off.repetition_penalty == 1.0
    greedy = hf_generation_config(sampling_settings(cfg, {"validate": True}), 2, {2})
    assert greedy.do_sample is False and greedy.num_return_sequences == 1 and greedy.repetition_penalty == 1.3
    ignore = hf_generation_config(sampling_settings(rollout_section(f"{R}.ignore_eos=true"), {}), 2, {2})
    assert ignore.min_new_tokens == ignore.max_new_tokens


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
def test_hf_refuses_penalties_generate_does_not_have(key):
    settings = sampling_settings(rollout_section(f"{R}.{key}=0.5"), {})
    with pytest.raises(
        ValueError,
        match=rf"{R}.{key}=0.5: transformers' generate has no equivalent.*set it to 0 or use rollout.name=vllm",
    ):
        hf_generation_config(settings, 2, {2})


def test_hf_refuses_ignore_eos_with_stop_token_ids():
    settings = sampling_settings(rollout_section(f"{R}.ignore_eos=true", f"{R}.stop_token_ids=[7]"), {})
    with pytest.raises(ValueError, match=rf"{R}.ignore_eos=true with stop_token_ids=\[7\]"):
        hf_generation_config(settings, 2, {2})


def test_settings_are_engine_neutral():
    # One object both engines translate; nothing engine-specific lives in it.
    assert {f for f in SamplingSettings.__dataclass_fields__} == {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "greedy",
        "ignore_eos",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "stop_token_ids",
    }
