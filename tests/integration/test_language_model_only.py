"""`actor_rollout_ref.model.language_model_only` (SkyRL's language_model_only) on a tiny random
Qwen3.5 multimodal checkpoint, through a two-step GAE run with a KL loss in one process (the
Hugging Face engine: vLLM's Qwen3.5 model code imports torchvision, which this CPU machine
lacks): actor, reference and critic hold no vision weight and their language-model weights are
the checkpoint's `model.language_model.*` tensors (read with safetensors, not transformers);
the output layer is the embedding (tied at the checkpoint's top level only); the names sent to
a vLLM engine started on the checkpoint are the checkpoint's own; the exported Hugging Face
folder and the merge tool's folder of a sharded checkpoint load back, whole, as the trained
language model."""

from __future__ import annotations

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config
from tests.integration.multimodal_helpers import build_tiny_qwen35_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_qwen35_dir(tmp_path_factory.mktemp("qwen35"), tokenizer)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=3)


def _checkpoint(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def _full(module) -> dict[str, torch.Tensor]:
    from workers.weight_sync import iter_full_weights

    return {n: t.clone() for n, t in iter_full_weights(module.state_dict(), torch.float32, 1 << 24, False)}


def test_language_model_only_run(qwen35_dir, files, tmp_path, tokenizer):
    from hybrid.run import build_dataloaders
    from hybrid.trainer import PPOTrainer, as_typed
    from reward.loader import load_reward_manager
    from workers.language_model import checkpoint_weight_names, engine_namer

    stored = _checkpoint(qwen35_dir)
    assert any(n.startswith("model.visual.") for n in stored) and "lm_head.weight" not in stored
    cfg = run_config(
        qwen35_dir,
        files,
        tmp_path / "out",
        "actor_rollout_ref.model.language_model_only=true",
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.total_training_steps=2",
    )
    train_dl, val_dl = build_dataloaders(cfg, tokenizer)
    reward_fn = load_reward_manager(cfg, tokenizer, num_examine=0)
    trainer = PPOTrainer(as_typed(cfg), tokenizer, train_dl, val_dl, reward_fn, reward_fn)
    try:
        trainer.init_workers()
        worker = trainer.actor_rollout_wg.worker
        critic = trainer.critic_wg.worker.module
        loaded = {"actor": _full(worker.actor_module), "ref": _full(worker.ref.module), "critic": _full(critic)}
        assert type(worker.hf_config).__name__ == "Qwen3_5TextConfig" and worker.hf_config.tie_word_embeddings
        for role, weights in loaded.items():
            assert not [n for n in weights if "visual" in n], role
            body = {n: t for n, t in weights.items() if n.startswith("model.")}
            assert len(body) == sum(n.startswith("model.language_model.") for n in stored), role
            for name, tensor in body.items():
                torch.testing.assert_close(tensor, stored["model.language_model." + name[6:]], rtol=0, atol=0)
        assert sorted(n for n in loaded["critic"] if not n.startswith("model.")) == ["score.bias", "score.weight"]
        lm_head = dict(worker.actor_module.named_parameters(remove_duplicate=False))["lm_head.weight"]
        assert lm_head is worker.actor_module.model.embed_tokens.weight
        # What update_rollout_weights would send a vLLM engine started on the checkpoint.
        rename = engine_namer(qwen35_dir, False, "actor_rollout_ref.model.language_model_only")
        held = set(checkpoint_weight_names(qwen35_dir))
        # The output layer is tied (not stored); it is sent under its own name as for every tied model.
        sent = {rename(n) for n in loaded["actor"]} - {"lm_head.weight"}
        assert sent == {n for n in held if not n.startswith("model.visual.")}

        trainer.fit()
        assert len(trainer.history) == 2
        trained = _full(worker.actor_module)
        assert not torch.equal(trained["model.norm.weight"], loaded["actor"]["model.norm.weight"])
        worker.checkpointer.export_hf(str(tmp_path / "hf"))
        worker.checkpointer.save(str(tmp_path / "ckpt"), 2, ("model",))
    finally:
        trainer.shutdown()

    from transformers import AutoModelForCausalLM

    from hybrid.model_merge import merge

    merge(str(tmp_path / "ckpt"), str(tmp_path / "merged"))
    for out in (tmp_path / "hf", tmp_path / "merged"):  # the export, and the merge tool's folder
        back, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
        for name, tensor in back.state_dict().items():
            torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0)


def test_refused_in_one_line(tiny_model_dir, qwen35_dir):
    """true on a text-only checkpoint, a multimodal checkpoint without it, and vLLM's switch
    without the policy's: refused before anything loads."""
    from hybrid.config import build_config
    from hybrid.errors import InputError
    from hybrid.preflight import check_inputs

    def problems(*overrides) -> list[str]:
        with pytest.raises(InputError) as err:
            check_inputs(build_config([*overrides]))
        return [p for p in err.value.problems if "language_model_only" in p]

    key = "actor_rollout_ref.model.language_model_only"
    found = problems(f"actor_rollout_ref.model.path={tiny_model_dir}", f"{key}=true", "data.train_files=/x.parquet")
    assert found == [
        (
            f"{key}=true loads the language model of a multimodal checkpoint, and {tiny_model_dir!r} is not one "
            f"(model_type llama, no vision_config); set {key}=false"
        )
    ]
    assert problems(f"actor_rollout_ref.model.path={qwen35_dir}", "data.train_files=/x.parquet") == [
        f"{qwen35_dir!r} is a multimodal checkpoint (model_type qwen3_5, with a vision_config) and hybrid trains on "
        f"text: set {key}=true to load and train its language model alone"
    ]
    engine = "actor_rollout_ref.rollout.engine_kwargs.vllm.language_model_only"
    found = problems(f"actor_rollout_ref.model.path={tiny_model_dir}", f"+{engine}=true", "data.train_files=/x.parquet")
    assert found == [
        f"{engine}=true starts the engine without the vision encoder while {key}=false loads the whole checkpoint; "
        f"set {key}=true as well"
    ]
