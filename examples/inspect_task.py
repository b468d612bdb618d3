"""ResiliBench as an Inspect AI task file: ``inspect eval examples/inspect_task.py --model PROVIDER/MODEL``
(``-T limit=20 -T seed=1``), then ``inspect view``. See docs/envs/frameworks.md."""

from inspect_ai import Task, task

from resilibench.envs.text.inspect_task import resilibench_task


@task
def resilibench(split: str = "test", limit: int | None = None, seed: int = 0) -> Task:
    """Episodes of the test split's tasks for one seed, scored by the evaluator."""
    return resilibench_task(split=split, limit=limit, seeds=[seed])
