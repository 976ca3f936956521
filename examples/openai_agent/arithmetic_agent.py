"""An agent written against the OpenAI client, trained by hybrid as it is (the agent loops of
mode=async, workers/rollout/openai_agent.py): the default arithmetic question, and another try
after a wrong answer, up to three. It talks to the policy only through `client`; hybrid trains
on exactly the tokens its engine produced for this conversation (the retry messages masked
out) with the reward this function returns. examples/openai_agent_arithmetic.sh runs it."""

from __future__ import annotations

from reward.scorers.arithmetic import compute_score
from workers.rollout.openai_agent import OpenAIAgentLoop

RETRY = "Incorrect, try again."


class ArithmeticRetryAgent(OpenAIAgentLoop):
    def __init__(self, rollout, max_attempts: int = 3):
        super().__init__(rollout)
        self.max_attempts = int(max_attempts)

    async def run_agent(self, client, row) -> float:
        messages = [dict(m) for m in row["raw_prompt"]]
        answer = row["reward_model"]["ground_truth"]
        for _ in range(self.max_attempts):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24)
            text = reply.choices[0].message.content
            if compute_score(text, answer) == 1.0:
                return 1.0
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": RETRY}]
        return 0.0
