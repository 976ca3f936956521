"""LoRA on a vision-language policy (a tiny random Qwen2.5-VL, tests/integration/vision_helpers.py):
one GRPO step through the trainer on the Hugging Face engine with peft's all-linear adapters
(SkyRL's run_geometry3k_lora.sh: its default target_modules, no exclude_modules), which adapt the
vision tower's linears too.

Checked against transformers and peft themselves: the actor's old log-probs equal a direct forward
of the checkpoint's base model (fresh adapters compute nothing: B = 0), and so do the reference
policy's after the update (adapters off); the update changed only adapter weights, vision tower's
and language model's (every base weight bit-equal to the checkpoint's); the engine (started with
random weights) holds what peft's merge_and_unload makes of the trained adapters, vision tower
included, and so does the Hugging Face export. And verl's freeze_vision_tower under LoRA freezes
the tower's adapters."""

from __future__ import annotations

import io

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config
from tests.integration.vision_helpers import (
    random_image,
    tiny_qwen25_vl_config,
    tiny_qwen25_vl_dir,
    vision_tokenizer,
)

pytestmark = pytest.mark.integration

# A random tiny model never answers right, so every GRPO advantage would be zero and the adapters
# would not move; this score differs between any two different responses.
TEXT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 97) / 97.0
"""


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory, default_model_dir) -> str:
    return tiny_qwen25_vl_dir(tmp_path_factory, default_model_dir)


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vl_lora_data")
    rows = []
    for i in range(4):
        png = io.BytesIO()
        random_image(*((16, 24) if i % 2 == 0 else (8, 8)), seed=i).save(png, format="PNG")
        rows.append(
            {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": f"<image>What is {i} + 1? Reply with only the number."}],
                "images": [{"bytes": png.getvalue(), "path": None}],
                "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    (root / "reward.py").write_text(TEXT_REWARD)
    return {"train": root / "train.parquet", "val": root / "train.parquet", "reward": root / "reward.py"}


def _full(module) -> dict[str, torch.Tensor]:
    from workers.weight_sync import iter_full_weights

    return {n: t.cpu().clone() for n, t in iter_full_weights(module.state_dict(), torch.float32, 1 << 24, False)}


def _base_log_probs(model, data) -> torch.Tensor:
    """Each row's response log-probs under `model`, one forward per row with its images, the
    multimodal positions computed by transformers (mm_token_type_ids)."""
    out = torch.zeros(data.batch["responses"].shape)
    for i in range(len(data)):
        ids, mask = (data.batch[k][i : i + 1].to(model.device) for k in ("input_ids", "attention_mask"))
        vision = data.non_tensor_batch["multi_modal_inputs"][i]
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            mm_token_type_ids=(ids == model.config.image_token_id).int(),
            pixel_values=vision["pixel_values"].to(model.device),
            image_grid_thw=vision["image_grid_thw"].to(model.device),
        ).logits
        response = data.batch["responses"][i].to(model.device)
        steps = logits[0, -len(response) - 1 : -1].log_softmax(-1)
        out[i] = steps.gather(-1, response.unsqueeze(-1)).squeeze(-1).cpu()
    return out


def test_grpo_step_with_lora(vl_dir, image_files, tmp_path):
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from hybrid.multimodal import vision_processor
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer, as_typed
    from reward.loader import load_reward_manager
    from workers.device import current_device
    from workers.lora import build_lora_config, is_adapter_key

    cfg = run_config(
        vl_dir,
        image_files,
        tmp_path / "out",
        "algorithm.adv_estimator=grpo",
        f"custom_reward_function.path={image_files['reward']}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=all-linear",
        "actor_rollout_ref.actor.use_kl_loss=true",  # the reference policy: the base model, adapters off
        "actor_rollout_ref.rollout.load_format=dummy",
        "trainer.total_training_steps=1",
    )
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer, vision_processor(cfg.actor_rollout_ref.model))
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    trainer = PPOTrainer(as_typed(cfg), tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    seen = []
    try:
        trainer.init_workers()
        worker = trainer.actor_rollout_wg.worker
        compute = worker.actor.compute_log_prob

        def recording(data, *args, **kwargs):
            log_probs, entropy = compute(data, *args, **kwargs)
            seen.append((data, log_probs, args, kwargs))
            return log_probs, entropy

        worker.actor.compute_log_prob = recording
        before = _full(worker.actor_module)
        trainer.fit()
        after = _full(worker.actor_module)
        engine = {n: t.detach().clone() for n, t in worker.rollout.model.named_parameters(remove_duplicate=False)}
        # The reference policy after the update: the trained module with its adapters off.
        ref_log_probs = worker.compute_ref_log_prob(seen[0][0]).batch["ref_log_prob"]
        trained_log_probs, _ = compute(seen[0][0], *seen[0][2], **seen[0][3])
        worker.export_hf_model(str(tmp_path / "hf"))  # trainer.hf_save_freq's export
    finally:
        trainer.shutdown()

    base = AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).eval()
    # peft's all-linear adapts the vision tower (its blocks and merger) as well as the language model.
    adapters = [n for n in after if is_adapter_key(n)]
    assert any(".visual.merger." in n for n in adapters) and any(".visual.blocks." in n for n in adapters)
    # Only adapters changed: every base weight is the checkpoint's, bit for bit.
    checkpoint = base.state_dict()
    for name, tensor in after.items():
        if not is_adapter_key(name):
            key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(tensor, checkpoint[key]), name
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(is_adapter_key(n) for n in changed)
    assert any(".visual." in n and ".lora_B." in n for n in changed)
    assert any(".language_model." in n and ".lora_B." in n for n in changed)
    # The first old log-probs: the base model's (adapters at B = 0), images and positions included.
    data, actor_log_probs = seen[0][:2]
    mask = data.batch["response_mask"].bool()
    with torch.no_grad():
        direct = _base_log_probs(base.to(current_device()), data)
    torch.testing.assert_close(actor_log_probs[mask], direct[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(ref_log_probs[mask], direct[mask], rtol=0, atol=1e-5)
    assert (trained_log_probs[mask] - direct[mask]).abs().max() > 1e-3  # the adapters did train
    # What the sync pushed: peft's own merge of the trained adapters, every weight, vision tower included.
    lora_config = build_lora_config(as_typed(cfg).actor_rollout_ref.model)
    trained = get_peft_model(AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32), lora_config)
    trained.load_state_dict(after, strict=True)
    merged = dict(trained.merge_and_unload().named_parameters(remove_duplicate=False))
    assert set(merged) == set(engine)
    for name, tensor in merged.items():
        torch.testing.assert_close(engine[name].cpu(), tensor.detach(), rtol=0, atol=1e-6, msg=name)
    exported = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(exported) is type(base)
    for name, tensor in exported.named_parameters(remove_duplicate=False):
        torch.testing.assert_close(tensor.detach(), merged[name].detach(), rtol=0, atol=1e-6, msg=name)
    moved = {n for n in merged if not torch.equal(merged[n], checkpoint.get(n, merged[n]))}
    assert any(n.startswith("model.visual.") for n in moved) and any(".language_model." in n for n in moved)


def test_frozen_vision_tower_with_lora(default_model_dir):
    """verl's freeze_vision_tower under LoRA: the tower's adapters (and base weights) do not train,
    the language model's adapters do."""
    from omegaconf import OmegaConf
    from transformers.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    from workers.freeze import freeze
    from workers.lora import apply_lora

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(tiny_qwen25_vl_config(vision_tokenizer(default_model_dir)))
    section = OmegaConf.create(
        {"lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear", "exclude_modules": None}
    )
    section.lora_adapter_path = None
    peft_model = apply_lora(model, section)
    frozen = freeze(peft_model, True, None, is_lora=True)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".language_model." in n and ".lora_" in n for n in trainable)
    visual_adapters = [n for n in frozen if ".visual." in n and ".lora_" in n]
    assert len(visual_adapters) == 2 * 7  # A and B of qkv, proj, gate/up/down_proj, merger.mlp.0 and .2
