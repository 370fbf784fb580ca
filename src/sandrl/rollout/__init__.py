"""Episodes: agents in sandboxes, the trajectories they produce, and the runner of many at once.

::

    runner = RolloutRunner(BwrapProvider(), LLMAgent(engine.tokenizer), policy=engine,
                           config=RunnerConfig(concurrency=32, group_size=8))
    result = await runner.run(tasks, progress=True)
    write_jsonl("rollouts.jsonl", result.trajectories)
"""

from sandrl.rollout.agent import Agent, AgentResult, Budget
from sandrl.rollout.agents.llm import LLMAgent, LLMAgentConfig
from sandrl.rollout.agents.scripted import NullAgent, OracleAgent, ReplayAgent, ThinkTime
from sandrl.rollout.episode import EpisodeConfig, EpisodeTimeouts, run_episode
from sandrl.rollout.jsonl import TrajectoryWriter, read_jsonl, write_jsonl
from sandrl.rollout.runner import Group, RolloutRunner, RunnerConfig, RunResult
from sandrl.rollout.trajectory import EpisodeError, EpisodeStatus, Timings, Trajectory, Turn

__all__ = [
    "Agent",
    "AgentResult",
    "Budget",
    "EpisodeConfig",
    "EpisodeError",
    "EpisodeStatus",
    "EpisodeTimeouts",
    "Group",
    "LLMAgent",
    "LLMAgentConfig",
    "NullAgent",
    "OracleAgent",
    "ReplayAgent",
    "RolloutRunner",
    "RunResult",
    "RunnerConfig",
    "ThinkTime",
    "Timings",
    "Trajectory",
    "TrajectoryWriter",
    "Turn",
    "read_jsonl",
    "run_episode",
    "write_jsonl",
]
