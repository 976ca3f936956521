"""Agents written against the OpenAI client, trained as they are: subclass `OpenAIAgentLoop`
and write `run_agent(client, row)` with the `openai` package's `AsyncOpenAI` client the loop
hands you. Its requests go to the rank's OpenAI-compatible endpoint
(workers/rollout/openai_server.py, `agent.enable_http_endpoint=true`) under the
trajectory's own session, so the endpoint records exactly the tokens the engine saw and
sampled (observations masked out); that record is the trajectory the trainer trains on.
`run_agent` returns the trajectory's reward (on its last model token), or None to leave
scoring to the reward function (custom_reward_function.path). When the trajectory's budget
runs out (data.max_response_length, max_model_len) the endpoint answers with a 400
`context_length_exceeded`: an agent that lets it propagate ends there (finish reason
`length`, no reward), as the multi-turn loop's trajectories do. Register the class in an
`agent.agent_loop_config_path` file and name it in the rows' `agent_name` column (or
`agent.default_agent_loop`):

    class ArithmeticAgent(OpenAIAgentLoop):
        async def run_agent(self, client, row):
            messages = list(row["raw_prompt"])
            reply = await client.chat.completions.create(model="policy", messages=messages)
            return float(reply.choices[0].message.content.strip() == row["reward_model"]["ground_truth"])

An agent that raises ends its trajectory (finish reason `error`, counted) with
`multi_turn.tolerate_env_errors=true`; otherwise the run stops naming the agent and the row.
"""

from __future__ import annotations

from typing import Any

from reward.environments import EnvironmentFailed
from workers.rollout.agent_loop import AgentLoop, RolloutCall
from workers.rollout.multi_turn import MULTI_TURN, Trajectory
from workers.rollout.openai_protocol import SESSION_HEADER, SessionRecord

AGENT = "actor_rollout_ref.rollout.agent"


class OpenAIAgentLoop(AgentLoop):
    """The base of an agent that talks to the policy through the OpenAI API."""

    def __init__(self, rollout, **kwargs):
        super().__init__(rollout, **kwargs)
        name = type(self).__name__
        if not rollout.agent.enable_http_endpoint:
            raise ValueError(f"agent loop {name} talks to the OpenAI endpoint: set {AGENT}.enable_http_endpoint=true")
        if not rollout.config.multi_turn.enable:
            raise ValueError(
                f"agent loop {name} makes multi-turn trajectories (observations masked, its reward on the last "
                f"model token): set {MULTI_TURN}.enable=true"
            )

    async def run_agent(self, client, row: dict[str, Any]) -> float | None:
        """The agent: talk to the policy through `client` (an `openai.AsyncOpenAI`); the
        trajectory's reward, or None."""
        raise NotImplementedError

    async def run(self, trajectory: Trajectory, call: RolloutCall) -> None:
        import openai

        endpoint = self.rollout.endpoint
        session = f"{id(call):x}-{trajectory.row}-{trajectory.sample}"
        client = openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key="hybrid", default_headers={SESSION_HEADER: session}, max_retries=2
        )
        reward, error = None, None
        try:
            reward = await self.run_agent(client, self.row(trajectory, call))
        except openai.BadRequestError as raised:
            # The endpoint's budget ran out (response_length, max_model_len): the trajectory
            # ends there, as the multi-turn loop's do (finish reason length, no reward).
            if getattr(raised, "code", None) != "context_length_exceeded":
                error = raised
        except Exception as raised:  # the user's agent: ends its trajectory, or the run
            error = raised
        finally:
            await client.close()
            record = endpoint.take_session(session)
        self._fill(trajectory, call, record, reward)
        if error is not None:
            self._failed(trajectory, error)

    def _fill(self, trajectory: Trajectory, call: RolloutCall, record: SessionRecord | None, reward) -> None:
        if record is None or not record.prompt_ids:
            trajectory.finish, trajectory.error = "error", f"agent {type(self).__name__} made no request"
            return
        width = call.prompts.batch["input_ids"].shape[1]
        if len(record.prompt_ids) > width:
            raise ValueError(
                f"agent {type(self).__name__}'s first prompt on batch row {trajectory.row} is {len(record.prompt_ids)} "
                f"tokens, longer than the prompt width {width} (data.max_prompt_length)"
            )
        trajectory.prompt_ids, trajectory.prompt_rendered = list(record.prompt_ids), True
        trajectory.response_ids = list(record.response_ids)
        trajectory.mask = list(record.response_mask)
        trajectory.log_probs = [float(p) for p in record.log_probs]
        trajectory.turns = record.turns
        trajectory.user_turns = max(record.turns - 1, 0)
        trajectory.observation_tokens = record.response_mask.count(0)
        if record.turn_ends:
            trajectory.last_model_position = record.turn_ends[-1]
        assistant = [m["content"] for m in record.messages if m.get("role") == "assistant"]
        trajectory.last_turn_text = assistant[-1] if assistant else ""
        if reward is not None and trajectory.last_model_position is not None:
            trajectory.rewards.append((trajectory.last_model_position, float(reward)))
        trajectory.finish = "length" if record.finish_reason == "length" and record.finished else "done"

    def _failed(self, trajectory: Trajectory, error: Exception) -> None:
        message = f"agent {type(self).__name__} raised {type(error).__name__} on batch row {trajectory.row}: {error}"
        if not self.config.multi_turn.tolerate_env_errors:
            hint = f"set {MULTI_TURN}.tolerate_env_errors=true to end such trajectories instead"
            raise EnvironmentFailed(f"{message} ({hint})") from error
        trajectory.finish, trajectory.error = "error", message
