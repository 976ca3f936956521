"""What a fused actor-rollout-ref worker holds: its role.

The values are verl's role strings, so `Role("actor_rollout_ref")` and the enum member
are interchangeable wherever a role is passed (a worker group's constructor arguments,
a run script).
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):  # noqa: UP042 - StrEnum would change str() and f"{}" of a member: Role.ACTOR -> actor
    ACTOR = "actor"  # the trained policy only
    ROLLOUT = "rollout"  # a generation engine fed from a frozen copy of the policy
    REF = "ref"  # the frozen reference policy only
    ACTOR_ROLLOUT = "actor_rollout"  # the hybrid engine without a reference policy
    ACTOR_ROLLOUT_REF = "actor_rollout_ref"  # the hybrid engine with one
    # Asynchronous training: the trained policy and the reference policy, the engines in
    # their own processes (workers/rollout_engine_worker.py) fed by export_weights.
    ACTOR_REF = "actor_ref"

    @classmethod
    def parse(cls, value: Role | str) -> Role:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"role={value!r} is not one of {', '.join(r.value for r in cls)}") from None

    @property
    def has_actor(self) -> bool:
        return self in (Role.ACTOR, Role.ACTOR_ROLLOUT, Role.ACTOR_ROLLOUT_REF, Role.ACTOR_REF)

    @property
    def has_rollout(self) -> bool:
        return self in (Role.ROLLOUT, Role.ACTOR_ROLLOUT, Role.ACTOR_ROLLOUT_REF)

    @property
    def has_ref(self) -> bool:
        return self in (Role.REF, Role.ACTOR_ROLLOUT_REF, Role.ACTOR_REF)
