"""The critic's value head (missing from a causal LM checkpoint) starts from the same draws on
every device and whatever the global generator state: workers/model_loading.init_missing_weights."""

import pytest
import torch

from workers.model_loading import init_missing_weights

pytestmark = pytest.mark.integration


def load_value_model(path, global_seed: int):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(global_seed)  # transformers' own initialisation draws from this
    module, loading = AutoModelForTokenClassification.from_pretrained(
        path, num_labels=1, dtype=torch.float32, output_loading_info=True
    )
    init_missing_weights(module, loading["missing_keys"], module.config, seed=7)
    return module, loading["missing_keys"]


def test_head_is_seeded_draws_whatever_the_global_state(tiny_model_dir):
    first, missing = load_value_model(tiny_model_dir, global_seed=1)
    second, _ = load_value_model(tiny_model_dir, global_seed=2)
    assert {"score.weight"} <= set(missing)
    weight = first.score.weight
    expected = torch.empty(weight.shape).normal_(
        0.0, first.config.initializer_range, generator=torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(weight, expected, rtol=0, atol=0)
    torch.testing.assert_close(second.score.weight, expected, rtol=0, atol=0)
    if first.score.bias is not None:
        assert torch.count_nonzero(first.score.bias) == 0


def test_loaded_and_tied_weights_are_left_alone(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    value_model, _ = load_value_model(tiny_model_dir, global_seed=1)
    torch.testing.assert_close(value_model.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    # A causal LM whose output layer is tied to the embedding: naming the tied weight as
    # missing must not overwrite the embedding.
    tied = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    init_missing_weights(tied, ["lm_head.weight"], tied.config, seed=7)
    torch.testing.assert_close(tied.model.embed_tokens.weight, reference.model.embed_tokens.weight, rtol=0, atol=0)
