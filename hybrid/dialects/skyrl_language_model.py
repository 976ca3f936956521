"""SkyRL's `language_model_only` switches (Qwen3.5 and other multimodal checkpoints trained on
text), as hybrid keys.

SkyRL has three: `trainer.policy.language_model_only` and `trainer.ref.language_model_only`
load only the language model of a multimodal checkpoint (AutoModelForCausalLM, no vision
encoder), and `generator.inference_engine.language_model_only` passes `language_model_only` to
the vLLM engine, which then starts without its vision encoder. In hybrid the policy's key is
`actor_rollout_ref.model.language_model_only` (the reference loads the policy's model, the
critic follows it through `critic.model.language_model_only`), and the engine's is vLLM's own
argument, `actor_rollout_ref.rollout.engine_kwargs.vllm.language_model_only`.

SkyRL's reference with `false` under a language-model-only policy loads the whole multimodal
model, whose log-probs on text are those of its language model: hybrid's reference, loaded as
the policy, gives the same ones, so that pair is accepted. A reference or engine asking for the
language model alone while the policy loads the whole checkpoint is refused (hybrid trains the
language model only: a multimodal policy is refused at start anyway).
"""

from __future__ import annotations

from typing import Any

from hybrid.dialects.skyrl_convert import ARR, ROLLOUT
from hybrid.dialects.table import Context, Refusal, custom, show

POLICY = "trainer.policy.language_model_only"
REF = "trainer.ref.language_model_only"
ENGINE = "generator.inference_engine.language_model_only"
MODEL_KEY = f"{ARR}.model.language_model_only"
ENGINE_KEY = f"{ROLLOUT}.engine_kwargs.vllm.language_model_only"


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise Refusal(f"{key} takes true or false, not {show(value)}")
    return value


def _policy(value: Any, ctx: Context) -> dict[str, Any]:
    return {MODEL_KEY: _flag(POLICY, value)}


def _follows_policy(key: str, value: Any, ctx: Context) -> bool:
    """The value, checked against the policy's (whose default is false)."""
    flag = _flag(key, value)
    if flag and not ctx.get(POLICY, False):
        raise Refusal(
            f"true while {POLICY}=false: hybrid loads the whole checkpoint for every role or the language model "
            f"for every role ({MODEL_KEY}); set {POLICY}=true as well"
        )
    return flag


def _ref(value: Any, ctx: Context) -> dict[str, Any]:
    _follows_policy(REF, value, ctx)
    return {}  # hybrid's reference loads the policy's model (see the module's docstring)


def _engine(value: Any, ctx: Context) -> dict[str, Any]:
    return {ENGINE_KEY: _follows_policy(ENGINE, value, ctx)}


LANGUAGE_MODEL_RULES = (
    custom(
        POLICY,
        (MODEL_KEY,),
        _policy,
        "same value",
        "the language model of a multimodal checkpoint alone (no vision encoder), for actor, reference and critic",
    ),
    custom(
        REF,
        (),
        _ref,
        f"must equal {POLICY}, or be false under true",
        "the reference loads the policy's model; SkyRL's false loads the whole multimodal model, whose text "
        "log-probs are its language model's",
    ),
    custom(
        ENGINE,
        (ENGINE_KEY,),
        _engine,
        f"same value (vLLM's language_model_only); true needs {POLICY}=true",
    ),
)

__all__ = ["LANGUAGE_MODEL_RULES"]
