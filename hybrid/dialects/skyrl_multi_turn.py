"""SkyRL's multi-turn keys (generator.max_turns, its token budgets, environment.*) as rules
of the SkyRL dialect, translated onto hybrid's `actor_rollout_ref.rollout.multi_turn`.

When hybrid runs episodes. SkyRL always steps an environment (skyrl-gym) after the model;
hybrid scores single-turn samples with the rule scorers picked by each row's data_source.
So the multi-turn loop is switched on when `generator.max_turns > 1`, or when
`environment.env_class` names an environment that is not one of the single-turn scorers
(gsm8k, aime), which then runs as SkyRL runs it: episodes of max_turns model turns (one by
default). Otherwise everything stays single-turn, as before.

Token budgets (SkyRL's skyrl_gym_generator): each model turn may generate up to
`sampling_params.max_generate_length` tokens, and a trajectory stops before a turn once its
input (prompt + model turns + observations) is longer than `max_input_length` (default
`trainer.max_prompt_length`). A trajectory is therefore at most max_input_length +
max_generate_length tokens, prompt included. hybrid bounds the response part (model and
observation tokens) by `data.max_response_length` next to `data.max_prompt_length`, so in
episodes:

    multi_turn.max_tokens_per_turn = max_generate_length
    data.max_response_length       = max_input_length + max_generate_length - max_prompt_length
    data.max_prompt_length         = trainer.max_prompt_length (max_input_length no longer)

The total is SkyRL's for a prompt of full length. A shorter prompt leaves SkyRL more room
for the response and hybrid the same fixed room; hybrid may also start one more, shorter,
turn where SkyRL would stop because the input passed max_input_length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybrid.dialects.environments import (
    ENV_KWARGS,
    MULTI_TURN,
    check_environment,
    is_module_spec,
    known_environments,
)
from hybrid.dialects.table import Context, Refusal, custom, flatten, refuse

MAX_TURNS = "generator.max_turns"
ENV_CLASS = "environment.env_class"
GENERATE = "generator.sampling_params.max_generate_length"
INPUT = "generator.max_input_length"
STEP_WISE = "generator.step_wise_trajectories"
LOSS_REDUCTION = "trainer.algorithm.loss_reduction"

# SkyRL environments (skyrl-gym) that are one response scored by a rule, and the hybrid
# scorer that does the same; the row's data_source picks it (reward/scorers/__init__.py).
SINGLE_TURN_ENVS = {
    "gsm8k": "gsm8k scorer: rows with data_source openai/gsm8k or gsm8k",
    "aime": "math scorer (last \\boxed{} answer): rows with data_source math, lighteval/MATH, HuggingFaceH4/MATH-500",
}
# Why a name hybrid does not know is not there, beyond the list of known names.
# Environments SkyRL's examples register in their own entry points (skyrl_gym.register), by the
# id their scripts use -> the class registered; hybrid names them by that module path.
EXAMPLE_ENVS = {
    "llm_as_a_judge": "examples.train.llm_as_a_judge.llm_judge_env:GSM8kLLMJudgeEnv",
    "multiply": "examples.train.multiply.env:MultiplyEnv",
    "geometry3k": "examples.train.geometry3k.env:Geometry3kEnv",
    # visgym's entry point registers env_instruct's or env_sft's class, as its --env_variant says.
    "visgym": "examples.train.visgym.env_instruct:VisGymEnv",
}
ENV_HINTS = {
    name: f"SkyRL's example environment is registered by its example's entry point, not by skyrl-gym; name the "
    f"class it registers, environment.env_class={entry}, from the SkyRL checkout"
    for name, entry in EXAMPLE_ENVS.items()
}
ENV_HINTS["visgym"] += " (--env_variant instruct; examples.train.visgym.env_sft:VisGymEnv for --env_variant sft)"
# SkyRL's defaults for the environment sections skyrl-gym's classes read (skyrl-gym's
# Text2SQLEnvConfig and SearchEnvConfig). SkyRL hands an environment its whole section,
# defaults included; hybrid hands over only the keys written, so these are written with it.
GYM_SECTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "text2sql": {"db_path": "/home/ray/default/sql_data"},
    "search": {"log_requests": False, "search_url": "http://127.0.0.1:8000/retrieve", "topk": 3, "timeout": 30},
    "llm_as_a_judge": {"model": "gpt-4o-mini", "base_url": None},  # SkyRL's GSM8kLLMJudgeEnvConfig
}
NEEDS_SERVICE = {
    "text2sql": "reads SQLite files under db_path (a missing database file stops the run, naming the file)",
    "search": (
        "calls the retrieval server at search_url; without one each search step retries for about "
        "45 s and ends its trajectory at multi_turn.env_step_timeout_s (finish reason error, "
        "counted in multi_turn/* metrics)"
    ),
}


def single_turn_note() -> str:
    return "; ".join(f"{k}: {v}" for k, v in SINGLE_TURN_ENVS.items())


# ---------------------------------------------------------------- when episodes run


def _turns(ctx: Context) -> int | None:
    value = ctx.get(MAX_TURNS, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def episodes(ctx: Context) -> bool:
    """Whether this SkyRL line runs hybrid's multi-turn loop (see the module doc)."""
    turns = _turns(ctx)
    if turns is not None and turns > 1:
        return True
    return ctx.has(ENV_CLASS) and ctx.get(ENV_CLASS) not in SINGLE_TURN_ENVS


def _episode_keys(ctx: Context) -> dict[str, Any]:
    # SkyRL puts each step's reward on the last token of its turn: reward_placement=turn.
    return {
        f"{MULTI_TURN}.enable": True,
        f"{MULTI_TURN}.max_assistant_turns": _turns(ctx) or 1,
        f"{MULTI_TURN}.reward_placement": "turn",
    }


def _positive(ctx: Context, key: str, verl_key: str) -> int:
    value = ctx.effective(key, verl_key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(f"{key}={value}: the token budgets must be whole numbers >= 1")
    return value


def _budget_keys(ctx: Context) -> dict[str, Any]:
    """The per-turn and trajectory budgets of an episode (the module doc has the formula)."""
    generate = _positive(ctx, GENERATE, "data.max_response_length")
    prompt = _positive(ctx, "trainer.max_prompt_length", "data.max_prompt_length")
    limit = _positive(ctx, INPUT, "data.max_prompt_length") if ctx.has(INPUT) else prompt
    if limit < prompt:
        raise Refusal(
            f"multi-turn: max_input_length {limit} is shorter than trainer.max_prompt_length {prompt}; SkyRL "
            f"would end a trajectory with a longer prompt before its first turn, hybrid has no such filter"
        )
    return {f"{MULTI_TURN}.max_tokens_per_turn": generate, "data.max_response_length": limit + generate - prompt}


# ---------------------------------------------------------------- converters


def _max_turns(value: Any, ctx: Context) -> dict[str, Any]:
    if _turns(ctx) is None:
        raise Refusal("a whole number >= 1 (model turns per episode)")
    return _episode_keys(ctx) if episodes(ctx) else {}


def _batched(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if value and (_turns(ctx) or 1) > 1:
        raise Refusal(
            "SkyRL's batched generation runs a single turn whatever max_turns says; give batched=false "
            "(its per-trajectory agent loop) for multi-turn"
        )
    # false: SkyRL's agent loop, each trajectory at its own pace: hybrid's agent loops
    # (mode=async) in multi-turn; a single turn is one batched generate either way.
    # SkyRL's vision-language generator: hybrid's lock-step loop, which carries images (skyrl_vision.py).
    if ctx.get("generator.vision_language_generator", False) is True:
        return {}
    return {"actor_rollout_ref.rollout.mode": "async"} if not value and episodes(ctx) else {}


def _conversation(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    return {f"{MULTI_TURN}.use_conversation_multi_turn": value} if episodes(ctx) else {}


def _append_eos(value: Any, ctx: Context) -> dict[str, Any]:
    if value is True or not episodes(ctx):
        return {}
    conversation = ctx.effective("generator.use_conversation_multi_turn", f"{MULTI_TURN}.use_conversation_multi_turn")
    if value is False and (not conversation or ctx.get("generator.sampling_params.stop") is None):
        return {}  # SkyRL reads it only in conversation mode with stop strings
    raise Refusal(
        "hybrid always closes a model turn that did not end with EOS (a stop string, or its budget ran "
        "out) with the EOS token, masked out of the loss as in SkyRL, before the next observation"
    )


def _step_wise(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise Refusal("true or false")
    if not value or not episodes(ctx):
        return {}
    if ctx.get(LOSS_REDUCTION, None) == "token_mean_legacy":
        raise Refusal(f"SkyRL refuses {LOSS_REDUCTION}=token_mean_legacy with step-wise training (use token_mean)")
    return {f"{MULTI_TURN}.step_wise_trajectories": True}


def _input_length(value: Any, ctx: Context) -> dict[str, Any]:
    return _budget_keys(ctx) if episodes(ctx) else {"data.max_prompt_length": value}


def _generate_length(value: Any, ctx: Context) -> dict[str, Any]:
    return _budget_keys(ctx) if episodes(ctx) else {"data.max_response_length": value}


def _eval_generate_length(value: Any, ctx: Context) -> dict[str, Any]:
    if not episodes(ctx):
        return {"data.max_response_length": value}
    train = ctx.effective(GENERATE, "data.max_response_length")
    if value != train:
        raise Refusal(
            f"hybrid validates with the training per-turn budget ({GENERATE}={train}); it has no separate key"
        )
    return {}


def _gym_defaults(env: str, ctx: Context) -> dict[str, Any]:
    """SkyRL's defaults for the leaves of environment.skyrl_gym.<env> not given."""
    section = f"environment.skyrl_gym.{env}"
    return {
        f"{ENV_KWARGS}.{env}.{leaf}": value
        for leaf, value in GYM_SECTION_DEFAULTS.get(env, {}).items()
        if not ctx.has(f"{section}.{leaf}")
    }


def _flat_defaults(env: str, ctx: Context) -> dict[str, Any]:
    """SkyRL's defaults of section `env` not given, for an environment named by module path
    (its section is the run's env_kwargs itself)."""
    return {
        f"{ENV_KWARGS}.{leaf}": value
        for leaf, value in GYM_SECTION_DEFAULTS.get(env, {}).items()
        if not ctx.has(f"environment.skyrl_gym.{env}.{leaf}")
    }


def _env_class(value: Any, ctx: Context) -> dict[str, Any]:
    if not episodes(ctx):
        return {}  # a single-turn scorer name: hybrid's scorer for the row's data_source
    name = check_environment(value, ENV_HINTS.get(value, ""))
    registered_as = [env for env, entry in EXAMPLE_ENVS.items() if entry == name]
    defaults = _flat_defaults(registered_as[0], ctx) if registered_as else _gym_defaults(name, ctx)
    return {f"{MULTI_TURN}.env_class": name, **_episode_keys(ctx), **defaults}


def _env_workers(value: Any, ctx: Context) -> dict[str, Any]:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal("a whole number >= 0")
    # SkyRL's 0 runs the environment calls in its event loop, one at a time: one thread.
    return {f"{MULTI_TURN}.env_workers": max(1, value)}


def _gym_section(value: Any, ctx: Context) -> dict[str, Any]:
    env, _, leaf = ctx.key[len("environment.skyrl_gym.") :].partition(".")
    if leaf:
        given = {leaf: value}
    elif value is None or isinstance(value, Mapping):
        given = flatten(value or {})  # the whole section as one value
    else:
        raise Refusal("a section of keys (environment.skyrl_gym.<env_class>.<key>=value)")
    if is_module_spec(str(ctx.get(ENV_CLASS, ""))) and env not in known_environments()[0]:
        # env_class names an example's own class by module path; its section (SkyRL hands an
        # environment cfg.environment.skyrl_gym[<id it was registered under>]) is the run's only one.
        return {**_flat_defaults(env, ctx), **{f"{ENV_KWARGS}.{k}": v for k, v in given.items()}}
    written = {f"{ENV_KWARGS}.{env}.{k}": v for k, v in given.items()}
    # Defaults first: a leaf given inside a whole-section value replaces its default.
    return {**_gym_defaults(env, ctx), **written}


def _service_note() -> str:
    return "; ".join(f"{k} {v}" for k, v in NEEDS_SERVICE.items())


GENERATOR_RULES = (
    custom(
        MAX_TURNS,
        (f"{MULTI_TURN}.enable", f"{MULTI_TURN}.max_assistant_turns", f"{MULTI_TURN}.reward_placement"),
        _max_turns,
        "1 -> single-turn (unless environment.env_class is an environment); N > 1 -> enable=true, "
        "max_assistant_turns=N, reward_placement=turn",
        "SkyRL puts each turn's reward on that turn's last token, hybrid's reward_placement=turn",
    ),
    custom(
        "generator.batched",
        ("actor_rollout_ref.rollout.mode",),
        _batched,
        "false in multi-turn -> mode=async (agent loops); true with max_turns > 1 refused",
        "SkyRL's batched=true generates one turn only; false is its per-trajectory agent loop, hybrid's "
        "agent loops (each trajectory at its own pace)",
    ),
    custom(
        "generator.use_conversation_multi_turn",
        (f"{MULTI_TURN}.use_conversation_multi_turn",),
        _conversation,
        "same value in multi-turn; accepted, unread, in single-turn",
    ),
    custom(
        "generator.append_eos_token_after_stop_str_in_multi_turn",
        (),
        _append_eos,
        "true accepted (hybrid's behaviour); false refused where SkyRL reads it (multi-turn, conversation "
        "mode, stop strings given)",
    ),
    custom(
        STEP_WISE,
        (f"{MULTI_TURN}.step_wise_trajectories",),
        _step_wise,
        "true in multi-turn -> step_wise_trajectories=true; true in single-turn: nothing (a trajectory is one "
        "turn, one sample either way); false: nothing",
        "each model turn is a sample: the whole history re-rendered with the chat template before every turn "
        "(generation and training see that text, e.g. Qwen3's earlier thinking dropped), the turn and its "
        "observation (masked) as the response, the last turn's outcome advantage on every turn of the "
        "trajectory, mini-batches of whole prompts however many turns (docs/multi_turn.md)",
    ),
    refuse(
        "generator.merge_stepwise_output",
        "SkyRL's prefix-aware merging of a trajectory's step-wise samples into one sequence where each turn's prompt "
        "extends the previous sample: hybrid trains each turn as a sample of its own",
        accept=(False,),
    ),
    custom(
        INPUT,
        ("data.max_prompt_length", "data.max_response_length", f"{MULTI_TURN}.max_tokens_per_turn"),
        _input_length,
        "single-turn: data.max_prompt_length; multi-turn: data.max_response_length = "
        "max_input_length + max_generate_length - trainer.max_prompt_length",
        "SkyRL stops a trajectory before a turn once its input is longer than max_input_length, so a "
        "trajectory holds at most max_input_length + max_generate_length tokens, prompt included",
    ),
    custom(
        GENERATE,
        ("data.max_response_length", f"{MULTI_TURN}.max_tokens_per_turn"),
        _generate_length,
        "single-turn: data.max_response_length; multi-turn: max_tokens_per_turn, and data.max_response_length "
        "as for max_input_length",
        "SkyRL's budget of one model turn",
    ),
    custom(
        "generator.eval_sampling_params.max_generate_length",
        ("data.max_response_length",),
        _eval_generate_length,
        "single-turn: data.max_response_length; multi-turn: must equal sampling_params.max_generate_length",
        "hybrid validates with the training budgets",
    ),
)

ENVIRONMENT_RULES = (
    custom(
        ENV_CLASS,
        (f"{MULTI_TURN}.env_class", f"{MULTI_TURN}.enable", f"{MULTI_TURN}.max_assistant_turns"),
        _env_class,
        "single-turn scorer names with max_turns 1: nothing (" + ", ".join(SINGLE_TURN_ENVS) + "); "
        "otherwise a hybrid environment name -> multi_turn.env_class, episodes on",
        "hybrid's environments: arithmetic_retry, skyrl-gym's (gsm8k_multi_turn, text2sql, search, lcb, "
        "searchcode, gsm8k, aime) with the env extra, or path/to/env.py:ClassName. With env_class null a row's "
        "env_class column picks the environment; a run-wide env_class applies to every row in hybrid, while "
        "SkyRL's is the default for rows without one. Single-turn scorers: " + single_turn_note(),
    ),
    custom(
        "environment.skyrl_gym.max_env_workers",
        (f"{MULTI_TURN}.env_workers",),
        _env_workers,
        "N -> N; 0 (SkyRL: in the event loop) -> 1",
    ),
    custom(
        "environment.skyrl_gym.<env_class>.*",
        (f"{ENV_KWARGS}.<env_class>.<key>",),
        _gym_section,
        "same names below env_kwargs.<env_class>, with SkyRL's defaults for text2sql and search; with env_class "
        "given as package.module:ClassName (an environment an example's entry module registers), the section "
        "of the id it registers goes to env_kwargs itself",
        "each environment gets its own section; " + _service_note(),
    ),
)

__all__ = [
    "ENVIRONMENT_RULES",
    "GENERATOR_RULES",
    "GYM_SECTION_DEFAULTS",
    "SINGLE_TURN_ENVS",
    "episodes",
    "single_turn_note",
]
