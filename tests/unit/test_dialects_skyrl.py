"""SkyRL keys on hybrid's command line (hybrid/dialects/skyrl.py and its siblings):
each mapping and transform, the refusals (by name, with the reason, all in one error), the
nearest-key hint for typos (whole command lines and example scripts: test_dialects_skyrl_lines.py).
Nothing here loads a model."""

from __future__ import annotations

import pytest

from hybrid.config import ConfigError, load_config, typed_config
from hybrid.dialects import skyrl as skyrl_dialect
from hybrid.dialects.skyrl import translate_skyrl
from hybrid.dialects.table import NO_DUAL_CLIP
from tests.unit.dialect_helpers import A, skyrl, skyrl_error

# ---------------------------------------------------------------- SkyRL mappings


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.policy.model.path=/models/q"], {f"{A}.model.path": "/models/q"}),
        (["trainer.algorithm.advantage_estimator=reinforce++"], {"algorithm.adv_estimator": "reinforce_plus_plus"}),
        (["trainer.algorithm.advantage_estimator=rloo"], {"algorithm.adv_estimator": "rloo"}),
        # (SkyRL's default policy_mini_batch_size, 256, would exceed 16 prompts: SkyRL refuses that.)
        (["trainer.train_batch_size=16", "trainer.policy_mini_batch_size=16"], {"data.train_batch_size": 16}),
        # Both count prompts per optimizer step; the micro batches count samples per device.
        (["trainer.policy_mini_batch_size=4"], {f"{A}.actor.ppo_mini_batch_size": 4}),
        (["trainer.micro_train_batch_size_per_gpu=2"], {f"{A}.actor.ppo_micro_batch_size_per_gpu": 2}),
        (
            ["trainer.micro_forward_batch_size_per_gpu=3"],
            {
                f"{A}.rollout.log_prob_micro_batch_size_per_gpu": 3,
                f"{A}.ref.log_prob_micro_batch_size_per_gpu": 3,
                "critic.forward_micro_batch_size_per_gpu": 3,
            },
        ),
        (["trainer.epochs=2"], {"trainer.total_epochs": 2, "trainer.total_training_steps": None}),
        (
            ["trainer.critic.model.lora.rank=32", "trainer.critic.model.lora.alpha=32"],
            {"critic.model.lora_rank": 32, "critic.model.lora_alpha": 32},
        ),
        (["trainer.update_epochs_per_batch=2"], {f"{A}.actor.ppo_epochs": 2}),
        (["trainer.eval_interval=-1"], {"trainer.test_freq": -1}),
        (["trainer.ckpt_interval=10"], {"trainer.save_freq": 10}),
        (["trainer.ckpt_path=/ck"], {"trainer.default_local_dir": "/ck"}),
        (["trainer.seed=7"], {"trainer.seed": 7, "data.seed": 7}),
        (["trainer.logger=wandb"], {"trainer.logger": ["wandb", "file"]}),
        (["trainer.logger=['console','tensorboard']"], {"trainer.logger": ["console", "tensorboard", "file"]}),
        (
            ["trainer.project_name=p", "trainer.run_name=r"],
            {"trainer.project_name": "p", "trainer.experiment_name": "r"},
        ),
        (["trainer.policy.optimizer_config.lr=1e-6"], {f"{A}.actor.optim.lr": 1e-6}),
        (["trainer.policy.optimizer_config.weight_decay=0.1"], {f"{A}.actor.optim.weight_decay": 0.1}),
        (["trainer.policy.optimizer_config.max_grad_norm=0.5"], {f"{A}.actor.grad_clip": 0.5}),
        (
            ["trainer.algorithm.use_kl_loss=true", "trainer.algorithm.kl_loss_coef=0.01"],
            {f"{A}.actor.use_kl_loss": True, f"{A}.actor.kl_loss_coef": 0.01, "algorithm.kl_ctrl.kl_coef": 0.01},
        ),
        (["trainer.algorithm.use_kl_in_reward=true"], {"algorithm.use_kl_in_reward": True}),
        (
            ["trainer.algorithm.kl_estimator_type=k3"],
            {f"{A}.actor.kl_loss_type": "low_var_kl", "algorithm.kl_penalty": "low_var_kl"},
        ),
        (["trainer.algorithm.kl_estimator_type=k2"], {f"{A}.actor.kl_loss_type": "mse"}),
        (["trainer.algorithm.use_abs_kl=true"], {f"{A}.actor.kl_loss_type": "abs"}),
        (["trainer.algorithm.loss_reduction=sequence_mean"], {f"{A}.actor.loss_agg_mode": "seq-mean-token-mean"}),
        (
            ["trainer.algorithm.loss_reduction=seq_mean_token_sum_norm"],
            {f"{A}.actor.loss_agg_mode": "seq-mean-token-sum-norm"},
        ),
        (
            ["trainer.algorithm.eps_clip_low=0.1", "trainer.algorithm.eps_clip_high=0.3"],
            {f"{A}.actor.clip_ratio_low": 0.1, f"{A}.actor.clip_ratio_high": 0.3},
        ),
        # SkyRL's regular PPO clip: hybrid's dual-clip loss with a bound that never binds.
        (
            ["trainer.algorithm.policy_loss_type=regular", "trainer.algorithm.clip_ratio_c=3.0"],
            {f"{A}.actor.policy_loss.loss_mode": "vanilla", f"{A}.actor.clip_ratio_c": NO_DUAL_CLIP},
        ),
        (
            ["trainer.algorithm.policy_loss_type=dual_clip", "trainer.algorithm.clip_ratio_c=5.0"],
            {f"{A}.actor.policy_loss.loss_mode": "vanilla", f"{A}.actor.clip_ratio_c": 5.0},
        ),
        (["trainer.algorithm.ppo_loss_type=dual_clip"], {f"{A}.actor.clip_ratio_c": 3.0}),
        # cispo reads its own bounds, not eps_clip_*.
        (
            ["trainer.algorithm.policy_loss_type=cispo", "trainer.algorithm.eps_clip_high=0.3"],
            {
                # SkyRL's CISPOConfig: cispo_eps_clip_low 1.0, cispo_eps_clip_high 4.0, the clamp
                # [1 - 1.0, 1 + 4.0] = [0, 5] (ppo_utils.py); hybrid's cispo clamps at [1 - low, 1 + high].
                f"{A}.actor.policy_loss.loss_mode": "cispo",
                f"{A}.actor.clip_ratio_low": 1.0,
                f"{A}.actor.clip_ratio_high": 4.0,
            },
        ),
        (["trainer.algorithm.use_entropy_loss=true"], {f"{A}.actor.entropy_coeff": 0.01}),
        (
            ["trainer.algorithm.entropy_loss_coef=0.2", "trainer.algorithm.use_entropy_loss=true"],
            {f"{A}.actor.entropy_coeff": 0.2},
        ),
        (
            ["trainer.algorithm.use_tis=true", "trainer.algorithm.tis_imp_ratio_cap=2.0"],
            {f"{A}.actor.tis_imp_ratio_cap": 2.0},
        ),
        (["trainer.algorithm.off_policy_correction.tis_ratio_type=token"], {f"{A}.actor.tis_imp_ratio_cap": 2.0}),
        (
            [
                "trainer.algorithm.dynamic_sampling.type=filter",
                "trainer.algorithm.dynamic_sampling.max_sample_batches=-1",
            ],
            {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.max_num_gen_batches": 0},
        ),
        (["trainer.algorithm.kl_cov.kl_cov_frac=0.2"], {f"{A}.actor.policy_loss.kl_cov_ratio": 0.2}),
        (
            ["trainer.algorithm.lambd=0.9", "trainer.algorithm.gamma=0.99"],
            {"algorithm.lam": 0.9, "algorithm.gamma": 0.99},
        ),
        (["generator.n_samples_per_prompt=5"], {f"{A}.rollout.n": 5}),
        (
            [
                "generator.sampling_params.temperature=0.7",
                "generator.sampling_params.top_p=0.9",
                "generator.sampling_params.top_k=20",
                "generator.sampling_params.min_p=0.05",
                "generator.sampling_params.max_generate_length=32",
            ],
            {
                f"{A}.rollout.temperature": 0.7,
                f"{A}.rollout.top_p": 0.9,
                f"{A}.rollout.top_k": 20,
                f"{A}.rollout.min_p": 0.05,
                "data.max_response_length": 32,
            },
        ),
        (["generator.sampling_params.additional_kwargs.presence_penalty=0.5"], {f"{A}.rollout.presence_penalty": 0.5}),
        (
            [
                "generator.eval_sampling_params.temperature=0",
                "generator.eval_sampling_params.top_p=0.5",
                "generator.eval_n_samples_per_prompt=2",
            ],
            {
                f"{A}.rollout.val_kwargs.temperature": 0,
                f"{A}.rollout.val_kwargs.do_sample": False,
                f"{A}.rollout.val_kwargs.top_p": 0.5,
                f"{A}.rollout.val_kwargs.n": 2,
            },
        ),
        (["generator.max_input_length=100"], {"data.max_prompt_length": 100}),
        (["generator.max_turns=1", "environment.env_class=gsm8k", "trainer.placement.colocate_all=true"], {}),
        (["generator.backend=vllm"], {f"{A}.rollout.name": "vllm"}),
        (["generator.inference_engine.backend=vllm"], {f"{A}.rollout.name": "vllm"}),
        (
            [
                "generator.inference_engine_tensor_parallel_size=2",
                "trainer.placement.policy_num_gpus_per_node=4",
                "generator.num_inference_engines=2",
            ],
            {f"{A}.rollout.tensor_model_parallel_size": 2, "trainer.n_gpus_per_node": 4},
        ),
        (
            ["generator.weight_transfer_threshold_cuda_ipc_GB=0.25"],
            {f"{A}.rollout.update_weights_bucket_megabytes": 256},
        ),
        (["generator.engine_init_kwargs.swap_space=2"], {f"{A}.rollout.engine_kwargs.vllm.swap_space": 2}),
        (
            ["trainer.policy.model_config_kwargs.attention_dropout=0.1"],
            {f"{A}.model.override_config.attention_dropout": 0.1},
        ),
        (
            ["data.train_data=['/d/a.parquet','/d/b.parquet']", "data.val_data=/d/v.parquet"],
            {"data.train_files": ["/d/a.parquet", "/d/b.parquet"], "data.val_files": ["/d/v.parquet"]},
        ),
        (
            [
                "trainer.placement.policy_num_nodes=2",
                "trainer.placement.policy_num_gpus_per_node=8",
                "trainer.placement.ref_num_gpus_per_node=8",
            ],
            {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8},
        ),
        (["trainer.resume_mode=none"], {"trainer.resume_mode": "disable"}),
        (["trainer.resume_mode=latest"], {"trainer.resume_mode": "auto"}),
        (
            ["trainer.resume_mode=from_path", "trainer.resume_path=/ck/global_step_5"],
            {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/ck/global_step_5"},
        ),
        (["trainer.max_ckpts_to_keep=-1"], {"trainer.max_actor_ckpt_to_keep": None}),
        (["trainer.max_ckpts_to_keep=3"], {"trainer.max_actor_ckpt_to_keep": 3, "trainer.max_critic_ckpt_to_keep": 3}),
        (
            ["trainer.ckpt_interval=5", "trainer.hf_save_interval=2", "trainer.export_path=/ex"],
            {"trainer.save_freq": 5, "trainer.hf_save_freq": 2, "trainer.hf_export_dir": "/ex"},
        ),
        (["trainer.policy.model.path=/m", "trainer.ref.model.path=/m"], {f"{A}.model.path": "/m"}),
        (
            ["trainer.strategy=fsdp2"],
            {f"{A}.actor.strategy": "fsdp2", f"{A}.ref.strategy": "fsdp2", "critic.strategy": "fsdp2"},
        ),
        # Ulysses sequence parallelism; the reference's size must be the policy's.
        (
            [
                "trainer.policy.sequence_parallel_size=2",
                "trainer.ref.sequence_parallel_size=2",
                "trainer.critic.sequence_parallel_size=4",
                "trainer.sequence_parallel_backend=ulysses",
            ],
            {
                f"{A}.actor.ulysses_sequence_parallel_size": 2,
                f"{A}.ref.ulysses_sequence_parallel_size": 2,
                "critic.ulysses_sequence_parallel_size": 4,
            },
        ),
        (["trainer.policy.sequence_parallel_size=1"], {f"{A}.actor.ulysses_sequence_parallel_size": 1}),
        # Interpolation among the SkyRL keys of one line, and oc.env.
        (
            ["trainer.max_prompt_length=128", "generator.max_input_length=${trainer.max_prompt_length}"],
            {"data.max_prompt_length": 128},
        ),
        # fsdp_size passes as it is: verl's and SkyRL's create_device_mesh read it alike (at least
        # the ranks: full sharding; fewer: hybrid-sharded groups); the reference may repeat the policy's.
        (
            [
                "trainer.placement.policy_num_nodes=2",
                "trainer.placement.policy_num_gpus_per_node=4",
                "trainer.policy.fsdp_config.fsdp_size=8",
                "trainer.critic.fsdp_config.fsdp_size=-1",
                "trainer.ref.fsdp_config.fsdp_size=-1",
            ],
            {f"{A}.actor.fsdp_config.fsdp_size": 8, "critic.model.fsdp_config.fsdp_size": -1},
        ),
        (
            [
                "trainer.placement.policy_num_nodes=2",
                "trainer.policy.fsdp_config.fsdp_size=8",
                "trainer.ref.fsdp_config.fsdp_size=8",
            ],
            {f"{A}.actor.fsdp_config.fsdp_size": 8},
        ),
        # Expert parallelism: SkyRL's ep = dp x tp with dp 1 is vLLM's experts over the tensor-parallel group.
        (
            ["generator.inference_engine.tensor_parallel_size=2", "generator.inference_engine.expert_parallel_size=2"],
            {f"{A}.rollout.engine_kwargs.vllm.enable_expert_parallel": True},
        ),
        # SkyRL's llm_as_a_judge example environment named by the class its entry point registers:
        # its section, with SkyRL's defaults (GSM8kLLMJudgeEnvConfig) for the leaves not given.
        (
            [
                "environment.env_class=examples.train.llm_as_a_judge.llm_judge_env:GSM8kLLMJudgeEnv",
                "environment.skyrl_gym.llm_as_a_judge.model=judge-model",
            ],
            {
                f"{A}.rollout.multi_turn.env_kwargs.model": "judge-model",
                f"{A}.rollout.multi_turn.env_kwargs.base_url": None,
            },
        ),
        (
            ["environment.env_class=examples.train.llm_as_a_judge.llm_judge_env:GSM8kLLMJudgeEnv"],
            {f"{A}.rollout.multi_turn.env_kwargs.model": "gpt-4o-mini"},
        ),
        # fully_async.enabled=true alone is SkyRL's fully async trainer at its default staleness 4.
        (
            [
                "trainer.fully_async.enabled=true",
                "trainer.placement.colocate_all=false",
                "trainer.train_batch_size=8",
                "trainer.policy_mini_batch_size=8",
            ],
            {"async_training.mode": "fully_async", "async_training.max_staleness_steps": 4},
        ),
    ],
)
def test_skyrl_mapping(overrides, expected):
    out = skyrl(*overrides)
    for key, value in expected.items():
        assert key in out, (key, out)
        assert out[key] == value, (key, out[key], value)


def test_skyrl_always_turns_off_hybrid_only_extras():
    out = skyrl("trainer.seed=1")
    assert out["trainer.merge_on_finish"] is False and out["trainer.plot_on_finish"] is False


def test_skyrl_warmup_is_converted_from_optimizer_steps_to_training_steps():
    # 16 prompts / 4 per mini batch x 2 epochs = 8 optimizer steps per training step.
    base = ["trainer.train_batch_size=16", "trainer.policy_mini_batch_size=4", "trainer.update_epochs_per_batch=2"]
    assert skyrl(*base, "trainer.policy.optimizer_config.num_warmup_steps=24")[f"{A}.actor.optim.lr_warmup_steps"] == 3
    message = skyrl_error(*base, "trainer.policy.optimizer_config.num_warmup_steps=10")
    assert "num_warmup_steps=10" in message and "use a multiple of 8" in message


# SkyRL keys hybrid has no equivalent for, each with a value a user would give and a piece
# of the reason the refusal must give.
SKYRL_REFUSED = [
    ("trainer.placement.colocate_policy_ref=false", "lives in hybrid's actor worker, on the policy's devices"),
    ("trainer.placement.ref_num_gpus_per_node=2", "in the training group, on the policy's devices"),
    ("trainer.strategy=megatron", "Megatron"),
    ("deepspeed_config.train.zero_optimization.stage=3", "DeepSpeed"),
    ("trainer.sequence_parallel_backend=ring", "supported: ulysses"),
    ("trainer.ref.sequence_parallel_size=2", "splits sequences as the policy does"),
    ("trainer.update_ref_every_epoch=true", "reference stays the initial policy"),
    ("trainer.fully_async.max_staleness_steps=4", "requires trainer.placement.colocate_all=false"),
    ("trainer.algorithm.dynamic_sampling.type=replace", "replace has no equivalent"),
    ("trainer.algorithm.zero_variance_filter=true", "zero-variance"),
    ("trainer.algorithm.advantage_batch_normalize=true", "normalise advantages over the batch"),
    ("trainer.algorithm.off_policy_correction.tis_ratio_type=tokens", "supported: token, sequence"),
    (
        "trainer.algorithm.off_policy_correction.sequence_mask_metric=geometric",
        "mapped with policy_loss_type=rollout_is only",
    ),
    ("trainer.algorithm.policy_loss_type=my_loss", "PolicyLossRegistry"),
    ("trainer.algorithm.temperature=0.5", "sampling temperature"),
    ("generator.merge_stepwise_output=true", "hybrid trains each turn as a sample of its own"),
    ("generator.backend=sglang", "in-process vLLM"),
    ("generator.run_engines_locally=false", "requires generator.inference_engine.external_proxy_url or"),
    ("generator.inference_engine_pipeline_parallel_size=2", "tensor parallelism only"),
    ("generator.zero_reward_on_non_stop=true", "truncated responses"),
    ("generator.chat_template.name_or_path=/t.jinja", "chat template"),
    ("generator.eval_sampling_params.min_p=0.1", "validation min_p"),
    ("environment.env_class=minesweeper", "no environment of that name"),
    ("trainer.policy.model.lora.dropout=0.1", "dropout"),
    ("trainer.critic.model.lora.dropout=0.1", "dropout"),
    ("trainer.policy.record_memory=true", "memory-snapshot"),
    ("trainer.max_ckpts_to_keep=0", "keeps nothing"),
]


def test_skyrl_refusals_are_all_listed_at_once_by_name_with_the_reason():
    message = skyrl_error(*(o for o, _ in SKYRL_REFUSED))
    lines = message.splitlines()
    assert f"({len(SKYRL_REFUSED)} problems;" in lines[0]
    for override, reason in SKYRL_REFUSED:
        line = next((ln for ln in lines if ln.startswith(f"  - {override.split('=')[0]}=")), None)
        assert line is not None, override
        assert reason in line, (line, reason)
    assert "  - trainer.policy.record_memory=true: no memory-snapshot switch in hybrid" in lines


@pytest.mark.parametrize(
    "override, reason",
    [
        ("trainer.strategy=deepspeed", "DeepSpeed"),
        (
            "environment.env_class=llm_as_a_judge",
            "environment.env_class=examples.train.llm_as_a_judge.llm_judge_env:GSM8kLLMJudgeEnv",
        ),
        ("generator.max_turns=0", "a whole number >= 1"),
        (
            "trainer.algorithm.policy_loss_type=rollout_is trainer.algorithm.use_kl_in_reward=true",
            "SkyRL's reward KL reads its recomputed old log-probs",
        ),
        (
            "generator.inference_engine.tensor_parallel_size=2 generator.inference_engine.expert_parallel_size=4",
            "expert_parallel_size must be 1 or tensor_parallel_size (2)",
        ),
        (
            "trainer.algorithm.policy_loss_type=rollout_is "
            "trainer.algorithm.off_policy_correction.tis_ratio_type=token",
            "not applied by hybrid's bypass mode",
        ),
        (
            "trainer.algorithm.policy_loss_type=rollout_is trainer.update_epochs_per_batch=2 "
            "trainer.algorithm.off_policy_correction.sequence_mask_metric=product",
            "the same only for one optimizer step per batch (update_epochs_per_batch=2",
        ),
        (
            "generator.vision_language_generator=true generator.batched=true",
            "SkyRL's vision-language generator refuses generator.batched=true; set batched=false",
        ),
        (
            "generator.vision_language_generator=true generator.use_conversation_multi_turn=false",
            "requires generator.use_conversation_multi_turn=true",
        ),
        ("trainer.ref.language_model_only=true", "set trainer.policy.language_model_only=true as well"),
        # SkyRL's own batch check (validate_batch_sizes, floor division per GPU) refuses it too ...
        (
            "trainer.placement.policy_num_gpus_per_node=4 trainer.train_batch_size=16 trainer.policy_mini_batch_size=4 "
            "generator.n_samples_per_prompt=5 trainer.micro_train_batch_size_per_gpu=8",
            "trainer.policy_mini_batch_size=4: SkyRL's own check (validate_batch_sizes) refuses these sizes too: "
            "policy_mini_batch_size 4 x n_samples_per_prompt 5 = 20 samples over 4 data-parallel ranks is 5 per GPU "
            "(rounded down), which must be a positive multiple of micro_train_batch_size_per_gpu 8",
        ),
        (
            "trainer.placement.policy_num_nodes=2 trainer.placement.policy_num_gpus_per_node=8 "
            "trainer.policy.fsdp_config.fsdp_size=8 trainer.ref.fsdp_config.fsdp_size=-1",
            "trainer.ref.fsdp_config.fsdp_size=-1: hybrid's reference runs in the policy's workers and is sharded "
            "over the policy's shard groups (trainer.policy.fsdp_config.fsdp_size=8); give both the same size",
        ),
        (
            "trainer.fully_async.enabled=false trainer.fully_async.max_staleness_steps=2",
            "false with trainer.fully_async.max_staleness_steps given",
        ),
    ],
)
def test_skyrl_refused_values(override, reason):
    assert reason in skyrl_error(*override.split())


# run_lcb.sh's sizes: SkyRL's validate_batch_sizes accepts them (20 // 8 = 2 per GPU, a multiple of micro 2,
# dividing 80 // 8 = 10) and SkyRL pads each mini batch of 20 with 4 dummy rows; so does hybrid's option.
LCB_SIZES = (
    "trainer.placement.policy_num_gpus_per_node=8 trainer.train_batch_size=16 trainer.policy_mini_batch_size=4 "
    "generator.n_samples_per_prompt=5 trainer.micro_train_batch_size_per_gpu=2"
)


def test_skyrl_mini_batches_that_do_not_split_are_padded_as_skyrl_pads_them():
    out = skyrl(*LCB_SIZES.split())
    assert out[f"{A}.actor.ppo_mini_batch_size"] == 4 and out["trainer.pad_mini_batches"] is True
    config = typed_config(load_config(translate_skyrl(LCB_SIZES.split())))
    assert config.trainer.pad_mini_batches is True
    assert config.actor_rollout_ref.actor.mini_batch_samples_per_rank == 3  # 20 + 4 dummies over 8 ranks
    # 4 x 5 = 20 samples over 5 ranks split evenly: no padding asked for
    even = skyrl(*LCB_SIZES.replace("gpus_per_node=8", "gpus_per_node=5").split())
    assert "trainer.pad_mini_batches" not in even


def test_skyrl_documents_at_least_twenty_refused_keys():
    refused = [r for r in skyrl_dialect.RULES if r.kind == "refuse"]
    assert len(refused) >= 20
    assert all(r.note for r in refused)
    keys = {r.key for r in refused}
    for key in (
        "trainer.placement.colocate_policy_ref",
        "generator.merge_stepwise_output",
    ):
        assert key in keys


def test_skyrl_accepts_the_values_hybrid_already_has():
    skyrl(
        "trainer.placement.colocate_all=true",
        "trainer.policy.sequence_parallel_size=1",
        "generator.batched=true",
        "generator.max_turns=1",
        "generator.async_engine=true",
        "trainer.algorithm.normalize_reward=true",
    )
    # prefill/decode disaggregation places SkyRL's sampling work and writes nothing here
    assert skyrl("generator.inference_engine.enable_pd=true", "generator.inference_engine.num_prefill=2") == skyrl()


def test_skyrl_http_endpoint_turns_on_the_agent_loops_endpoint():
    out = skyrl(
        "generator.inference_engine.enable_http_endpoint=true",
        "generator.inference_engine.http_endpoint_host=127.0.0.1",
        "generator.inference_engine.http_endpoint_port=8123",
    )
    assert out[f"{A}.rollout.agent.enable_http_endpoint"] is True
    assert out[f"{A}.rollout.mode"] == "async"
    assert out[f"{A}.rollout.agent.http_endpoint_port"] == 8123
    assert out[f"{A}.rollout.agent.http_endpoint_host"] == "127.0.0.1"


def test_skyrl_typo_names_the_nearest_skyrl_key():
    message = skyrl_error("trainer.policy_mini_batch_sise=4", "generator.sampling_params.temprature=1.0")
    assert (
        "trainer.policy_mini_batch_sise=4: not a SkyRL key hybrid knows; did you mean trainer.policy_mini_batch_size?"
        in message
    )
    assert "did you mean generator.sampling_params.temperature?" in message


def test_skyrl_two_keys_for_one_verl_key_must_agree():
    message = skyrl_error("trainer.max_prompt_length=512", "generator.max_input_length=1024")
    assert "both set data.max_prompt_length, to different values (512 and 1024)" in message
    skyrl("trainer.max_prompt_length=512", "generator.max_input_length=512")


def test_skyrl_unresolvable_interpolation_is_reported():
    with pytest.raises(ConfigError, match="cannot resolve"):
        translate_skyrl(["generator.max_input_length=${trainer.max_prompt_length}"])


def test_skyrl_use_torch_compile_compiles_the_policys_entropy_only():
    # SkyRL compiles the chunked entropy of the policy's model wrapper; its reference's is built without it
    given = ["trainer.policy.use_torch_compile=true"]
    out = skyrl(*given)
    assert out[f"{A}.actor.use_torch_compile"] is True and out[f"{A}.ref.use_torch_compile"] is False
    arr = typed_config(load_config(translate_skyrl(given))).actor_rollout_ref
    assert arr.actor.use_torch_compile is True and arr.ref.use_torch_compile is False
    arr = typed_config(load_config(translate_skyrl(["trainer.policy.use_torch_compile=false"]))).actor_rollout_ref
    assert arr.actor.use_torch_compile is False and arr.ref.use_torch_compile is False
