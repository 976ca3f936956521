"""Prompt-once packing (workers/shared_prefix.py) on a tiny random GQA Llama: log-probs,
entropy, values and every parameter gradient equal the padded forward (transformers' own
sdpa masks, an independent reference) and the one-row-per-sample packing within 1e-5 in
fp32, for ragged groups of n = 1, 2 and 5, rows of a group scattered through the batch,
and a prompt that is a prefix of another one (a different group)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from workers.actor import DataParallelPPOActor
from workers.config.batching import MicroBatching
from workers.critic import forward_values
from workers.micro_batch import micro_batches, pack_for_responses
from workers.packed_attention import register_packed_attention
from workers.shared_prefix import prompt_groups

pytestmark = pytest.mark.integration

TOL = 1e-5


def ragged_batch(vocab: int, prompt_lens: list[int], group_sizes: list[int], seed: int = 0, order=None) -> dict:
    """Left-padded prompts, right-padded responses of random lengths (some empty), one
    group of `group_sizes[g]` rows per prompt; rows permuted by `order`."""
    gen = torch.Generator().manual_seed(seed)
    prompt_width, response_len = max(prompt_lens) + 1, 9
    prompts = [torch.randint(3, vocab, (n,), generator=gen) for n in prompt_lens]
    prompts[-1] = prompts[0][: prompt_lens[-1]] if prompt_lens[-1] <= prompt_lens[0] else prompts[-1]
    rows = []
    for prompt, size in zip(prompts, group_sizes):
        for _ in range(size):
            length = int(torch.randint(0, response_len + 1, (1,), generator=gen))
            ids = torch.zeros(prompt_width + response_len, dtype=torch.long)
            mask = torch.zeros_like(ids)
            ids[prompt_width - len(prompt) : prompt_width] = prompt
            mask[prompt_width - len(prompt) : prompt_width + length] = 1
            ids[prompt_width : prompt_width + length] = torch.randint(3, vocab, (length,), generator=gen)
            rows.append((ids, mask))
    order = order or list(range(len(rows)))
    input_ids = torch.stack([rows[i][0] for i in order])
    attention_mask = torch.stack([rows[i][1] for i in order])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, prompt_width:]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": attention_mask[:, prompt_width:],
    }


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    # groups of 5, 1, 2 and 2 rows; the last prompt is a prefix of the first (its own group)
    sizes = [5, 1, 2, 2]
    order = [0, 5, 1, 6, 2, 8, 3, 7, 4, 9]  # group members scattered, as after balance_batch
    return ragged_batch(vocab, [7, 3, 11, 4], sizes, seed=3, order=order)


def _model(path, cls_name="AutoModelForCausalLM", **extra):
    import transformers

    torch.manual_seed(0)
    cls = getattr(transformers, cls_name)
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation=register_packed_attention(), **extra)


def _actor_pass(model, micro: dict, use_remove_padding: bool, share: bool, chunk: bool = False):
    model.zero_grad(set_to_none=True)
    actor = DataParallelPPOActor(model, use_remove_padding, share_prompts=share, chunk_logits=chunk)
    log_probs, entropy = actor.forward_micro(micro, temperature=0.7, calculate_entropy=True)
    weights = torch.linspace(-1, 1, log_probs.numel()).view_as(log_probs)
    mask = micro["response_mask"].float()
    ((log_probs * weights * mask).sum() + (entropy * mask).sum() * 0.1).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return log_probs.detach() * mask, entropy.detach() * mask, grads


def test_groups_are_found_by_prompt_tokens(batch):
    groups = prompt_groups(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1]
    )
    assert groups == [[0, 2, 4, 6, 8], [1], [3, 7], [5, 9]]


def test_packed_row_holds_each_prompt_once(batch):
    ids, pos, kwargs, source = pack_for_responses(batch, share_prompts=True)
    layout = kwargs["shared_prefix"]
    assert [p for _, p in layout.prompts] == [7, 3, 11, 4]
    response_lens = batch["response_mask"].sum(-1)
    assert ids.shape[1] == 7 + 3 + 11 + 4 + int(response_lens.sum())
    # every response continues the positions of its own prompt
    for (_p0, p_len), spans in zip(layout.prompts, layout.responses):
        for r0, r_len in spans:
            assert pos[0, r0 : r0 + r_len].tolist() == list(range(p_len, p_len + r_len))
    # the first response token of every row of a group is predicted from the shared last prompt token
    assert source[0, 0] == source[2, 0] == source[8, 0] == 6


def test_log_probs_entropy_and_gradients_equal_unshared(tiny_model_dir, batch):
    model = _model(tiny_model_dir)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA
    padded = _actor_pass(model, batch, use_remove_padding=False, share=False)
    packed = _actor_pass(model, batch, use_remove_padding=True, share=False)
    shared = _actor_pass(model, batch, use_remove_padding=True, share=True)
    shared_unpadded = _actor_pass(model, batch, use_remove_padding=False, share=True)  # verl's combination
    for reference in (padded, packed):
        for got in (shared, shared_unpadded):
            assert (got[0] - reference[0]).abs().max() <= TOL
            assert (got[1] - reference[1]).abs().max() <= TOL
            for name, grad in reference[2].items():
                assert (got[2][name] - grad).abs().max() <= TOL, name
    assert padded[0].abs().sum() > 0 and any(g.abs().sum() > 0 for g in shared[2].values())


@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("tied", [True, False])
def test_fused_head_equals_full_logits(tiny_model_dir, tmp_path, tokenizer, batch, layout, tied):
    """The chunked output layer (workers/response_head.py) in every layout, with the output
    layer tied to the embeddings (SmolLM2) and not: log-probs, entropy, all gradients."""
    from tests.conftest import build_tiny_model_dir

    path = tiny_model_dir if tied else build_tiny_model_dir(tmp_path / "untied", tokenizer, tie_word_embeddings=False)
    model = _model(path)
    flags = {"padded": (False, False), "packed": (True, False), "shared": (True, True)}[layout]
    full = _actor_pass(model, batch, *flags)
    fused = _actor_pass(model, batch, *flags, chunk=True)
    assert (fused[0] - full[0]).abs().max() <= TOL and (fused[1] - full[1]).abs().max() <= TOL
    for name, grad in full[2].items():
        assert (fused[2][name] - grad).abs().max() <= TOL, name
    assert model.get_output_embeddings().forward.__func__ is type(model.get_output_embeddings()).forward  # restored


def test_values_equal_unshared(tiny_model_dir, batch):
    critic = _model(tiny_model_dir, "AutoModelForTokenClassification", num_labels=1)
    response_len = batch["responses"].shape[1]
    mask = batch["response_mask"].float()
    padded = forward_values(critic, batch, response_len, use_remove_padding=False) * mask
    shared = forward_values(critic, batch, response_len, use_remove_padding=True, share_prompts=True) * mask
    assert padded.abs().sum() > 0
    assert (shared - padded).abs().max() <= TOL


def test_attention_runs_two_batched_calls_per_layer(tiny_model_dir, batch, monkeypatch):
    """Prompts once each (padded to the longest, 11), then every non-empty response with its
    prompt's keys in front; never over the whole packed row."""
    model = _model(tiny_model_dir)
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, *args, **kwargs):
        seen.append((q.shape[0], q.shape[2], k.shape[2]))
        return real_sdpa(q, k, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        DataParallelPPOActor(model, True, share_prompts=True).forward_micro(batch, 1.0, calculate_entropy=False)
    lens = batch["response_mask"].sum(-1).tolist()
    responses, longest = sum(1 for n in lens if n), max(lens)
    assert seen == [(4, 11, 11), (responses, longest, 11 + longest)] * model.config.num_hidden_layers


@pytest.mark.parametrize("use_dynamic_bsz", [False, True])
def test_micro_batches_keep_groups_whole(batch, use_dynamic_bsz):
    batching = MicroBatching(4, use_dynamic_bsz, 40, share_prompts=True)
    micro = micro_batches(batch, batching, world_size=1)
    assert sorted(r for m in micro for r in m) == list(range(10))
    groups = [[0, 2, 4, 6, 8], [1], [3, 7], [5, 9]]
    for group in groups[1:]:  # the 5-row group exceeds 4 rows: it alone may be cut
        assert sum(set(group) <= set(m) for m in micro) == 1, (group, micro)
    if not use_dynamic_bsz:
        assert micro == [[0, 2, 4, 6], [8, 1, 3, 7], [5, 9]]


def _update(model, batch: dict, share: bool, *overrides: str):
    """One `update_policy` (SGD, lr 1000 so the tiny model's small gradients move it, micro-batches
    of 4 rows or 40 tokens): metrics and the parameters after it."""
    from hybrid.config import build_config
    from protocol.data_proto import DataProto

    cfg = build_config(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            "actor_rollout_ref.actor.use_kl_loss=true",
            *overrides,
        ]
    ).actor_rollout_ref.actor
    # A token budget below what validation allows (more micro-batches); the derived fields the
    # driver fills: old log-probs given, one rank, 5 rows per optimizer step.
    cfg = dataclasses.replace(
        cfg,
        ppo_max_token_len_per_gpu=40,
        on_policy_update=False,
        rollout_n=1,
        data_parallel_size=1,
        ppo_mini_batch_size=5,
    )
    gen = torch.Generator().manual_seed(5)
    rows, response_len = batch["responses"].shape
    tensors = {
        **batch,
        "advantages": torch.randn(rows, response_len, generator=gen),
        "old_log_probs": -torch.rand(rows, response_len, generator=gen),
        "ref_log_prob": -torch.rand(rows, response_len, generator=gen),
    }
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1000.0)
    actor = DataParallelPPOActor(model, True, cfg, optimizer, share_prompts=share)
    metrics = actor.update_policy(DataProto.from_dict(tensors=tensors), temperature=0.7)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return metrics, after, start


@pytest.mark.parametrize("dynamic", ["false", "true"])
def test_policy_update_equals_unshared(tiny_model_dir, batch, dynamic):
    """Two mini-batches of 5 rows (groups cut by the mini-batch: still exact), micro-batches
    by count or by token budget: the same metrics and the same weights after the steps."""
    model = _model(tiny_model_dir)
    key = f"actor_rollout_ref.actor.use_dynamic_bsz={dynamic}"
    plain, plain_after, start = _update(model, batch, False, key)
    shared, shared_after, _ = _update(model, batch, True, key)
    assert plain.keys() == shared.keys()
    for name in plain:
        assert abs(plain[name] - shared[name]) <= TOL * max(1.0, abs(plain[name])), name
    moved = 0.0
    for name, value in plain_after.items():
        assert (shared_after[name] - value).abs().max() <= TOL, name
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-2  # the steps really changed the weights


def test_lora_log_probs_and_adapter_gradients_equal_unshared(tiny_model_dir, batch):
    from types import SimpleNamespace

    from workers.lora import apply_lora

    lora = SimpleNamespace(
        lora_rank=4, lora_alpha=8, target_modules="all-linear", exclude_modules=None, lora_adapter_path=None
    )
    model = apply_lora(_model(tiny_model_dir), lora)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: make the adapters matter
            torch.nn.init.normal_(param, std=0.1)
    packed = _actor_pass(model, batch, use_remove_padding=True, share=False)
    shared = _actor_pass(model, batch, use_remove_padding=True, share=True)
    assert (shared[0] - packed[0]).abs().max() <= TOL
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    for name in trained:
        assert (shared[2][name] - packed[2][name]).abs().max() <= TOL, name


def text_batch(tokenizer) -> dict:
    """Chat prompts and plain-text responses (groups of 5, 1, 2, 2), rows scattered."""
    groups = {
        "What is 17 + 25? Answer with a number.": [
            "17 + 25 = 42. The answer is 42.",
            "The answer is 42",
            "42",
            "It is 41.",
            "Sure! 42.",
        ],
        "Compute 3 * 4.": ["12"],
        "Tell me a short story about a cat who learns to count.": ["Once upon a time, a cat", "A cat named Tom sat by"],
        "What is 9 - 2?": ["7", "9 minus 2 is 7."],
    }
    rows = []
    for prompt, responses in groups.items():
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(text)["input_ids"]
        rows += [(prompt_ids, tokenizer(r)["input_ids"] + [tokenizer.eos_token_id]) for r in responses]
    width, response_len = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
    input_ids = torch.zeros(len(rows), width + response_len, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, k in enumerate([0, 5, 1, 6, 2, 8, 3, 7, 4, 9]):
        prompt_ids, response_ids = rows[k]
        input_ids[i, width - len(prompt_ids) : width] = torch.tensor(prompt_ids)
        input_ids[i, width : width + len(response_ids)] = torch.tensor(response_ids)
        mask[i, width - len(prompt_ids) : width + len(response_ids)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, width:],
        "response_mask": mask[:, width:],
    }


@pytest.mark.slow
def test_real_model_log_probs_and_gradients_equal_unshared(default_model_dir, tokenizer):
    """SmolLM2-135M (30 layers, 9 query / 3 key-value heads) in fp64, where the comparison
    measures the algebra, not the kernels' rounding (in fp32 even padded and packed rows of
    this model differ by 3e-5 in log-probs of -40 and 4e-4 in gradients up to 110). Llama's
    RMSNorm computes in fp32 whatever the model's dtype, and a shared prompt sums its n
    gradients before that norm's backward instead of after, so gradients agree to fp32's
    relative precision (measured 2e-7 of the largest), log-probs and entropy to fp64's."""
    batch = text_batch(tokenizer)
    model = _model(default_model_dir).double()
    packed = _actor_pass(model, batch, use_remove_padding=True, share=False)
    shared = _actor_pass(model, batch, use_remove_padding=True, share=True)
    assert (shared[0] - packed[0]).abs().max() <= 1e-9 and (shared[1] - packed[1]).abs().max() <= 1e-9
    largest = max(float(g.abs().max()) for g in packed[2].values())
    assert packed[0].min() < -1 and largest > 1
    assert max(float((shared[2][n] - g).abs().max()) for n, g in packed[2].items()) <= 1e-6 * largest
