"""LoRA end to end on a tiny random model, one in-process rank with the real vLLM engine:
a GRPO run with a KL loss trains only the adapters, the engine samples from the merged
weights (its log-probs equal the actor's, and differ from the base model's once the
adapters have trained), the reference policy is the base model (adapters disabled), and
the saved checkpoint merges into a Hugging Face folder (and a peft adapter folder) whose
logits equal the trained actor's; vLLM loads the merged folder and agrees with transformers.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration.checkpoint_helpers import (
    probe_batch,
    response_log_probs,
    run_config,
    train,
    vllm_greedy_vs_hf,
)
from tests.integration.engine_helpers import prompt_batch, synthetic_rollout

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE_TOL = 1e-3  # fp32 engine vs fp32 actor, as in test_hybrid_engine

# A random tiny model never answers the arithmetic right, so every GRPO advantage would be
# zero and only numerical noise could move the adapters. This score differs between any
# two different responses, so each group has a real advantage signal.
TEXT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 97) / 97.0
"""


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=32, n_val=8, seed=3)


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, arithmetic_files, tokenizer, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora_run")
    reward_file = root / "text_reward.py"
    reward_file.write_text(TEXT_REWARD)
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        root,
        f"custom_reward_function.path={reward_file}",
        # one optimizer step per training step: step 1's KL is measured before any update
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.max_num_batched_tokens=512",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.exclude_modules=[down_proj]",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    def inspect(trainer):
        wg = trainer.actor_rollout_wg
        worker = wg.worker
        batch = synthetic_rollout(tokenizer)
        ref = wg.compute_ref_log_prob(batch).batch["ref_log_prob"]
        actor = wg.compute_log_prob(batch).batch["old_log_probs"]
        # One more generation: the trainer synced step 2's update (merged) into the engine after it.
        gen = wg.generate_sequences(prompt_batch(tokenizer))
        engine = gen.batch["rollout_log_probs"]
        mask = gen.batch["response_mask"].bool()
        actor_on_gen = wg.compute_log_prob(gen).batch["old_log_probs"]
        base_on_gen = response_log_probs(base, gen)
        trainable = sorted(n for n, p in worker.actor_module.named_parameters() if p.requires_grad)
        return {
            "ref_vs_base": (ref - response_log_probs(base, batch))
            .abs()[batch.batch["response_mask"].bool()]
            .max()
            .item(),
            "actor_vs_ref": (actor - ref).abs()[batch.batch["response_mask"].bool()].mean().item(),
            "engine_vs_actor": (engine - actor_on_gen).abs()[mask].mean().item(),
            "engine_vs_base": (engine - base_on_gen).abs()[mask].mean().item(),
            "trainable": trainable,
            "has_ref_copy": worker.ref.module is not worker.actor_module,
        }

    out = train(cfg, probe_ids=probe_batch(tokenizer), inspect=inspect)
    out["root"] = root
    return out


def test_lora_grpo_trains_adapters_and_syncs_merged_weights(lora_run):
    history = lora_run["history"]
    assert [h["step"] for h in history] == [1, 2]
    for metrics in history:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(metrics[key]), key
        assert metrics["critic/advantages/max"] > 0 and metrics["actor/grad_norm"] > 1e-4  # a real signal
        # The engine's log-probs of its own samples equal the actor's: the sync sent B @ A.
        assert metrics["rollout/logp_abs_diff_mean"] <= ENGINE_TOL, metrics["rollout/logp_abs_diff_mean"]
    # Only adapters train, and the reference policy is the same module, adapters disabled.
    assert lora_run["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in lora_run["trainable"])
    assert not any("down_proj" in n for n in lora_run["trainable"])  # exclude_modules
    assert not lora_run["has_ref_copy"]
    assert lora_run["ref_vs_base"] <= 1e-5
    assert lora_run["actor_vs_ref"] > 1e-3, "the adapters did not change the policy"
    assert history[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # B starts at zero
    assert lora_run["engine_vs_actor"] <= ENGINE_TOL
    assert lora_run["engine_vs_base"] > 10 * ENGINE_TOL, "the engine holds the base weights, not the merged ones"


def test_lora_checkpoint_merges(lora_run, tmp_path, tokenizer, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from scripts.model_merger import main as merger_main

    actor = lora_run["root"] / "global_step_2" / "actor"
    merged = tmp_path / "merged"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(merged)]) == 0
    probe = probe_batch(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    assert not any("lora" in n for n, _ in model.named_parameters())
    with torch.no_grad():
        logits = model(input_ids=probe, use_cache=False).logits
    assert (logits - lora_run["logits"]).abs().max().item() <= 1e-5
    # The hf_model content, written by the worker at save time, holds the same merged weights.
    assert (
        merger_main(
            [
                "test",
                "--backend",
                "fsdp",
                "--local_dir",
                str(merged),
                "--test_hf_dir",
                str(actor / "huggingface"),
                "--atol",
                "0",
            ]
        )
        == 0
    )

    adapter = tmp_path / "adapter"
    merger_main(
        ["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(adapter), "--save_lora_adapter"]
    )
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), adapter
    )
    with torch.no_grad():
        peft_logits = peft_model(input_ids=probe, use_cache=False).logits
    assert (peft_logits - lora_run["logits"]).abs().max().item() <= 1e-5


def test_vllm_loads_merged_lora_folder(lora_run, tmp_path, tokenizer):
    from scripts.model_merger import main as merger_main

    merged = tmp_path / "merged"
    merger_main(
        [
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(lora_run["root"] / "global_step_2" / "actor"),
            "--target_dir",
            str(merged),
        ]
    )
    prompts = [tokenizer.encode("What is 2 + 3?"), tokenizer.encode("Name a colour.")]
    tokens, worst = vllm_greedy_vs_hf(str(merged), prompts)
    assert all(len(t) == 8 for t in tokens)
    assert worst <= ENGINE_TOL, worst
