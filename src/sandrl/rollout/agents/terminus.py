"""Harbor's Terminus-2, unchanged, as a sandrl harness: ``--agent sandrl.rollout.agents.terminus:run``.

Terminus-2 is Harbor's agent (a tmux terminal driven by JSON replies) and Harbor needs Python
>= 3.12, so it runs in Harbor's own virtualenv (``make harbor-env``) as a subprocess,
``python -m sandrl_harbor.run_agent --agent terminus-2``. It reaches the two things an episode
lends it:

- **the sandbox**: the episode's sandbox, served by :func:`~sandrl.sandbox.service.lend.lend` on a
  loopback port with a token of its own, is its Harbor environment
  (``sandrl_harbor:SandrlEnvironment`` attached by id: nothing created, built or deleted);
- **the model**: litellm's ``openai/<model>`` at the gateway session's ``base_url``, so every call
  is recorded token-exact in the session (its trajectory is the episode's).

The budget stays sandrl's: the gateway refuses a call over the episode's turns or tokens (the
episode ends ``truncated``; Terminus-2's summarisation, which would rewrite its history into a new
segment, is off), and the subprocess is killed at the agent's wall time. Terminus-2's
``task_complete`` is ``submitted``. A failure to reach the lent sandbox is an infra error; anything
else Terminus-2 raises is the agent's failure (``error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path

from sandrl.errors import ConfigError, SandboxError
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.rollout.trajectory import StopReason
from sandrl.sandbox.service.lend import lend

HARBOR_PYTHON_ENV = "SANDRL_HARBOR_PYTHON"
"""The Python of Harbor's virtualenv (with sandrl-harbor); default: the one ``make harbor-env`` made."""
HARBOR_VENVS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sandrl" / "harbor-venv"
AGENT = "terminus-2"
STOPPED_POLL_S = 0.2
STOPPED_GRACE_S = 1.0
_TAIL = 2000


def harbor_python() -> Path:
    """Harbor's Python: ``$SANDRL_HARBOR_PYTHON``, else the newest virtualenv ``make harbor-env`` made."""
    given = os.environ.get(HARBOR_PYTHON_ENV)
    if given:
        if not Path(given).is_file():
            raise ConfigError(f"${HARBOR_PYTHON_ENV} is {given}, which is not a file: point it at Harbor's python")
        return Path(given)
    made = sorted(p / "bin" / "python" for p in HARBOR_VENVS.glob("*") if (p / ".sandrl-harbor").is_file())
    if not made:
        raise ConfigError(
            "Terminus-2 runs in Harbor's own Python >= 3.12 virtualenv, and there is none: run `make harbor-env` "
            f"(or point ${HARBOR_PYTHON_ENV} at the python of a virtualenv with harbor and integrations/harbor)"
        )
    return made[-1]


def agent_args(ctx: HarnessContext, loan_url: str, sandbox_id: str, work: Path) -> list[str]:
    """The command line of ``sandrl_harbor.run_agent`` for this episode."""
    instruction = work / "instruction.md"
    instruction.write_text(ctx.task.instruction)
    kwargs = {
        "parser_name": "json",
        "temperature": ctx.temperature,
        "record_terminal_session": False,  # asciinema is not in a task's image
        "enable_summarize": False,  # a summary rewrites the history: the budget ends the episode instead
        "suppress_max_turns_warning": True,
        "max_turns": ctx.budget.max_turns,
        "llm_call_kwargs": {"max_tokens": ctx.max_new_tokens},
        "model_info": {"max_input_tokens": ctx.budget.max_total_tokens, "max_output_tokens": ctx.max_new_tokens},
    }
    args = ["-m", "sandrl_harbor.run_agent", "--agent", AGENT, "--model", f"openai/{ctx.model}"]
    args += ["--api-base", ctx.base_url, "--url", loan_url, "--sandbox-id", sandbox_id]
    args += ["--instruction-file", str(instruction), "--logs-dir", str(work / "logs")]
    args += ["--workdir", ctx.task.environment.workdir]
    for key, value in kwargs.items():
        args += ["--agent-kwarg", f"{key}={json.dumps(value)}"]
    return args


async def run(ctx: HarnessContext) -> StopReason:
    """One Terminus-2 episode (see the module)."""
    python = harbor_python()
    async with lend(ctx.sandbox) as loan:
        with tempfile.TemporaryDirectory(prefix="sandrl-terminus-") as tmp:
            work = Path(tmp)
            env = {
                **os.environ,
                "SANDRL_TOKEN": loan.token,
                "OPENAI_API_KEY": ctx.api_key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of litellm's price list from the internet
            }
            proc = await asyncio.create_subprocess_exec(
                str(python),
                *agent_args(ctx, loan.url, loan.sandbox_id, work),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            try:
                ended = await _until_done_or_stopped(proc, ctx)
            finally:
                if proc.returncode is None:  # cancelled (the wall time): no Terminus-2 outlives its episode
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
    if ended is None:
        return "done"  # the agent's result says which budget ended it (the session's)
    out, err = ended
    return _outcome(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def _until_done_or_stopped(proc: asyncio.subprocess.Process, ctx: HarnessContext) -> tuple[bytes, bytes] | None:
    """The subprocess's output once it ends; None when it was ended because the gateway refused a call for
    the budget (from then on every call is refused, and Harbor's LLM client would only retry with backoff)."""
    talking = asyncio.ensure_future(proc.communicate())
    while not talking.done():
        await asyncio.wait([talking], timeout=STOPPED_POLL_S)
        if ctx.session.stopped is not None and not talking.done():
            await asyncio.sleep(STOPPED_GRACE_S)  # what it does with the refusal may still end it cleanly
            if not talking.done():
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                await talking
                return None
    return talking.result()


def _outcome(returncode: int | None, out: str, err: str) -> StopReason:
    lines = out.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise ConfigError(
            f"Harbor's run_agent ended (exit {returncode}) without its result line; is sandrl-harbor installed in "
            f"Harbor's virtualenv (make harbor-env)? stderr: {err.strip()[-_TAIL:]}"
        )
    error = result.get("error")
    if error:
        if "SandrlAPIError" in error:
            raise SandboxError(f"Terminus-2 could not use the episode's sandbox: {error[-_TAIL:]}")
        raise RuntimeError(f"Terminus-2 failed: {error[-_TAIL:]}")
    return "submitted" if result.get("completed") else "done"
