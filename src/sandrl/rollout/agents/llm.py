"""The model-driven agent: generate, act in the sandbox, observe, repeat; token-exact throughout.

One episode::

    ids = template(system prompt, task instruction[, tools]) + assistant prefix      loss mask 0
    loop:
        output = policy.generate(ids)                                              loss mask 1
        step = the action format's reading of the reply: a ```bash block, or tool calls
               (``submit`` finishes); the commands run in the sandbox
        ids += [closing token] + the template's continuation: observation / tool
               results and the next assistant prefix                               loss mask 0

The model's ids are appended exactly as the server returned them, with its log-probs; what
follows them is rendered once by :class:`~sandrl.inference.chat.ChatFormat` from the
parsed reply and the new messages, and never re-tokenized afterwards. So the training ids are
exactly the ids the model saw and produced, for any chat template (Qwen3's, which re-renders
earlier turns, included: earlier turns are never re-rendered). A budget reached at turn k ends
the episode at turn k: the last command still runs (its effect is verified) but nothing is
appended after the model's last tokens, so the ids end with the model's last output.

A Harbor multi-step task's next step goes on with the same conversation (:meth:`LLMAgent.resume`):
the ids after the model's last turn (loss mask 0: its observation and the assistant prefix, when they
were appended) are rendered again, by the same :meth:`~sandrl.inference.chat.ChatFormat.append_ids`,
from the messages the format put after that turn followed by the step's instruction as a user
message. Nothing the model produced is re-tokenized; the ids stay one sequence, the template's
rendering of the whole conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.chat import ChatFormat
from sandrl.inference.tokenizer import Message, Tokenizer
from sandrl.rollout.agent import AgentResult, Budget, Deadline
from sandrl.rollout.agents.formats import FORMATS, AgentFormat, StepLimits, make_format
from sandrl.rollout.trajectory import StopReason, Turn
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.task import Task


@dataclass(frozen=True)
class LLMAgentConfig:
    """How the model-driven agent samples, acts, observes and runs commands."""

    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0, max_new_tokens=512))
    """Sampling of each turn; ``max_new_tokens`` is the per-turn limit (the total budget caps it further)."""
    observation_tokens: int = 1024
    """Most tokens of stdout plus stderr shown per command (head and tail kept)."""
    command_timeout_s: float = 60.0
    """Per-command timeout, further capped by the agent's remaining wall time. A task can set its own
    with ``[agent] command_timeout_sec`` in task.toml."""
    system_prompt: str | None = None
    """None: the format's own (:data:`~sandrl.rollout.agents.formats.FENCED_SYSTEM_PROMPT` or the tools one)."""
    observation_role: str = "tool"
    """The role of the observation message in ``fenced`` format (``tools`` answers each call with a tool message)."""
    format: AgentFormat = "fenced"
    """``fenced``: one ```bash block per reply; ``tools``: tool calls (bash, write_file, edit_file, submit)."""
    tool_parser: str | None = None
    """The tool-call parser (``hermes``, ``glm45``, ``llama3_json``); None: detected from the chat template."""
    tools: tuple[str, ...] | None = None
    """The sandbox tools offered in ``tools`` format (bash, write_file, edit_file, submit); None: all.
    A small model with a short context may be offered ``bash`` alone."""

    def __post_init__(self) -> None:
        if self.observation_tokens < 16:
            raise ConfigError(f"observation_tokens must be >= 16, got {self.observation_tokens}")
        if self.command_timeout_s <= 0:
            raise ConfigError(f"command_timeout_s must be positive, got {self.command_timeout_s}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown agent format {self.format!r}: use one of {', '.join(FORMATS)}")


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

    @classmethod
    def of(cls, result: AgentResult, end: int) -> _Conversation:
        """``result``'s conversation up to ``end``."""
        conv = cls([])
        conv.ids, conv.mask, conv.logprobs = result.ids[:end], result.loss_mask[:end], result.logprobs[:end]
        return conv

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


@dataclass
class _ResumePoint:
    """Where the conversation goes on from (:meth:`LLMAgent.resume`): right after the model's last turn, whose
    parsed message and following messages (its observation, and the user turns given since) are rendered
    again with the next user message. Before any model turn: the opening messages, rendered again."""

    opening: list[Message]
    end: int = 0
    """``len(ids)`` at the end of the model's last output; 0 before any."""
    output_ids: list[int] = field(default_factory=list)
    assistant: Message | None = None
    pending: list[Message] = field(default_factory=list)


class LLMAgent:
    """Drives a policy through a task; see the module docstring."""

    name = "llm"

    def __init__(self, tokenizer: Tokenizer, config: LLMAgentConfig | None = None) -> None:
        self.config = config or LLMAgentConfig()
        self.format = make_format(
            self.config.format,
            tokenizer,
            tool_parser=self.config.tool_parser,
            observation_role=self.config.observation_role,
            system_prompt=self.config.system_prompt,
            tools=self.config.tools,
        )
        self.chat = ChatFormat(tokenizer, tools=self.format.tools)

    def opening(self, task: Task) -> list[Message]:
        return [{"role": "system", "content": self.format.system_prompt}, {"role": "user", "content": task.instruction}]

    def prompt_ids(self, task: Task) -> list[int]:
        return self.chat.prompt_ids(self.opening(task))

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        opening = self.opening(task)
        conv = _Conversation(self.chat.prompt_ids(opening))
        return await self._go_on(task, sandbox, policy, budget, conv, [], len(conv), _ResumePoint(opening))

    async def resume(
        self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget, previous: AgentResult
    ) -> AgentResult:
        """The next user turn: ``task``'s instruction after the model's last turn and the messages that followed
        it (what the ids already hold after that turn is rendered again, identically, with it)."""
        point = previous.resume_from
        if not isinstance(point, _ResumePoint):
            raise ConfigError("the llm agent can only go on with a conversation it ran itself")
        user: Message = {"role": "user", "content": task.instruction}
        turns = list(previous.turns)
        if point.assistant is None:
            # The model never answered: nothing trained is lost by rendering the opening again with the new turn.
            opening = [*point.opening, user]
            conv = _Conversation(self.chat.prompt_ids(opening))
            return await self._go_on(task, sandbox, policy, budget, conv, turns, len(conv), _ResumePoint(opening))
        added = self.chat.append_ids(point.output_ids, point.assistant, [*point.pending, user])
        after = dataclasses.replace(point, pending=[*point.pending, user])
        if point.end + len(added) >= budget.max_total_tokens:
            return dataclasses.replace(previous, stop_reason="max_tokens", resume_from=after)
        conv = _Conversation.of(previous, point.end)
        conv.add_context(added)
        last = turns[-1]
        turns[-1] = dataclasses.replace(last, observation_start=point.end, observation_end=len(conv))
        return await self._go_on(task, sandbox, policy, budget, conv, turns, previous.prompt_len, after)

    async def _go_on(
        self,
        task: Task,
        sandbox: Sandbox,
        policy: InferenceClient | None,
        budget: Budget,
        conv: _Conversation,
        turns: list[Turn],
        prompt_len: int,
        point: _ResumePoint,
    ) -> AgentResult:
        """Model turns from ``conv`` (which ends with an assistant prefix) until a stop; ``turns`` holds the
        conversation's earlier turns, ``point`` where it would go on from."""
        if policy is None:
            raise ConfigError("the llm agent needs a policy: pass --inference URL or --inference embedded")
        deadline = Deadline(budget.wall_time_for(task))
        first = len(turns)

        def result(stop: StopReason) -> AgentResult:
            done = AgentResult(stop, turns, conv.ids, conv.mask, conv.logprobs, prompt_len)
            done.resume_from = point
            return done

        if len(conv) >= budget.max_total_tokens:
            return result("max_tokens")
        limits = StepLimits(command_timeout(task, self.config.command_timeout_s), self.config.observation_tokens)
        for index in range(first, first + budget.max_turns):
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
            reply = self.chat.reply_text(generation.output_ids)
            closed = bool(generation.output_ids) and generation.output_ids[-1] in self.chat.stop_ids
            if not closed and len(conv) >= budget.max_total_tokens:
                turns.append(turn)
                point = _ResumePoint(
                    point.opening, len(conv), generation.output_ids, {"role": "assistant", "content": reply}
                )
                return result("max_tokens")
            step = await self.format.step(reply, task, sandbox, deadline, self.chat, limits)
            point = _ResumePoint(point.opening, len(conv), generation.output_ids, step.assistant, list(step.appended))
            turn = dataclasses.replace(
                turn,
                command=step.command,
                exit_code=step.exit_code,
                timed_out=step.timed_out,
                output_truncated=step.truncated,
                command_s=step.command_s,
                sandbox_wait_s=step.sandbox_wait_s,
                tool_calls=step.tool_calls,
            )
            if step.submitted:
                turns.append(turn)
                return result("submitted")
            if step.crashed is not None:
                # The policy's command brought the sandbox down: keep its tokens, to be trained as a failure.
                turns.append(turn)
                ids, mask, logprobs = conv.ids, conv.mask, conv.logprobs
                exc = step.crashed
                return AgentResult("error", turns, ids, mask, logprobs, prompt_len, exc.message, exc.error_code)
            if step.out_of_time:
                turns.append(turn)
                return result("wall_time")
            stop: StopReason | None = None
            if index == first + budget.max_turns - 1:
                stop = "max_turns"
            elif deadline.expired:
                stop = "wall_time"
            if stop is None:
                added = self.chat.append_ids(generation.output_ids, step.assistant, step.appended)
                if len(conv) + len(added) >= budget.max_total_tokens:
                    stop = "max_tokens"
                else:
                    start = len(conv)
                    conv.add_context(added)
                    turn = dataclasses.replace(turn, observation_start=start, observation_end=len(conv))
            turns.append(turn)
            if stop is not None:
                return result(stop)
        return result("max_turns")  # unreachable: the last turn returns above
