"""The agent-loop contract of mode=async: `AgentLoop`, the class every loop is (built-ins in
workers/rollout/agent_loops.py, a user's through agent.agent_loop_config_path or
`register_agent_loop`), and `RolloutCall`, what the trajectories of one call share.
workers/rollout/agent_rollout.py runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.data_proto import DataProto
from workers.rollout.base import GeneratedTurn, SamplingSettings
from workers.rollout.multi_turn import Trajectory

if TYPE_CHECKING:  # annotations only: the runner imports this module
    from workers.rollout.agent_rollout import AgentRollout

AGENT = "actor_rollout_ref.rollout.agent"
AGENT_LOOP_REGISTRY: dict[str, type[AgentLoop]] = {}


def register_agent_loop(name: str):
    """Register an AgentLoop subclass under `name` (a row's agent_name, or default_agent_loop)."""

    def decorator(cls: type[AgentLoop]) -> type[AgentLoop]:
        AGENT_LOOP_REGISTRY[name] = cls
        return cls

    return decorator


@dataclass
class RolloutCall:
    """What every trajectory of one `generate_sequences` call shares."""

    prompts: DataProto
    rows: list[dict]
    settings: SamplingSettings  # n and the sampling of this call (training or validation)


class AgentLoop:
    """One kind of trajectory. `run` fills `trajectory` (prompt_ids, response_ids, mask,
    log_probs, rewards, turns, finish; see workers/rollout/multi_turn.Trajectory): response
    tokens are the engine's (mask 1, with their log-probs) and what the loop appended
    (mask 0). One instance serves every trajectory of its name in a call, concurrently, so
    per-trajectory state lives in the trajectory, not on `self`. Extra keys of an
    agent_loop_config_path entry arrive as constructor keyword arguments."""

    def __init__(self, rollout: AgentRollout, **kwargs):
        self.rollout = rollout
        self.tokenizer = rollout.tokenizer
        self.config = rollout.config  # the rollout section
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no settings, got {sorted(kwargs)}")

    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        raise NotImplementedError

    # ---- what a loop needs
    def row(self, trajectory: Trajectory, call: RolloutCall) -> dict:
        """The trajectory's data row (non-tensor fields: raw_prompt, extra_info, ...)."""
        return call.rows[trajectory.row]

    def dataset_prompt_ids(self, trajectory: Trajectory, call: RolloutCall) -> list[int]:
        """The data loader's prompt tokens of the trajectory's row, without padding."""
        return call.rows[trajectory.row]["_prompt_ids"]

    async def generate(self, prompt_ids: list[int], max_tokens: int, call: RolloutCall) -> GeneratedTurn:
        """One model turn from exactly these tokens, with the call's sampling and this budget."""
        return await self.rollout.generate(prompt_ids, max_tokens, call.settings)

    def decode(self, token_ids: list[int]) -> str:
        with self.rollout.tokenizer_lock:
            return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


__all__ = ["AGENT_LOOP_REGISTRY", "AgentLoop", "RolloutCall", "register_agent_loop"]
