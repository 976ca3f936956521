"""A `verifiers` (0.4.0, `verifiers.v1`) environment small enough to check by hand, for the
verifiers_env test of test_agent_loops.py: four question tasks, an in-process two-turn chat
harness (the user's NUDGE between the turns) and a rubric of two weighted rewards on the last
reply (`rubric` computes the same sum from a reply's text). The test loads it as an installed
environment package would be: a module exporting its Taskset and Harness through `__all__`.
"""

from __future__ import annotations

import openai
import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

NUDGE = "Again, shorter."
TASKS = [("What is 2 + 3?", "5"), ("Name a colour.", "red"), ("Count to five.", "5"), ("Capital of France?", "Paris")]


def rubric(answer: str, reply: str) -> float:
    """The rubric's reward by hand: 1 if the answer is in the reply, plus 0.5 / (1 + its length)."""
    return float(answer in reply) + 0.5 * (1.0 / (1 + len(reply)))


def last_reply(trace) -> str:
    messages = trace.branches[-1].messages if trace.branches else []
    replies = [m.content for m in messages if m.role == "assistant"]
    return str(replies[-1] or "") if replies else ""


class QuestionData(vf.TaskData):
    answer: str = ""


class QuestionTask(vf.Task[QuestionData]):
    @vf.reward
    async def says_answer(self, task, trace) -> float:
        return float(task.answer in last_reply(trace))

    @vf.reward(weight=0.5)
    async def brevity(self, task, trace) -> float:
        return 1.0 / (1 + len(last_reply(trace)))


class QuestionTaskset(vf.Taskset[QuestionTask]):
    def load(self):
        for question, answer in TASKS:
            yield QuestionTask(QuestionData(prompt=[{"role": "user", "content": question}], answer=answer))


class TwoTurnChat(vf.Harness):
    """The model answers, hears NUDGE, answers again; every call through the interception endpoint."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    APPENDS_SYSTEM_PROMPT = True

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        messages = [message.model_dump(exclude_none=True) for message in data.prompt]
        try:
            for turn in range(2):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=5)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                if turn == 0:
                    messages.append({"role": "user", "content": NUDGE})
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


def write_package(folder, name: str) -> None:
    """An importable package `name` in `folder` exporting this module's taskset and harness, as an
    installed environment package does (verifiers imports `owner/name@version` as `name`)."""
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text(
        "from tests.integration.verifiers_helpers import QuestionTaskset, TwoTurnChat\n\n"
        "__all__ = ['QuestionTaskset', 'TwoTurnChat']\n"
    )


__all__ = ["QuestionTaskset", "TwoTurnChat"]
