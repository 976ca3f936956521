"""The rollout engines on a tiny random model, as the worker builds them (model section,
rollout section, tokenizer, HF config): verl's `load_format=dummy_dtensor` starts the real
in-process vLLM engine with random weights that the actor's then replace; `hf` makes an
engine read the model folder; `stop`, `stop_token_ids` and `repetition_penalty` change
what both engines generate; `trust_remote_code` reaches vLLM and lets the HF engine load
a model whose code sits in its folder."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest
import torch

from tests.integration.engine_helpers import engine_config, prompt_batch

pytestmark = pytest.mark.integration

R = "actor_rollout_ref.rollout"
RESPONSE_LENGTH = 24
N = 4
# Crosses token boundaries: a token ending in "s" followed by one starting with a space.
STOP = "s "
# The tiny model's greedy continuation repeats token 198 ("\n") from every prompt.
NEWLINE = 198


def _sections(model_dir, *overrides):
    cfg = engine_config(model_dir, *overrides, n=N, response_length=RESPONSE_LENGTH)
    return cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout


def _responses(out) -> list[list[int]]:
    lengths = out.batch["response_mask"].sum(-1).tolist()
    return [out.batch["responses"][i, : int(n)].tolist() for i, n in enumerate(lengths)]


def _generate(engine, model_dir, tokenizer, *overrides):
    """One call with the rollout section these overrides give: the sampling keys are read
    per call, so one started engine serves every setting."""
    _, engine.config = _sections(model_dir, *overrides)
    return engine.generate_sequences(prompt_batch(tokenizer))


def _hf_log_probs(model, out) -> torch.Tensor:
    """The folder model's log-probs of each sampled response token (teacher forcing)."""
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    prompt_len = out.batch["prompts"].shape[1]
    step_logits = logits[:, prompt_len - 1 : -1].log_softmax(-1)
    return step_logits.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)


def assert_stops_at_the_string(responses, tokenizer, stop: str) -> None:
    """Each response ends with the token that completes the first `stop` in its text, or
    runs to the length limit without one; most stop early."""
    stopped = 0
    for ids in responses:
        text, before_last = tokenizer.decode(ids), tokenizer.decode(ids[:-1])
        if stop in text:
            assert stop not in before_last, f"{text!r} goes on after {stop!r}"
            stopped += 1
        else:
            assert len(ids) == RESPONSE_LENGTH, f"{text!r} ended early without {stop!r}"
    assert stopped >= len(responses) // 2, f"only {stopped} of {len(responses)} responses met {stop!r}"


def assert_repetition_penalty_breaks_greedy_loops(plain, penalised, prompts) -> None:
    # Greedy decoding of the tiny model repeats one prompt token; a strong penalty on seen
    # tokens (prompt and response, as in vLLM) forbids that: every token new, none from the prompt.
    for ids, prompt in zip(plain, prompts):
        assert len(set(ids)) < len(ids) // 2 and set(ids) & prompt, ids
    for ids, prompt in zip(penalised, prompts):
        assert len(set(ids)) == len(ids) and not set(ids) & prompt, ids


def _prompt_sets(out) -> list[set[int]]:
    prompts, mask = out.batch["prompts"], out.batch["attention_mask"][:, : out.batch["prompts"].shape[1]]
    return [set(row[m.bool()].tolist()) for row, m in zip(prompts, mask)]


# ---------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir, tokenizer):
    from transformers import AutoConfig

    from workers.rollout.vllm_rollout import VLLMRollout

    model_section, rollout_section = _sections(
        tiny_model_dir, f"{R}.load_format=dummy_dtensor", "actor_rollout_ref.model.trust_remote_code=true"
    )
    return VLLMRollout(model_section, rollout_section, tokenizer, AutoConfig.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def folder_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_vllm_dummy_dtensor_starts_with_random_weights_and_takes_the_actors(
    vllm_engine, folder_model, tiny_model_dir, tokenizer
):
    engine = vllm_engine.llm.llm_engine
    assert engine.vllm_config.load_config.load_format == "dummy"
    assert engine.model_config.trust_remote_code is True
    before = _generate(vllm_engine, tiny_model_dir, tokenizer)
    mask = before.batch["response_mask"].bool()
    gap_before = (before.batch["rollout_log_probs"] - _hf_log_probs(folder_model, before)).abs()[mask].mean()
    assert gap_before > 0.1, "the dummy engine already samples from the folder's weights"
    vllm_engine.update_weights(list(folder_model.state_dict().items()))
    after = _generate(vllm_engine, tiny_model_dir, tokenizer)
    mask = after.batch["response_mask"].bool()
    gap_after = (after.batch["rollout_log_probs"] - _hf_log_probs(folder_model, after)).abs()[mask].mean()
    assert gap_after < 1e-3, f"mean |engine - folder model| log-prob {gap_after:.2e} after the sync"


def test_vllm_stop_string_ends_responses(vllm_engine, folder_model, tiny_model_dir, tokenizer):
    vllm_engine.update_weights(list(folder_model.state_dict().items()))
    free = _responses(_generate(vllm_engine, tiny_model_dir, tokenizer))
    assert all(len(ids) == RESPONSE_LENGTH for ids in free)  # no EOS from this model: stops are the stop's doing
    stopped = _responses(_generate(vllm_engine, tiny_model_dir, tokenizer, f"{R}.stop=['{STOP}']"))
    assert_stops_at_the_string(stopped, tokenizer, STOP)


def test_vllm_stop_token_ids_end_responses(vllm_engine, folder_model, tiny_model_dir, tokenizer):
    vllm_engine.update_weights(list(folder_model.state_dict().items()))
    out = _generate(vllm_engine, tiny_model_dir, tokenizer, f"{R}.do_sample=false", f"{R}.stop_token_ids=[{NEWLINE}]")
    assert _responses(out) == [[NEWLINE]] * len(out)


def test_vllm_repetition_penalty_changes_greedy_tokens(vllm_engine, folder_model, tiny_model_dir, tokenizer):
    vllm_engine.update_weights(list(folder_model.state_dict().items()))
    plain = _generate(vllm_engine, tiny_model_dir, tokenizer, f"{R}.do_sample=false")
    penalised = _generate(vllm_engine, tiny_model_dir, tokenizer, f"{R}.do_sample=false", f"{R}.repetition_penalty=5.0")
    assert_repetition_penalty_breaks_greedy_loops(_responses(plain), _responses(penalised), _prompt_sets(plain))


def one_sample_each(tokenizer):
    batch = prompt_batch(tokenizer)
    batch.meta_info["n"] = 1  # a call may ask for its own n (verl's meta_info)
    return batch


def assert_greedy_groups(out, single) -> None:
    """Training with do_sample=false: N rows per prompt (the groups keep their size), each the
    prompt's greedy continuation (`single`: the same call with n=1), log-probs included."""
    responses, once = _responses(out), _responses(single)
    assert len(responses) == N * len(once) and out.meta_info["n"] == N
    assert responses == [ids for ids in once for _ in range(N)]
    log_probs = out.batch["rollout_log_probs"]
    torch.testing.assert_close(log_probs, single.batch["rollout_log_probs"].repeat_interleave(N, dim=0))


def test_vllm_greedy_training_gives_n_identical_samples(vllm_engine, folder_model, tiny_model_dir, tokenizer):
    vllm_engine.update_weights(list(folder_model.state_dict().items()))
    out = _generate(vllm_engine, tiny_model_dir, tokenizer, f"{R}.do_sample=false")
    assert_greedy_groups(out, vllm_engine.generate_sequences(one_sample_each(tokenizer)))


# ---------------------------------------------------------------- Hugging Face generate


def _hf_engine(model_dir, tokenizer, *overrides, hf_config=None):
    from transformers import AutoConfig

    from workers.rollout.hf_rollout import HFRollout

    model_section, rollout_section = _sections(model_dir, f"{R}.name=hf", *overrides)
    hf_config = hf_config or AutoConfig.from_pretrained(
        model_dir, trust_remote_code=bool(model_section.trust_remote_code)
    )
    return HFRollout(model_section, rollout_section, tokenizer, hf_config)


def test_hf_load_format_dummy_or_folder(tiny_model_dir, tokenizer, folder_model):
    expected = folder_model.state_dict()
    for load_format in ("hf", "auto", "dtensor"):
        engine = _hf_engine(tiny_model_dir, tokenizer, f"{R}.load_format={load_format}")
        assert all(torch.equal(v, expected[k]) for k, v in engine.model.state_dict().items()), load_format
    for load_format in ("dummy_dtensor", "dummy_hf", "dummy"):
        engine = _hf_engine(tiny_model_dir, tokenizer, f"{R}.load_format={load_format}")
        weight = "model.layers.0.mlp.up_proj.weight"
        assert not torch.equal(engine.model.state_dict()[weight], expected[weight]), load_format
    with pytest.raises(ValueError, match="load_format='megatron'.*FSDP only"):
        _hf_engine(tiny_model_dir, tokenizer, f"{R}.load_format=megatron")


def test_hf_stops_and_repetition_penalty(tiny_model_dir, tokenizer):
    engine = _hf_engine(tiny_model_dir, tokenizer, f"{R}.load_format=hf", f"{R}.stop=['{STOP}']")
    out = engine.generate_sequences(prompt_batch(tokenizer))
    assert_stops_at_the_string(_responses(out), tokenizer, STOP)
    # The log-probs belong to the kept tokens only: padding after a stop is not a response token.
    assert (out.batch["rollout_log_probs"][out.batch["response_mask"] == 0] == 0).all()

    greedy = [f"{R}.load_format=hf", f"{R}.do_sample=false"]
    engine = _hf_engine(tiny_model_dir, tokenizer, *greedy, f"{R}.stop_token_ids=[{NEWLINE}]")
    out = engine.generate_sequences(prompt_batch(tokenizer))
    assert _responses(out) == [[NEWLINE]] * len(out)

    plain = _hf_engine(tiny_model_dir, tokenizer, *greedy).generate_sequences(prompt_batch(tokenizer))
    penalised = _hf_engine(tiny_model_dir, tokenizer, *greedy, f"{R}.repetition_penalty=5.0").generate_sequences(
        prompt_batch(tokenizer)
    )
    assert_repetition_penalty_breaks_greedy_loops(_responses(plain), _responses(penalised), _prompt_sets(plain))


def test_hf_greedy_training_gives_n_identical_samples(tiny_model_dir, tokenizer):
    greedy = [f"{R}.load_format=hf", f"{R}.do_sample=false"]
    engine = _hf_engine(tiny_model_dir, tokenizer, *greedy)
    assert_greedy_groups(
        engine.generate_sequences(prompt_batch(tokenizer)), engine.generate_sequences(one_sample_each(tokenizer))
    )


@pytest.mark.parametrize("key", ["presence_penalty", "frequency_penalty"])
def test_hf_refuses_penalties_generate_lacks_at_start(tiny_model_dir, tokenizer, key):
    from transformers import AutoConfig

    from workers.rollout.hf_rollout import HFRollout

    model_section, rollout_section = _sections(tiny_model_dir, f"{R}.name=hf")
    # The config check refuses this combination too; the engine must not rely on it.
    rollout_section = dataclasses.replace(rollout_section, **{key: 0.5})
    with pytest.raises(ValueError, match=rf"{R}.{key}=0.5: transformers' generate has no equivalent"):
        HFRollout(model_section, rollout_section, tokenizer, AutoConfig.from_pretrained(tiny_model_dir))


REMOTE_CONFIG = """
    from transformers import LlamaConfig

    class TinyRemoteConfig(LlamaConfig):
        model_type = "tiny_remote"
"""
REMOTE_MODEL = """
    from transformers import LlamaForCausalLM

    from .configuration_tiny_remote import TinyRemoteConfig

    class TinyRemoteForCausalLM(LlamaForCausalLM):
        config_class = TinyRemoteConfig
"""


@pytest.fixture(scope="module")
def remote_code_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model as a model whose classes live in its folder (loaded only with trust_remote_code)."""
    import shutil

    out = tmp_path_factory.mktemp("remote_code_model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    (out / "configuration_tiny_remote.py").write_text(textwrap.dedent(REMOTE_CONFIG))
    (out / "modeling_tiny_remote.py").write_text(textwrap.dedent(REMOTE_MODEL))
    config = json.loads((out / "config.json").read_text())
    config.update(
        model_type="tiny_remote",
        architectures=["TinyRemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM",
        },
    )
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def test_hf_engine_trust_remote_code(remote_code_model_dir, tokenizer):
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(remote_code_model_dir, trust_remote_code=True)
    formats = (f"{R}.load_format=hf", f"{R}.load_format=dummy_dtensor")
    # Refusals first: once a trusted load has registered the class, transformers no longer asks.
    for load_format in formats:
        with pytest.raises(ValueError, match="trust_remote_code"):
            _hf_engine(remote_code_model_dir, tokenizer, load_format, hf_config=hf_config)
    for load_format in formats:
        engine = _hf_engine(
            remote_code_model_dir,
            tokenizer,
            load_format,
            "actor_rollout_ref.model.trust_remote_code=true",
            hf_config=hf_config,
        )
        assert type(engine.model).__name__ == "TinyRemoteForCausalLM", load_format
