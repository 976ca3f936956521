"""Checkpoint and resume on a tiny random model, one in-process rank on CPU:

- resume is exact: a 4-step GAE run (critic, adaptive KL in the reward) saving at steps 2
  and 4, and a second run resumed from the first run's step-2 checkpoint, give the same
  step 3 and 4 metrics (within 1e-6) and bit-identical step-4 model, optimizer and
  scheduler state for actor and critic;
- resume_mode=auto with no checkpoint starts at step 1; resume_path naming a missing or a
  partial (temporary) folder fails naming the path; validation reports it before any
  model loads;
- retention keeps the newest max_actor_ckpt_to_keep checkpoints;
- the step-4 checkpoint merges into a Hugging Face folder whose logits equal the trained
  actor's (through the command and through trainer.merge_on_finish), `model_merger test`
  agrees with it tensor by tensor, and vLLM loads it.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.integration.checkpoint_helpers import assert_metrics_close, probe_batch, run_config, train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


# GAE with a critic and the adaptive KL-in-reward controller: the resumed run must also
# restore the critic's shards and the KL coefficient (data.pt) to match.
GAE = [
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.horizon=10",
    "critic.optim.lr=1e-3",
    "critic.model.fsdp_config.mixed_precision=fp32",
    "trainer.save_freq=2",
    "trainer.merge_on_finish=true",
    "trainer.hf_save_freq=3",  # Hugging Face exports at 3 (no checkpoint there) and at the last step, 4
]


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, arithmetic_files, tokenizer, tmp_path_factory):
    """Four steps, saving at 2 and 4 (resume_mode=auto on an empty folder: a fresh start)."""
    root = tmp_path_factory.mktemp("full_run")
    cfg = run_config(tiny_model_dir, arithmetic_files, root, *GAE)
    out = train(cfg, probe_ids=probe_batch(tokenizer))
    out["root"] = root
    return out


def _read_shard(path):
    from safetensors.torch import load_file

    return load_file(path)


def test_auto_resume_without_checkpoint_starts_fresh(full_run):
    steps = [h["step"] for h in full_run["history"]]
    assert steps == [1, 2, 3, 4]
    root = full_run["root"]
    assert sorted(n for n in os.listdir(root) if n.startswith("global_step")) == ["global_step_2", "global_step_4"]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"
    actor = root / "global_step_4" / "actor"
    for name in (
        "model_world_size_1_rank_0.safetensors",
        "optim_world_size_1_rank_0.pt",
        "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json",
        "huggingface/config.json",
        "huggingface/generation_config.json",
        "huggingface/tokenizer_config.json",
    ):
        assert (actor / name).is_file(), name
    critic = root / "global_step_4" / "critic"
    assert (critic / "model_world_size_1_rank_0.safetensors").is_file()
    assert '"LlamaForTokenClassification"' in (critic / "huggingface" / "config.json").read_text()
    assert all("timing_s/save_checkpoint" in h for h in full_run["history"] if h["step"] in (2, 4))


def test_resume_is_exact(full_run, tiny_model_dir, arithmetic_files, tmp_path):
    first = full_run["root"]
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        *GAE,
        "trainer.merge_on_finish=false",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={first / 'global_step_2'}",
    )
    resumed = train(cfg)
    assert [h["step"] for h in resumed["history"]] == [3, 4]
    for a, b in zip(full_run["history"][2:], resumed["history"]):
        assert_metrics_close(a, b)
    assert full_run["history"][2]["actor/reward_kl_penalty_coeff"] != 0.001  # adapted, and restored
    # Identical weights, optimizer moments and schedule after step 4, for actor and critic.
    for role in ("actor", "critic"):
        a_dir, b_dir = first / "global_step_4" / role, tmp_path / "global_step_4" / role
        a_model, b_model = (
            _read_shard(a_dir / "model_world_size_1_rank_0.safetensors"),
            _read_shard(b_dir / "model_world_size_1_rank_0.safetensors"),
        )
        assert a_model.keys() == b_model.keys()
        for key in a_model:
            assert torch.equal(a_model[key], b_model[key]), (role, key)
        a_opt = torch.load(a_dir / "optim_world_size_1_rank_0.pt", weights_only=True)
        b_opt = torch.load(b_dir / "optim_world_size_1_rank_0.pt", weights_only=True)
        assert a_opt["state"].keys() == b_opt["state"].keys() and a_opt["state"]
        for index, state in a_opt["state"].items():
            for key, value in state.items():
                assert torch.equal(value, b_opt["state"][index][key]), (role, index, key)
        a_extra = torch.load(a_dir / "extra_state_world_size_1_rank_0.pt", weights_only=True)
        b_extra = torch.load(b_dir / "extra_state_world_size_1_rank_0.pt", weights_only=True)
        assert a_extra["lr_scheduler"] == b_extra["lr_scheduler"]
        assert a_extra["worker"] == b_extra["worker"]
    a_data = torch.load(first / "global_step_4" / "data.pt", weights_only=True)
    b_data = torch.load(tmp_path / "global_step_4" / "data.pt", weights_only=True)
    assert a_data.keys() == {"global_step", "dataloader", "kl_coef", "rng", "stream"}
    assert _same(a_data, b_data)


def _same(a, b) -> bool:
    """Equal nested dicts, lists and tuples of plain values and tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_resume_path_missing_or_partial_fails_with_the_path(full_run, tiny_model_dir, arithmetic_files, tmp_path):
    from hybrid.checkpoint_folders import CheckpointError, resume_checkpoint
    from hybrid.config import ConfigError

    missing = tmp_path / "global_step_9"
    partial = tmp_path / "global_step_2.partial"
    shutil.copytree(full_run["root"] / "global_step_2", partial)
    incomplete = tmp_path / "global_step_3"
    shutil.copytree(full_run["root"] / "global_step_2", incomplete)
    (incomplete / "data.pt").unlink()
    for path, words in (
        (missing, "does not exist"),
        (partial, "partial checkpoint"),
        (incomplete, "data.pt is missing"),
    ):
        overrides = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}")
        # Validation reports it before any model loads ...
        with pytest.raises(ConfigError) as err:
            run_config(tiny_model_dir, arithmetic_files, tmp_path, *overrides)
        assert str(path) in str(err.value) and words in str(err.value)
        # ... and the trainer's own resolution says the same if the folder changed since.
        from hybrid.config import load_config

        cfg = load_config([f"trainer.default_local_dir={tmp_path}", *overrides])
        with pytest.raises(CheckpointError) as err:
            resume_checkpoint(cfg, need_critic=False)
        assert str(path) in str(err.value) and words in str(err.value)


def test_auto_picks_latest_complete_and_ignores_partial(full_run, tmp_path):
    from hybrid.checkpoint_folders import latest_checkpoint, remove_partial_checkpoints

    shutil.copytree(full_run["root"] / "global_step_2", tmp_path / "global_step_2")
    shutil.copytree(full_run["root"] / "global_step_4", tmp_path / "global_step_6.partial")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    assert remove_partial_checkpoints(str(tmp_path)) == [str(tmp_path / "global_step_6.partial")]
    assert not (tmp_path / "global_step_6.partial").exists()


def test_retention_keeps_newest(full_run, tmp_path):
    from hybrid.checkpoint_folders import apply_retention

    for step in (2, 4):
        shutil.copytree(full_run["root"] / f"global_step_{step}", tmp_path / f"global_step_{step}")
    shutil.copytree(full_run["root"] / "global_step_4", tmp_path / "global_step_6")
    removed = apply_retention(str(tmp_path), 4, {"actor": 1, "critic": None})
    assert removed == [str(tmp_path / "global_step_2" / "actor")]
    # Not resumable any more (no actor), but its critic is kept as asked.
    assert (tmp_path / "global_step_2" / "critic").is_dir()
    removed = apply_retention(str(tmp_path), 4, {"actor": 1, "critic": 1})
    assert removed == [str(tmp_path / "global_step_2" / "critic"), str(tmp_path / "global_step_2")]
    # A higher step from an abandoned run is not counted (it is replaced when reached).
    assert (tmp_path / "global_step_4").is_dir() and (tmp_path / "global_step_6").is_dir()


def test_merged_folder_matches_trained_actor(full_run, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    from scripts.model_merger import main as merger_main

    actor = full_run["root"] / "global_step_4" / "actor"
    target = tmp_path / "hf"
    # A small shard limit makes the merger write several safetensors shards and an index.
    merger_main(
        [
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(actor),
            "--target_dir",
            str(target),
            "--max_shard_size",
            "1MB",
        ]
    )
    assert (target / "model.safetensors.index.json").is_file()
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert (target / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=probe_batch(tokenizer), use_cache=False).logits
    assert (logits - full_run["logits"]).abs().max().item() <= 1e-5
    # `test` agrees with itself, and catches a different model.
    assert merger_main(["test", "--backend", "fsdp", "--local_dir", str(actor), "--test_hf_dir", str(target)]) == 0
    base = actor.parent.parent / "global_step_2" / "actor"
    assert merger_main(["test", "--backend", "fsdp", "--local_dir", str(base), "--test_hf_dir", str(target)]) == 1


def test_merge_on_finish_fills_the_final_huggingface_folder(full_run, tokenizer):
    """trainer.merge_on_finish runs the merger into the last checkpoint's own huggingface/
    (where verl users point --target_dir), beside the config and tokenizer kept there."""
    from transformers import AutoModelForCausalLM

    final = full_run["root"] / "global_step_4" / "actor" / "huggingface"
    assert (final / "model.safetensors").is_file()
    assert not (full_run["root"] / "global_step_2" / "actor" / "huggingface" / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=probe_batch(tokenizer), use_cache=False).logits
    assert (logits - full_run["logits"]).abs().max().item() <= 1e-5


def test_hf_exports_follow_their_own_cadence(full_run, tokenizer):
    """trainer.hf_save_freq=3 (SkyRL's hf_save_interval): the actor alone as a Hugging Face
    folder at step 3, where no checkpoint is saved, and at the last step; the last one is the
    trained actor."""
    from transformers import AutoModelForCausalLM

    exports = full_run["root"] / "hf_exports"
    assert sorted(p.name for p in exports.iterdir()) == ["global_step_3", "global_step_4"]
    assert not (full_run["root"] / "global_step_3").exists()  # an export is not a checkpoint
    logits = {}
    for step in (3, 4):
        model = AutoModelForCausalLM.from_pretrained(exports / f"global_step_{step}", dtype=torch.float32)
        with torch.no_grad():
            logits[step] = model(input_ids=probe_batch(tokenizer), use_cache=False).logits
    assert (logits[4] - full_run["logits"]).abs().max().item() <= 1e-5
    assert (logits[3] - full_run["logits"]).abs().max().item() > 1e-4  # step 4 trained on


@pytest.mark.slow
def test_vllm_loads_merged_folder(full_run, tmp_path, tokenizer):
    from scripts.model_merger import main as merger_main
    from tests.integration.checkpoint_helpers import vllm_greedy_vs_hf

    target = tmp_path / "hf"
    merger_main(
        [
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(full_run["root"] / "global_step_4" / "actor"),
            "--target_dir",
            str(target),
        ]
    )
    prompts = [tokenizer.encode("What is 2 + 3?"), tokenizer.encode("Name a colour.")]
    tokens, worst = vllm_greedy_vs_hf(str(target), prompts)
    assert all(len(t) == 8 for t in tokens)
    assert worst <= 1e-3, worst
