"""mini-swe-agent (PyPI ``mini-swe-agent``, unchanged) as a sandrl harness.

Its own pieces run as they ship: ``DefaultAgent`` with the ``mini.yaml`` config of the ``mini``
command (tool calls: one ``bash`` tool), ``LitellmModel`` pointed at the episode's gateway
session (``openai/<model>`` with ``api_base`` = the session's ``base_url``), and its
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` finish convention. sandrl adds one
:class:`SandboxEnvironment` (its ``Environment`` protocol) that runs each command in the episode's
sandbox, and maps the agent's budget: ``step_limit`` = the episode's turns, no cost limit.

``mini.yaml``'s prompts take about 3,500 characters; a model whose context budget is under
:data:`COMPACT_BELOW` tokens (the tiny byte-level model's 2,048) gets the same config with
:data:`COMPACT_TEMPLATES` (the same rules, said shortly), else no turn would fit.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.rollout.trajectory import StopReason

COMPACT_BELOW = 8192
"""Context budgets (tokens) under which the compact prompts are used."""

COMPACT_TEMPLATES = {
    "system_template": "You are a helpful assistant that can interact with a computer.",
    "instance_template": (
        "Please solve this task: {{task}}\n\n"
        "Call the bash tool with one command per step; each runs in a new subshell in the working directory. "
        "When done, run `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` alone."
    ),
}

_EXIT = {"Submitted": "submitted", "LimitsExceeded": "max_turns", "TimeExceeded": "wall_time"}


def _quiet_imports() -> None:
    # mini-swe-agent prints a banner at import; litellm would fetch its model price map from the
    # internet at import. Neither belongs in a training run.
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # The gateway is local: an error it answers is not transient, and sandrl retries episodes itself.
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")


def load_config(context_tokens: int) -> dict[str, Any]:
    """``mini.yaml`` as the ``mini`` command uses it, with the compact prompts for a small context."""
    _quiet_imports()
    try:
        import yaml
        from minisweagent.config import builtin_config_dir
    except ImportError as exc:
        raise ConfigError(
            "the mini-swe-agent harness needs the mini-swe-agent package: pip install 'sandrl[harness]'"
        ) from exc
    config: dict[str, Any] = yaml.safe_load((Path(builtin_config_dir) / "mini.yaml").read_text())
    if context_tokens < COMPACT_BELOW:
        config["agent"].update(COMPACT_TEMPLATES)
    return config


class SandboxEnvironment:
    """mini-swe-agent's ``Environment`` protocol over the episode's sandbox."""

    def __init__(self, ctx: HarnessContext, env: dict[str, str] | None = None) -> None:
        from pydantic import BaseModel

        class Config(BaseModel):
            cwd: str = ctx.task.environment.workdir
            env: dict[str, str] = {}
            timeout: float = ctx.command_timeout_s

        self.ctx = ctx
        self.config = Config(env=dict(env or {}))

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = str(action.get("command", ""))
        result = self.ctx.exec_sync(command, timeout, cwd=cwd or None, env=self.config.env)
        output: dict[str, Any] = {
            "output": result.stdout + result.stderr,
            "returncode": result.exit_code,
            "exception_info": f"the command timed out after {result.duration_s:.0f} s" if result.timed_out else "",
        }
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and result.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # The sandbox shares the host's kernel (namespaces, not a VM): uname is the host's.
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        environment = self.config.model_dump(mode="json")
        return {"info": {"config": {"environment": environment, "environment_type": "sandrl"}}}


def _drop_cached_clients(litellm: Any, base_url: str) -> None:
    """Close the clients litellm cached for this episode's session: one per endpoint, each session its own
    endpoint, so over a training run they would pile up, holding connections to sessions long gone."""
    cache = litellm.in_memory_llm_clients_cache
    for key, client in list(cache.cache_dict.items()):
        url = str(getattr(client, "base_url", ""))
        if url.rstrip("/").startswith(base_url.rstrip("/")):
            close = getattr(client, "close", None)
            if callable(close):
                close()
            cache.delete_cache(key)


def run(ctx: HarnessContext) -> StopReason:
    """One mini-swe-agent episode (a harness: runs in a worker thread)."""
    context = min(ctx.budget.max_total_tokens, ctx.session.max_total_tokens or ctx.budget.max_total_tokens)
    config = load_config(context)
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    litellm.suppress_debug_info = True  # its "Provider List" banner on every uncosted call

    model_config = dict(config.get("model", {}))
    model_kwargs = dict(model_config.pop("model_kwargs", {}))
    model_kwargs.update(
        api_base=ctx.base_url, api_key=ctx.api_key, temperature=ctx.temperature, max_tokens=ctx.max_new_tokens
    )
    model = LitellmModel(
        model_name=f"openai/{ctx.model}", model_kwargs=model_kwargs, cost_tracking="ignore_errors", **model_config
    )
    env = SandboxEnvironment(ctx, config.get("environment", {}).get("env"))
    agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}
    agent_config.update(step_limit=ctx.budget.max_turns, cost_limit=0.0)
    agent = DefaultAgent(model, env, **agent_config)
    try:
        outcome = agent.run(ctx.task.instruction)
    finally:
        _drop_cached_clients(litellm, ctx.base_url)
    return _EXIT.get(str(outcome.get("exit_status")), "done")  # type: ignore[return-value]
