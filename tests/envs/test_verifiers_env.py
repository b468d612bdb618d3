"""The text env as a verifiers environment: a scripted model (the optimal policy behind a real OpenAI-compatible
server on loopback, read by verifiers' own OpenAI client) played through ``run_rollout`` meets the text env's
trace, level and outcomes seed for seed; an environment error ends the rollout as verifiers' InfraError, apart
from the injected faults and unscored."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from chat_server import ChatServer, completion

from helpers import optimal_text_outcome
from resilibench.agents.scripted import OptimalTextAgent
from resilibench.core.world import load_tasks
from resilibench.envs.text.env import ResiliBenchTextEnv

if importlib.util.find_spec("verifiers") is None:
    pytest.skip("pip install 'resilibench[frameworks]' (verifiers)", allow_module_level=True)
pytestmark = pytest.mark.slow  # verifiers is imported by the tests, not at collection (the fast lane skips them)

TASKS = load_tasks(split="test")[:4]


class ScriptedModel:
    """The optimal policy as a chat model: it plays a reference text env of the same task and seed with the
    messages it sends, so the reference is the text env played message for message."""

    def __init__(self):
        self.reference: ResiliBenchTextEnv | None = None

    def start(self, task_id, seed):
        self.reference = ResiliBenchTextEnv(split=None, tasks=TASKS)
        self.reference.reset(seed=seed, options={"task_id": task_id})

    def answer(self, body):
        assert self.reference is not None
        sent = [m["content"] for m in body["messages"]]
        assert sent == [m["content"] for m in self.reference.messages]  # what the model sees is the text env's
        message = OptimalTextAgent.message(self.reference.episode)
        self.reference.step(message)
        return 200, completion(message)


@pytest.fixture(scope="module")
def vfenv():
    from resilibench.envs.text import verifiers_env

    return verifiers_env


def rollouts(env, model, rows):
    from openai import AsyncOpenAI

    with ChatServer(model.answer) as server:
        client = AsyncOpenAI(base_url=server.url, api_key="none")
        for row in rows:
            model.start(row["info"]["task_id"], row["info"]["seed"])
            yield row, asyncio.run(env.run_rollout(row, client, "scripted", {}, state_columns=["resilibench"]))


def test_a_scripted_model_meets_the_text_env_seed_for_seed(vfenv):
    import verifiers as vf

    env = vf.load_environment("resilibench.envs.text.verifiers_env", split="test", limit=len(TASKS), seeds=[0, 1, 2])
    rows = list(env.get_eval_dataset())
    assert len(rows) == 3 * len(TASKS)
    faults, model = set(), ScriptedModel()
    for row, output in rollouts(env, model, rows):
        task_id, seed = row["info"]["task_id"], row["info"]["seed"]
        expected = optimal_text_outcome(task_id, seed, tasks=TASKS)
        record = output[vfenv.RECORD_KEY]
        assert record["trace"] == expected["trace"] and record["level"] == expected["level"]
        assert output["reward"] == float(expected["level"] == "full_success") and output["error"] is None
        assert output["metrics"]["partial_success"] == float(expected["level"] == "partial_success")
        assert record["faults"] == [r["error_code"] for r in expected["trace"] if not r["success"]]
        assert model.reference is not None
        assert output["completion"] == model.reference.messages[len(row["prompt"]):]  # message for message
        faults |= set(record["faults"])
    assert faults  # the episodes met injected failures, not only successes


def test_an_environment_error_ends_the_rollout_apart_from_faults(vfenv):
    class LosesItsEpisode(vfenv.ResiliBenchVerifiersEnv):
        async def setup_state(self, state):
            state = await super().setup_state(state)
            state[vfenv.ENV_KEY].episode = None  # the env loses its episode: it cannot go on
            return state

    env = LosesItsEpisode(TASKS[:2], seeds=[0])
    model = ScriptedModel()
    for _, output in rollouts(env, model, list(env.get_eval_dataset())):
        assert "InfraError" in str(output["error"]) and "RuntimeError" in str(output["error"])
        assert output["stop_condition"] == "has_error" and output["reward"] == 0.0
        assert output[vfenv.RECORD_KEY]["faults"] == [] and output[vfenv.RECORD_KEY]["level"] is None
    with pytest.raises(ValueError, match="seeds must be integers"):
        vfenv.ResiliBenchVerifiersEnv([TASKS[0]], seeds=[-1])
