"""``python -m sandrl_harbor.run_agent``: one Harbor agent, unchanged, in a sandbox that already exists.

How sandrl runs Harbor's agents (Terminus-2) as its own: sandrl's episode owns the sandbox and the
verifier; this runs only the agent's part of a Harbor trial (``setup`` then ``run`` with the task's
instruction) in :class:`~sandrl_harbor.environment.SandrlEnvironment` attached to that sandbox by
id, with the agent's model at an OpenAI-compatible ``--api-base`` (sandrl's session gateway). It
ends with one JSON line on stdout: ``{"ok": bool, "error": str | null, "completed": bool, "context":
{...}}`` (``completed``: the agent marked the task complete; ``context``: Harbor's ``AgentContext``).

::

    SANDRL_TOKEN=... python -m sandrl_harbor.run_agent --agent terminus-2 --model openai/policy \\
        --api-base http://127.0.0.1:9000/v1/sessions/s1 --url http://127.0.0.1:8700 --sandbox-id sb-1 \\
        --instruction-file task/instruction.md --logs-dir /tmp/logs --agent-kwarg parser_name=json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from harbor.agents.factory import AgentFactory
from harbor.models.agent.context import AgentContext
from harbor.models.agent.name import AgentName
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from sandrl_harbor.environment import SandrlEnvironment


def _value(text: str) -> Any:
    """An ``--agent-kwarg`` value: JSON when it parses (numbers, booleans, objects), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sandrl_harbor.run_agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", required=True, help="A Harbor agent name (terminus-2, oracle, nop...).")
    p.add_argument("--model", default=None, help="The agent's model, e.g. openai/<name> for an OpenAI endpoint.")
    p.add_argument("--api-base", default=None, help="The model's OpenAI-compatible base URL.")
    p.add_argument("--url", required=True, help="The sandrl sandbox service holding the sandbox.")
    p.add_argument("--sandbox-id", required=True)
    p.add_argument("--instruction-file", type=Path, required=True)
    p.add_argument("--logs-dir", type=Path, required=True)
    p.add_argument("--workdir", default=None, help="The task's working directory (the agent's default cwd).")
    p.add_argument("--environment-dir", type=Path, default=None, help="The task's environment/ (for the agent).")
    p.add_argument("--agent-kwarg", action="append", default=[], help="key=value for the agent's constructor.")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    logs = args.logs_dir.resolve()
    paths = TrialPaths(trial_dir=logs)
    paths.mkdir()
    environment_dir = args.environment_dir or logs / "environment"
    environment_dir.mkdir(parents=True, exist_ok=True)
    env = SandrlEnvironment(
        environment_dir=environment_dir,
        environment_name="sandrl-episode",
        session_id=f"sandrl__{args.sandbox_id}",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir=args.workdir),
        url=args.url,
        sandbox_id=args.sandbox_id,
    )
    kwargs = {k: _value(v) for k, _, v in (item.partition("=") for item in args.agent_kwarg)}
    if args.api_base is not None:
        kwargs["api_base"] = args.api_base
    agent = AgentFactory.create_agent_from_name(
        AgentName(args.agent), logs_dir=paths.agent_dir, model_name=args.model, **kwargs
    )
    context = AgentContext()
    error: str | None = None
    try:
        await env.start(force_build=False)
        await agent.setup(env)
        await agent.run(args.instruction_file.read_text(), env, context)
    except Exception as exc:  # reported, not raised: the caller decides what the agent's failure means
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    finally:
        await env.stop(delete=False)
    return {
        "ok": error is None,
        "error": error,
        "completed": marked_complete(paths.agent_dir / "trajectory.json"),
        "context": context.model_dump(mode="json"),
    }


def marked_complete(trajectory: Path) -> bool:
    """Whether the agent's last step in its ATIF trajectory marks the task complete (Terminus-2's
    ``task_complete``, confirmed: it stops only on the second one)."""
    try:
        steps = json.loads(trajectory.read_text()).get("steps") or []
    except (OSError, ValueError):
        return False
    agent_steps = [s for s in steps if s.get("source") == "agent"]
    calls = (agent_steps[-1].get("tool_calls") or []) if agent_steps else []
    return any(c.get("function_name") == "mark_task_complete" for c in calls)


def main(argv: list[str] | None = None) -> None:
    result = asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
