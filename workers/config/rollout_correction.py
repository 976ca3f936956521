"""`algorithm.rollout_correction`, verl 0.9's off-policy correction: the section as the yaml
spells it. The driver's algorithm section holds it; the actor applies it, resolved once into
`CorrectionSettings` (workers/rollout_correction_settings.py) on the actor's own section
(`ActorConfig.correction`), so nothing about it travels with the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.config_schema import Annotated, OneOf, Problems, fmt, valid
from workers.rollout_correction_settings import IS_LEVELS, LOSS_TYPES, parse_is_threshold, parse_rejection

if TYPE_CHECKING:
    from workers.config.actor import ActorConfig


# Choices read from the registries when a config is checked (a plug-in may add names).
# Named functions, not lambdas: typing.get_type_hints evaluates annotations with the
# class's namespace as globals, where a lambda could not see this module's names.
def _is_levels() -> tuple[str, ...]:
    return tuple(IS_LEVELS)


def _loss_types() -> tuple[str, ...]:
    return tuple(LOSS_TYPES)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """`algorithm.rollout_correction`, verl 0.9's off-policy correction (workers/rollout_correction.py)."""

    rollout_is: Annotated[
        str | None,
        OneOf(
            _is_levels,
            unsupported=(
                (
                    "geometric",
                    "verl 0.9 has no geometric weights; reject by the geometric mean ratio with rollout_rs=seq_mean_k1",
                ),
            ),
        ),
    ]
    rollout_is_threshold: float | str | None
    rollout_is_batch_normalize: bool
    rollout_rs: str | None
    rollout_rs_threshold: float | str | None
    bypass_mode: bool
    loss_type: Annotated[str, OneOf(_loss_types)]

    def check(self, problems: Problems, actor: ActorConfig) -> None:
        """Threshold syntax and the rules between keys (and with the actor's older TIS key)."""
        key = "algorithm.rollout_correction"
        if self.rollout_is is not None and self.rollout_is_threshold is None:
            problems.add(
                f"{key}.rollout_is={fmt(self.rollout_is)} needs rollout_is_threshold (a number: TIS; "
                "'lower_upper': IcePop)"
            )
        elif self.rollout_is is not None and valid(self.rollout_is, self.rollout_is_threshold):
            try:
                parse_is_threshold(self.rollout_is_threshold)
            except ValueError as err:
                problems.add(f"{key}.rollout_is_threshold={fmt(self.rollout_is_threshold)}: {err}")
        if self.rollout_rs is not None and valid(self.rollout_rs, self.rollout_rs_threshold):
            try:
                parse_rejection(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as err:
                problems.add(
                    f"{key}.rollout_rs={fmt(self.rollout_rs)} with "
                    f"rollout_rs_threshold={fmt(self.rollout_rs_threshold)}: {err}"
                )
        if self.rollout_is_batch_normalize is True and self.rollout_is is None:
            problems.add(
                f"{key}.rollout_is_batch_normalize=True normalises importance weights, but rollout_is=null "
                "computes none; set rollout_is=token or sequence"
            )
        if self.loss_type == "reinforce" and self.bypass_mode is False:
            problems.add(
                f"{key}.loss_type='reinforce' is the loss of bypass mode (verl ignores it otherwise); set "
                "bypass_mode=true or loss_type=ppo_clip"
            )
        if (
            self.loss_type == "reinforce"
            and self.bypass_mode is True
            and valid(actor.policy_loss.loss_mode)
            and actor.policy_loss.loss_mode != "vanilla"
        ):
            problems.add(
                f"{key}.loss_type='reinforce' replaces the policy loss, so "
                "actor_rollout_ref.actor.policy_loss.loss_mode="
                f"{actor.policy_loss.loss_mode!r} would be ignored; set loss_mode=vanilla or loss_type=ppo_clip"
            )
        on = self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode is True
        cap = actor.tis_imp_ratio_cap
        if on and valid(cap) and cap > 0:
            problems.add(
                f"actor_rollout_ref.actor.tis_imp_ratio_cap={cap} is verl's older spelling of {key}.rollout_is=token "
                f"rollout_is_threshold={cap}; with {key} also set, write only {key} (and tis_imp_ratio_cap=-1)"
            )
