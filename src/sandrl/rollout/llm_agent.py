"""The model-driven agent: generate, run the command, observe, repeat; token-exact throughout.

One episode::

    ids = template(system prompt, task instruction) + assistant prefix          loss mask 0
    loop:
        output = policy.generate(ids)                                          loss mask 1
        action = the first ```bash block of the output (``submit`` finishes)
        result = sandbox.exec(action, timeout = min(command timeout, time left))
        ids += observation turn (exit code, stdout/stderr head+tail) + prefix  loss mask 0

The model's ids are appended exactly as the server returned them, with its log-probs; the
agent's own additions are rendered from text once, by :class:`~sandrl.rollout.chat.ChatFormat`,
and never re-tokenized afterwards. A budget reached at turn k ends the episode at turn k: the
last command still runs (its effect is verified) but no observation is appended after the
model's last tokens, so the ids end with the model's last output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

from sandrl.errors import ConfigError, InferenceError, SandboxCrashedError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.tokenizer import Tokenizer
from sandrl.rollout.actions import SUBMIT, parse_action
from sandrl.rollout.agent import AgentResult, Budget, Deadline
from sandrl.rollout.chat import ChatFormat
from sandrl.rollout.observation import FORMAT_ERROR, render
from sandrl.rollout.trajectory import StopReason, Turn
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.task import Task

SYSTEM_PROMPT = f"""You are an agent working in a Linux shell to solve a task.
Each reply runs one shell command. Put it in a fenced bash block:

```bash
ls -la
```

The command runs as root in the task's working directory; you then see its exit code, stdout and stderr.
Files persist between commands. Long output is cut in the middle.
When the task is done, reply with a block holding only the word {SUBMIT}:

```bash
{SUBMIT}
```"""
"""What the model is told about its one tool and the finish convention."""


@dataclass(frozen=True)
class LLMAgentConfig:
    """How the model-driven agent samples, observes and runs commands."""

    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0, max_new_tokens=512))
    """Sampling of each turn; ``max_new_tokens`` is the per-turn limit (the total budget caps it further)."""
    observation_tokens: int = 1024
    """Most tokens of stdout plus stderr shown per command (head and tail kept)."""
    command_timeout_s: float = 60.0
    """Per-command timeout, further capped by the agent's remaining wall time. A task can set its own
    with ``[agent] command_timeout_sec`` in task.toml."""
    system_prompt: str = SYSTEM_PROMPT
    observation_role: str = "tool"

    def __post_init__(self) -> None:
        if self.observation_tokens < 16:
            raise ConfigError(f"observation_tokens must be >= 16, got {self.observation_tokens}")
        if self.command_timeout_s <= 0:
            raise ConfigError(f"command_timeout_s must be positive, got {self.command_timeout_s}")


def command_timeout(task: Task, default: float) -> float:
    """The task's per-command timeout (``[agent] command_timeout_sec``), else ``default``."""
    value = task.extra.get("agent.command_timeout_sec")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default


class _Conversation:
    """The ids, loss mask and log-probs, appended to and never rewritten."""

    def __init__(self, prompt: list[int]) -> None:
        self.ids = list(prompt)
        self.mask = [0] * len(prompt)
        self.logprobs = [0.0] * len(prompt)

    def add_model(self, generation: Generation) -> None:
        self.ids += generation.output_ids
        self.mask += [1] * len(generation.output_ids)
        self.logprobs += generation.output_logprobs

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def __len__(self) -> int:
        return len(self.ids)


class LLMAgent:
    """Drives a policy through a task; see the module docstring."""

    name = "llm"

    def __init__(self, tokenizer: Tokenizer, config: LLMAgentConfig | None = None) -> None:
        self.config = config or LLMAgentConfig()
        self.chat = ChatFormat(tokenizer, observation_role=self.config.observation_role)

    def prompt_ids(self, task: Task) -> list[int]:
        return self.chat.prompt_ids(self.config.system_prompt, task.instruction)

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        if policy is None:
            raise ConfigError("the llm agent needs a policy: pass --inference URL or --inference embedded")
        deadline = Deadline(budget.wall_time_for(task))
        conv = _Conversation(self.prompt_ids(task))
        prompt_len = len(conv)
        turns: list[Turn] = []

        def result(stop: StopReason) -> AgentResult:
            return AgentResult(stop, turns, conv.ids, conv.mask, conv.logprobs, prompt_len)

        if prompt_len >= budget.max_total_tokens:
            return result("max_tokens")
        per_command = command_timeout(task, self.config.command_timeout_s)
        for index in range(budget.max_turns):
            context = len(conv)
            params = dataclasses.replace(
                self.config.sampling,
                max_new_tokens=min(self.config.sampling.max_new_tokens, budget.max_total_tokens - context),
            )
            started = time.monotonic()
            try:
                async with asyncio.timeout(deadline.remaining()):
                    generation = await policy.generate(list(conv.ids), params)
            except TimeoutError:
                return result("wall_time")
            model_s = time.monotonic() - started
            if generation.finish_reason == "abort":
                raise InferenceError(
                    "the inference server aborted the request (it is shutting down or its weights failed to load)",
                    error_code="inference_aborted",
                )
            conv.add_model(generation)
            turn = Turn(
                index=index,
                command=None,
                output_start=context,
                output_end=len(conv),
                context_tokens=context,
                finish_reason=generation.finish_reason,
                weight_version=generation.weight_version,
                start_weight_version=generation.start_weight_version,
                output_weight_versions=generation.output_weight_versions,
                model_s=model_s,
                observation_start=len(conv),
                observation_end=len(conv),
            )
            closed = bool(generation.output_ids) and generation.output_ids[-1] in self.chat.stop_ids
            if not closed and len(conv) >= budget.max_total_tokens:
                turns.append(turn)
                return result("max_tokens")
            action = parse_action(self.chat.decode(generation.output_ids))
            if action.kind == "submit":
                turns.append(turn)
                return result("submitted")
            observation = FORMAT_ERROR
            if action.command is not None:
                timeout = min(per_command, deadline.remaining())
                if timeout <= 0:
                    turns.append(dataclasses.replace(turn, command=action.command))
                    return result("wall_time")
                waited = time.monotonic()
                try:
                    executed = await sandbox.exec(action.command, timeout_s=timeout, cwd=task.environment.workdir)
                except SandboxCrashedError as exc:
                    if not exc.caused_by_sandbox:
                        raise
                    # The policy's command brought the sandbox down: keep its tokens, to be trained as a failure.
                    turns.append(dataclasses.replace(turn, command=action.command))
                    ids, mask, logprobs = conv.ids, conv.mask, conv.logprobs
                    return AgentResult("error", turns, ids, mask, logprobs, prompt_len, exc.message, exc.error_code)
                shown = render(self.chat, executed, self.config.observation_tokens)
                observation = shown.text
                turn = dataclasses.replace(
                    turn,
                    command=action.command,
                    exit_code=executed.exit_code,
                    timed_out=executed.timed_out,
                    output_truncated=shown.truncated,
                    command_s=executed.duration_s,
                    sandbox_wait_s=time.monotonic() - waited,
                )
            stop: StopReason | None = None
            if index == budget.max_turns - 1:
                stop = "max_turns"
            elif deadline.expired:
                stop = "wall_time"
            if stop is None:
                added = ([] if closed else self.chat.close_ids()) + self.chat.observation_ids(observation)
                if len(conv) + len(added) >= budget.max_total_tokens:
                    stop = "max_tokens"
                else:
                    start = len(conv)
                    conv.add_context(added)
                    turn = dataclasses.replace(turn, observation_start=start, observation_end=len(conv))
            if stop is not None:
                turns.append(turn)
                return result(stop)
            turns.append(turn)
        return result("max_turns")  # unreachable: the last turn returns above
