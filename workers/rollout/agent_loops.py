"""The built-in agent loops of mode=async (workers/rollout/agent_loop.py):

- `single_turn_agent`: one model turn from the data loader's prompt (verl's name);
- `environment_agent`: the multi-turn loop of workers/rollout/multi_turn.py for one
  trajectory: the environment of the row (env_class), of the run, a verl interaction or
  verl tools; the same per-trajectory steps as the lock-step loop, so greedy decoding with
  deterministic environments gives its tokens exactly;
- `tool_agent` (verl's name): that loop where the environment is the verl tools of
  multi_turn.tool_config_path (hermes tool calls in the model's text).
"""

from __future__ import annotations

import inspect

from workers.rollout.agent_loop import AgentLoop, RolloutCall
from workers.rollout.multi_turn import MULTI_TURN, Trajectory


class SingleTurnAgentLoop(AgentLoop):
    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        trajectory.prompt_ids = self.dataset_prompt_ids(trajectory, call)
        turn = await self.generate(trajectory.prompt_ids, call.settings.max_tokens, call)
        trajectory.response_ids = list(turn.token_ids)
        trajectory.mask = [1] * len(turn.token_ids)
        trajectory.log_probs = [float(p) for p in turn.log_probs]
        trajectory.turns = 1
        trajectory.finish = "done"
        if turn.token_ids:
            trajectory.last_model_position = len(turn.token_ids) - 1
            trajectory.last_turn_text = self.decode(turn.token_ids)


class EnvironmentAgentLoop(AgentLoop):
    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        loop = self.rollout.multi_turn
        if loop is None:
            raise ValueError(
                f"agent loop {type(self).__name__} steps an environment: set {MULTI_TURN}.enable=true "
                f"(with env_class, a tool or an interaction)"
            )
        rollout, rows, lock = self.rollout, call.rows, self.rollout.tokenizer_lock
        outcome = await rollout.env_call(trajectory, loop.opener(trajectory, rows))
        with lock:
            loop.set_prompt(trajectory, outcome, rows, call.prompts)
        while trajectory.finish is None:
            budget = loop.budget(trajectory)
            turn = await self.generate(trajectory.prompt_ids + trajectory.response_ids, budget, call)
            loop.apply_turn(trajectory, turn, budget, self.decode(turn.token_ids))
            outcome = await rollout.env_call(trajectory, *self._step(trajectory, loop))
            with lock:  # an observation is rendered with the tokenizer
                loop.apply_step(trajectory, outcome, rows)
        if loop.closable(trajectory):
            loop.apply_close(trajectory, await rollout.env_call(trajectory, loop.closer(trajectory)), rows)

    @staticmethod
    def _step(trajectory: Trajectory, loop) -> tuple:
        """(plain call, None), or (None, the coroutine) for an `async def step`."""
        if inspect.iscoroutinefunction(trajectory.env.step):
            return None, trajectory.env.step(trajectory.last_turn_text)
        return loop.stepper(trajectory), None


class ToolAgentLoop(EnvironmentAgentLoop):
    def __init__(self, rollout, **kwargs):
        super().__init__(rollout, **kwargs)
        if not rollout.config.multi_turn.tool_config_path:
            raise ValueError(
                f"agent loop tool_agent calls verl tools: set {MULTI_TURN}.tool_config_path (and "
                f"{MULTI_TURN}.enable=true), or use environment_agent"
            )


BUILT_IN_AGENT_LOOPS: dict[str, type[AgentLoop]] = {
    "single_turn_agent": SingleTurnAgentLoop,
    "environment_agent": EnvironmentAgentLoop,
    "tool_agent": ToolAgentLoop,
}
