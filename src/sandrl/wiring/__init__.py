"""The wiring layer: the one place a resolved config becomes components.

It sits above :mod:`sandrl.rollout`, :mod:`sandrl.inference`, :mod:`sandrl.sandbox` and
:mod:`sandrl.tasks` (none of which import it) and below :mod:`sandrl.train`, :mod:`sandrl.cluster`,
:mod:`sandrl.demo`, :mod:`sandrl.bench` and the CLI, which call it::

    config.py    ModelConfig ([model]), TasksConfig ([tasks]), RolloutConfig ([rollout]): the settings
    policy.py    open_policy(model): the embedded engine, an SGLang or an OpenAI-compatible client,
                 carrying the model's tokenizer and context length
    runner.py    build_runner(rollout, provider, policy=..., agent=...): RunnerConfig, EpisodeConfig
                 (budget, per-phase timeouts), the LLM agent and its sampling, the RolloutRunner
    tasks.py     task_set(tasks, root), load_task_set(path), task_path(spec): the tasks ('builtin': the suite);
                 task_mix(tasks, root, seed): a training run's task at each data position
    task_mix.py  TaskMix: [[tasks.sources]] drawn by weight, each source shuffled per pass
    sandboxes.py open_provider(rollout): [rollout] sandboxes, local (bubblewrap) or e2b (an E2B service)
    evaluate.py  sandrl eval: EvalConfig (overrides of RolloutConfig, or of a training run's), evaluate(),
                 the task filters and the results directory
    eval_report.py  pass@k per task (Chen et al.'s unbiased estimator) and the failures grouped by reason
    suite.py     sandrl tasks run / validate: the oracle and null agents through the same runner

A caller with a model::

    async with open_policy(config.model) as policy:
        runner = build_runner(config.rollout, local_provider(), policy=policy, run_id="run-1")
        result = await runner.run(task_set(config.tasks, out / "tasks"))
"""

from sandrl.wiring.config import ModelConfig, RolloutConfig, TasksConfig
from sandrl.wiring.policy import open_policy
from sandrl.wiring.runner import build_runner, llm_agent, local_provider, open_agent, runner_config
from sandrl.wiring.sandboxes import open_provider
from sandrl.wiring.tasks import load_task_set, task_mix, task_set

__all__ = [
    "ModelConfig",
    "RolloutConfig",
    "TasksConfig",
    "build_runner",
    "llm_agent",
    "load_task_set",
    "local_provider",
    "open_agent",
    "open_policy",
    "open_provider",
    "runner_config",
    "task_mix",
    "task_set",
]
