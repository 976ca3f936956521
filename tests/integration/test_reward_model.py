"""The reward-model worker on a tiny random sequence-classification model: scores equal a
direct Hugging Face forward of the same model, sit on the last response token, and when
the reward model's chat template differs the conversation is re-templated first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integration.engine_helpers import PROMPTS, classifier_dir, engine_config, synthetic_rollout

pytestmark = pytest.mark.integration


def _scores(cfg):
    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.reward_model_worker import RewardModelWorker

    group = LocalWorkerGroup(RewardModelWorker, cfg.reward_model, name="rm")
    group.init_model()
    return group


def _direct(rm_dir, input_ids, attention_mask):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]


def test_scores_match_a_direct_forward_on_the_last_response_token(tiny_model_dir, tokenizer, tmp_path):
    rm_dir = classifier_dir(tmp_path / "rm", tokenizer)
    cfg = engine_config(
        tiny_model_dir,
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=3",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
    )
    batch = synthetic_rollout(tokenizer, n=2)
    rm_scores = _scores(cfg).compute_rm_score(batch).batch["rm_scores"]
    mask = batch.batch["response_mask"]
    last = mask.sum(-1) - 1
    # Exactly one non-zero per row, at the last response token.
    assert torch.equal((rm_scores != 0).sum(-1), torch.ones(len(batch), dtype=torch.long))
    placed = rm_scores[torch.arange(len(batch)), last]
    # The reference: each sample alone, unpadded, through plain transformers.
    expected = []
    for i in range(len(batch)):
        ids = batch.batch["input_ids"][i][batch.batch["attention_mask"][i].bool()]
        expected.append(_direct(rm_dir, ids[None], torch.ones_like(ids)[None])[0])
    assert torch.allclose(placed, torch.stack(expected), atol=1e-5)


def test_a_different_chat_template_is_re_templated(tiny_model_dir, tokenizer, tmp_path):
    template = "{% for m in messages %}<|im_start|>{{ m['role'] | upper }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    rm_dir = classifier_dir(tmp_path / "rm_templated", tokenizer, chat_template=template)
    cfg = engine_config(
        tiny_model_dir,
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
    )
    batch = synthetic_rollout(tokenizer, n=1)
    batch.non_tensor_batch["raw_prompt"] = np.array(
        [[{"role": "user", "content": text}] for text in PROMPTS], dtype=object
    )
    group = _scores(cfg)
    assert group.worker.retemplate
    rm_scores = group.compute_rm_score(batch).batch["rm_scores"].sum(-1)
    for i, text in enumerate(PROMPTS):
        response = tokenizer.decode(
            batch.batch["responses"][i][batch.batch["response_mask"][i].bool()], skip_special_tokens=True
        )
        chat = [{"role": "user", "content": text}, {"role": "assistant", "content": response}]
        text_in = "".join(f"<|im_start|>{m['role'].upper()}: {m['content']}<|im_end|>\n" for m in chat)
        ids = torch.tensor(tokenizer(text_in, add_special_tokens=False)["input_ids"])
        expected = _direct(rm_dir, ids[None], torch.ones_like(ids)[None])[0]
        assert abs(float(rm_scores[i]) - float(expected)) <= 1e-5, i
