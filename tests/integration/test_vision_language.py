"""One GRPO step of a vision-language policy (a tiny random Qwen2.5-VL, tests/integration/
vision_helpers.py) through the trainer, in one process, on the Hugging Face engine: prompts
with an `<image>` and an `images` column (parquet image structs, as verl's geometry3k data),
the arithmetic rule reward.

Checked against transformers itself: the old log-probs the actor computed for the rollout's
tokens equal a direct forward of the checkpoint's model given the same images, whose
multimodal positions transformers computes itself (mm_token_type_ids), not with
workers/vision.py; the engine (started with random weights, load_format=dummy) generated
with the actor's weights, vision tower included; the update changed vision and text weights."""

from __future__ import annotations

import io

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config
from tests.integration.vision_helpers import random_image, tiny_qwen25_vl_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory, default_model_dir) -> str:
    return tiny_qwen25_vl_dir(tmp_path_factory, default_model_dir)


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vl_data")
    rows = []
    for i in range(4):
        a, b = i + 1, 2 * i + 1
        size = (16, 24) if i % 2 == 0 else (8, 8)  # 6 image tokens, or 1
        rows.append(
            {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": f"<image>What is {a} + {b}? Reply with only the number."}],
                "images": [{"bytes": _png(random_image(*size, seed=i)), "path": None}],
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
        )
    files = {}
    for split in ("train", "val"):
        files[split] = root / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), files[split])
    return files


@pytest.fixture(scope="module")
def roll_files(tmp_path_factory):
    """ROLL's VLM data (Orsta's columns: data_source, images, prompt, reward_model with the
    detection settings): 2 detection rows (16 x 24 images) and 2 math rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    truth = "<answer>[{'bbox_2d': [0, 0, 1000, 500], 'label': 'cat'}]</answer>"
    parm = {"det_verifier_normalized": True, "det_reward_ratio": {"iou_max_label_first": 1.0, "map": 0.5}}
    rows = []
    for i, source in enumerate(["v3det_train", "mm_math", "object365_train", "mm_math"]):
        detection = source != "mm_math"
        rows.append(
            {
                "data_source": source,
                "prompt": [{"role": "user", "content": "<image>" + ("Find the cat." if detection else "1 + 2?")}],
                "images": [{"bytes": _png(random_image(16, 24, seed=i)), "path": None}],
                "reward_model": {
                    "ground_truth": truth if detection else "\\boxed{3}",
                    "verifier_parm": parm,
                    "format_ratio": 0.1 if detection else 0.0,
                    "accuracy_ratio": 1.0,
                },
            }
        )
    root = tmp_path_factory.mktemp("roll_vl_data")
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    return {"train": root / "train.parquet", "val": root / "train.parquet"}


def _full(module) -> dict[str, torch.Tensor]:
    from workers.weight_sync import iter_full_weights

    return {n: t.clone() for n, t in iter_full_weights(module.state_dict(), torch.float32, 1 << 24, False)}


def _direct_log_probs(model, data, rows, flat_positions: bool = False) -> torch.Tensor:
    """Log-probs of each row's response under `model`, one forward per row with its images
    (`flat_positions`: with 1-D text positions instead of the multimodal ones)."""
    image_token, device = model.config.image_token_id, model.device
    out = torch.zeros(data.batch["responses"].shape)
    for i in rows:
        ids, mask = (data.batch[k][i : i + 1].to(device) for k in ("input_ids", "attention_mask"))
        vision = data.non_tensor_batch["multi_modal_inputs"][i]
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            mm_token_type_ids=(ids == image_token).int(),
            pixel_values=vision["pixel_values"].to(device),
            image_grid_thw=vision["image_grid_thw"].to(device),
            position_ids=data.batch["position_ids"][i : i + 1, 0].to(device) if flat_positions else None,
        ).logits
        response = data.batch["responses"][i].to(device)
        steps = logits[0, -len(response) - 1 : -1].log_softmax(-1)
        out[i] = steps.gather(-1, response.unsqueeze(-1)).squeeze(-1).cpu()
    return out


def _trainer(vl_dir, image_files, out, *extra):
    """A one-step GRPO run of the tiny VLM on the HF engine, built as hybrid.run builds it."""
    from transformers import AutoTokenizer

    from hybrid.multimodal import vision_processor
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer, as_typed
    from reward.loader import load_reward_manager

    cfg = run_config(
        vl_dir,
        image_files,
        out,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.rollout.load_format=dummy",
        "trainer.total_training_steps=1",
        *extra,
    )
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    processor = vision_processor(cfg.actor_rollout_ref.model)
    train_dl, val_dl = build_dataloaders(cfg, tokenizer, processor)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    return PPOTrainer(as_typed(cfg), tokenizer, train_dl, val_dl, reward_fn, reward_fn)


def test_grpo_step_with_images(vl_dir, image_files, tmp_path):
    from transformers import AutoModelForImageTextToText

    from workers.device import current_device

    trainer = _trainer(vl_dir, image_files, tmp_path / "out")
    seen = []
    try:
        trainer.init_workers()
        worker = trainer.actor_rollout_wg.worker
        actor = worker.actor
        compute = actor.compute_log_prob

        def recording(data, *args, **kwargs):
            log_probs, entropy = compute(data, *args, **kwargs)
            seen.append((data, log_probs))
            return log_probs, entropy

        actor.compute_log_prob = recording
        before = _full(worker.actor_module)
        assert any(n.startswith("model.visual.") for n in before)
        trainer.fit()
        after = _full(worker.actor_module)
        engine = dict(worker.rollout.model.named_parameters(remove_duplicate=False))
    finally:
        trainer.shutdown()

    data, actor_log_probs = seen[0]
    assert len(data) == 8 and data.batch["position_ids"].shape[1:] == (4, data.batch["input_ids"].shape[1])
    # On the actor's device (on a GPU, CUDA and CPU kernels part by ~3e-5 on these log-probs).
    reference = AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).to(current_device()).eval()
    with torch.no_grad():
        direct = _direct_log_probs(reference, data, range(len(data)))
    mask = data.batch["response_mask"].bool()
    assert mask.sum() > 8
    torch.testing.assert_close(actor_log_probs[mask], direct[mask], rtol=0, atol=1e-5)
    with torch.no_grad():  # the positions matter to that check: plain text positions give other log-probs
        flat = _direct_log_probs(reference, data, range(len(data)), flat_positions=True)
    assert (flat[mask] - direct[mask]).abs().max() > 1e-4  # ten times the tolerance above
    # The engine (dummy weights at start) holds the updated actor's weights, vision tower included.
    for name, tensor in after.items():
        torch.testing.assert_close(engine[name].detach(), tensor, rtol=0, atol=0, msg=name)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(n.startswith("model.visual.") for n in changed)
    assert any(n.startswith("model.language_model.") for n in changed)


def test_frozen_vision_tower(vl_dir, roll_files, tmp_path, monkeypatch):
    """ROLL's qwen2_5-vl example's actor_train.model_args.freeze_module_prefix=model.visual (hybrid:
    actor.freeze_module_prefix): the vision tower keeps its weights and has no optimizer state,
    the language model trains. With the example's two domains, as the ROLL dialect maps them: rows
    routed by data_source, each detection response scored by DetectionRewardWorker's scorer with
    its row's verifier_parm and ratios and the size of the image the model saw."""
    import functools

    from reward.scorers import roll_detection

    calls = []
    score = roll_detection.compute_score

    @functools.wraps(score)  # keeps the module (its ROW_FIELDS) and the signature DomainScorers reads
    def recording(*args, **kwargs):
        calls.append(kwargs)
        return score(*args, **kwargs)

    monkeypatch.setattr(roll_detection, "compute_score", recording)
    domains = [
        "data.reward_fn_key=domain",
        "data.domain_quotas.cv_detection=0.5",
        "data.domain_quotas.math=0.5",
        "data.domain_tags.cv_detection=[v3det_train,object365_train]",
        "data.domain_tags.math=[mm_math]",
        "data.default_domain=math_rule",
        "data.domain_scorers.cv_detection=roll_detection",
        "data.domain_scorers.math=math",
    ]
    trainer = _trainer(
        vl_dir, roll_files, tmp_path / "out", "actor_rollout_ref.actor.freeze_module_prefix=model.visual", *domains
    )
    try:
        trainer.init_workers()
        worker = trainer.actor_rollout_wg.worker
        before = _full(worker.actor_module)
        trainer.fit()
        after = _full(worker.actor_module)
        optimized = {id(p) for group in worker.actor.optimizer.param_groups for p in group["params"]}
        named = dict(worker.actor_module.named_parameters())
    finally:
        trainer.shutdown()
    visual = [n for n in named if n.startswith("model.visual.")]
    assert visual and not any(id(named[n]) in optimized for n in visual)
    assert len(optimized) == len(named) - len(visual)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert not any(n.startswith("model.visual.") for n in changed)
    assert any(n.startswith("model.language_model.") for n in changed)
    # the 2 detection prompts x 2 samples, each with its row's settings and its 16 x 24 image's size
    assert len(calls) == 4
    for call in calls:
        assert call["images_seen"] == {"model_type": "qwen2_5_vl", "sizes": [[16, 24]]}
        assert call["verifier_parm"]["det_reward_ratio"] == {"iou_max_label_first": 1.0, "map": 0.5}
        assert (call["format_ratio"], call["accuracy_ratio"]) == (0.1, 1.0)
