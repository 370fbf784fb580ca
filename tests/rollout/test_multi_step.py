"""Harbor multi-step tasks run as Harbor runs them: each step's setup, agent and verifier before the next's.

The task is built here in Harbor's format, shaped like Harbor's cookbook task ``hello-multi-step-full``:
step 1 makes ``greet.sh`` print ``hello``, step 2 rewrites it to greet the name in ``config.txt`` (so
step 1's check fails once step 2 is done), step 3 documents it. Verifying every step after the last
agent, as sandrl did, scores the oracle 0 here.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import (
    AgentResult,
    Budget,
    EpisodeConfig,
    LLMAgent,
    LLMAgentConfig,
    NullAgent,
    OracleAgent,
    Trajectory,
    run_episode,
)
from sandrl.rollout.agents.formats import FENCED_SYSTEM_PROMPT, TOOLS_SYSTEM_PROMPT
from sandrl.rollout.agents.tools import SANDBOX_TOOLS
from sandrl.rollout.multi_step import after
from sandrl.rollout.trajectory import Turn
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task, load_harbor_task
from sandrl.wiring import RolloutConfig, open_agent

from .conftest import ScriptedPolicy, bash

TASK_TOML = """\
schema_version = "1.4"
artifacts = ["/app/greet.sh", "/app/build.log"]

[task]
name = "sandrl/greeter"

[environment]
allow_internet = false
workdir = "/app"

[[steps]]
name = "scaffold"
min_reward = 1.0
[steps.agent]
timeout_sec = 60.0

[[steps]]
name = "implement"
min_reward = 0.5
[steps.verifier.env]
EXPECTED = "Hello, Harbor!"
[steps.healthcheck]
command = "test -x /app/greet.sh"
interval_sec = 0.1
retries = 2

[[steps]]
name = "document"
artifacts = ["/app/README.md"]
"""

FILES = {
    "environment/Dockerfile": "FROM host\nWORKDIR /app\n",
    # Shared by every step's test.sh, as the cookbook's tests/helpers.sh is; each verdict is logged in
    # order outside /tests and /logs/verifier, so the next step's agent can see which verifiers ran.
    "tests/helpers.sh": (
        'verdict() { echo "$1" > /logs/verifier/reward.txt; echo "$STEP=$1" >> /var/tmp/verdicts; exit 0; }\n'
    ),
    "steps/scaffold/instruction.md": "Write /app/greet.sh, an executable script printing `hello`.\n",
    "steps/scaffold/solution/solve.sh": "printf '#!/bin/bash\\necho hello\\n' > /app/greet.sh\nchmod +x greet.sh\n",
    "steps/scaffold/tests/test.sh": (
        "#!/bin/bash\nSTEP=scaffold; source /tests/helpers.sh\n"
        '[ "$(/app/greet.sh 2>/dev/null)" = hello ] && verdict 1; verdict 0\n'
    ),
    "steps/implement/instruction.md": "Make /app/greet.sh print `Hello, <name>!` for the name in /app/config.txt.\n",
    "steps/implement/workdir/config.txt": "Harbor  \n",
    # Harbor's setup hook: runs in the working directory before the agent, and removes itself.
    "steps/implement/workdir/setup.sh": (
        'tr -d "[:space:]" < config.txt > name && mv name config.txt\n'
        "mkdir -p /logs/artifacts && echo ran > /logs/artifacts/setup.txt\n"
        'rm -- "$0"\n'
    ),
    "steps/implement/solution/solve.sh": (
        "printf '#!/bin/bash\\necho \"Hello, $(cat /app/config.txt)!\"\\n' > /app/greet.sh\nchmod +x /app/greet.sh\n"
    ),
    "steps/implement/tests/test.sh": (
        "#!/bin/bash\nSTEP=implement; source /tests/helpers.sh\n"
        '[ "$(/app/greet.sh)" = "$EXPECTED" ] || verdict 0\n'
        'echo World > /app/config.txt; [ "$(/app/greet.sh)" = "Hello, World!" ] && verdict 1; verdict 0\n'
    ),
    "steps/document/instruction.md": "Write /app/README.md, titled `# greet.sh`.\n",
    "steps/document/solution/solve.sh": "printf '# greet.sh\\nReads config.txt.\\n' > /app/README.md\n",
    "steps/document/tests/test.sh": (
        "#!/bin/bash\nSTEP=document; source /tests/helpers.sh\n"
        "grep -qx '# greet.sh' /app/README.md && verdict 1; verdict 0\n"
    ),
}


def greeter(root: Path, **replace: str) -> Task:
    """The task, written in Harbor's format under ``root``; ``replace`` swaps a file's text."""
    task_dir = root / "greeter"
    for name, text in {"task.toml": TASK_TOML, **FILES, **replace}.items():
        path = task_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_harbor_task(task_dir)


def steps_of(t: Trajectory) -> list[dict[str, object]]:
    steps = t.verifier["details"]["steps"]
    assert isinstance(steps, list)
    return steps


async def test_the_oracle_scores_1_with_each_step_verified_after_its_own(
    provider: BwrapProvider, tmp_path: Path
) -> None:
    task = greeter(tmp_path)
    t = await run_episode(task, provider, OracleAgent())
    assert (t.status, t.reward, t.passed, t.error) == ("completed", 1.0, True, None)
    steps = steps_of(t)
    assert [(s["step"], s["reward"]) for s in steps] == [("scaffold", 1.0), ("implement", 1.0), ("document", 1.0)]
    # One trajectory: a turn per step (each step's solution), its span recorded on the step.
    assert [turn.command for turn in t.turns] == ["bash /solution/solve.sh"] * 3
    assert [turn.index for turn in t.turns] == [0, 1, 2]
    assert [s["agent"] for s in steps] == [{"stop_reason": "done", "turns": [k, k + 1]} for k in range(3)]
    # Artifacts per step, recorded after the step's agent: greet.sh as each step left it.
    greet = [next(a for a in s["artifacts"] if a["path"] == "/app/greet.sh") for s in steps]  # type: ignore[union-attr]
    assert greet[0]["text"] == "#!/bin/bash\necho hello\n"
    assert greet[1]["text"] == greet[2]["text"] == '#!/bin/bash\necho "Hello, $(cat /app/config.txt)!"\n'
    paths = [[(a["path"], a.get("missing", False)) for a in s["artifacts"]] for s in steps]  # type: ignore[union-attr]
    assert paths == [
        [("/app/greet.sh", False), ("/app/build.log", True)],
        [("/app/greet.sh", False), ("/app/build.log", True), ("/logs/artifacts/setup.txt", False)],
        [
            ("/app/greet.sh", False),
            ("/app/build.log", True),
            ("/app/README.md", False),
            ("/logs/artifacts/setup.txt", False),
        ],
    ]
    readme = steps[2]["artifacts"][2]  # type: ignore[index]
    assert readme == {
        "path": "/app/README.md",
        "bytes": 29,
        "text": "# greet.sh\nReads config.txt.\n",
        "truncated": False,
    }
    assert t.verifier["details"]["rewards"] == {"reward": 1.0}
    assert t.timings.verifier_s > 0 and t.timings.setup_s > 0


async def test_the_llm_agent_gets_each_step_as_a_new_user_turn_of_one_conversation(
    provider: BwrapProvider, tmp_path: Path, tokenizer: ByteTokenizer
) -> None:
    task = greeter(tmp_path)
    policy = ScriptedPolicy(
        [
            bash("printf '#!/bin/bash\\necho hello\\n' > greet.sh && chmod +x greet.sh"),
            bash("submit"),
            # Step 2's agent: step 1's verifier has run, and its tests are gone; setup.sh ran and removed itself.
            bash("cat /var/tmp/verdicts; ls -A /tests | wc -l; ls; cat config.txt"),
            bash("printf '#!/bin/bash\\necho \"Hello, $(cat /app/config.txt)!\"\\n' > greet.sh"),
            bash("submit"),
            bash("echo '# greet.sh' > README.md"),
            bash("submit"),
        ]
    )
    t = await run_episode(task, provider, LLMAgent(tokenizer), policy=policy)
    assert (t.status, t.stop_reason, t.reward, t.error) == ("completed", "submitted", 1.0, None)
    t.check()
    # Token-exact: the ids are the chat template's rendering of the whole conversation, the steps'
    # instructions user turns of it in order.
    messages, open_turn = tokenizer.parse_messages(t.ids)
    assert not open_turn and tokenizer.encode_messages(messages) == t.ids
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant",
        "user", "assistant", "tool", "assistant", "tool", "assistant",
        "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert messages[0]["content"] == FENCED_SYSTEM_PROMPT
    assert [m["content"] for m in messages if m["role"] == "user"] == [s.instruction for s in task.steps]
    assert t.prompt_len == len(tokenizer.encode_messages(messages[:2], add_generation_prompt=True))
    assert t.segment_starts == [0] and sum(t.loss_mask) == sum(tu.output_end - tu.output_start for tu in t.turns)
    # Each step's first call sees the whole conversation so far: step 1's turns, then the new instruction.
    assert [len(call) for call in policy.calls] == [turn.output_start for turn in t.turns]
    assert policy.calls[2] == t.ids[: t.turns[2].output_start]
    assert t.turns[1].observation_end == t.turns[2].output_start  # the user turn follows step 1's last turn
    assert messages[7]["content"] == "exit code: 0\nstdout:\nscaffold=1\n0\nconfig.txt\ngreet.sh\nHarbor"
    steps = steps_of(t)
    assert [(s["step"], s["reward"]) for s in steps] == [("scaffold", 1.0), ("implement", 1.0), ("document", 1.0)]
    assert [s["agent"]["turns"] for s in steps] == [[0, 2], [2, 5], [5, 7]]  # type: ignore[index]


@pytest.mark.parametrize("fmt", ["fenced", "tools"])
async def test_a_step_that_ran_out_of_turns_goes_on_after_its_last_observation(
    provider: BwrapProvider, tmp_path: Path, tokenizer: ByteTokenizer, fmt: str
) -> None:
    """One turn per step: each step's command ran, its output was never appended (the budget ended the
    step there); the next step's user turn comes after it, and the ids are still the template's rendering."""
    task = greeter(tmp_path)
    commands = [
        "printf '#!/bin/bash\\necho hello\\n' > greet.sh && chmod +x greet.sh",
        "printf '#!/bin/bash\\necho \"Hello, $(cat /app/config.txt)!\"\\n' > greet.sh",
        "echo '# greet.sh' > README.md",
    ]
    if fmt == "fenced":
        replies = [bash(c) for c in commands]
    else:
        replies = [
            f'<tool_call>\n{{"name": "bash", "arguments": {{"command": {json.dumps(c)}}}}}\n</tool_call>'
            for c in commands
        ]
    agent = LLMAgent(tokenizer, LLMAgentConfig(format=fmt))  # type: ignore[arg-type]
    t = await run_episode(
        task, provider, agent, policy=ScriptedPolicy(replies), config=EpisodeConfig(Budget(max_turns=1))
    )
    assert (t.status, t.stop_reason, t.reward) == ("truncated", "max_turns", 1.0), t.error
    # Token-exact: the template's rendering of system, then per step its instruction, the reply and the
    # command's output (the observations read back from the ids: what the sandbox printed).
    parsed, open_turn = tokenizer.parse_messages(t.ids)
    roles = ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user", "assistant"]
    assert not open_turn and [m["role"] for m in parsed] == roles
    outputs = [m["content"] for m in parsed if m["role"] == "tool"]
    assert len(outputs) == 2 and all(o.startswith("exit code: 0") for o in outputs)
    system = TOOLS_SYSTEM_PROMPT if fmt == "tools" else FENCED_SYSTEM_PROMPT
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for k, step in enumerate(task.steps):
        messages += [{"role": "user", "content": step.instruction}, {"role": "assistant", "content": replies[k]}]
        messages += [{"role": "tool", "content": outputs[k]}] if k < 2 else []
    assert t.ids == tokenizer.encode_messages(messages, tools=SANDBOX_TOOLS if fmt == "tools" else None)
    assert t.loss_mask[-1] == 1  # the last step's last command ran; nothing follows the model's output


@dataclass
class StallingPolicy(ScriptedPolicy):
    """Replies in turn, but the call numbered ``stall_at`` takes ``stall_s``."""

    stall_at: int = 1
    stall_s: float = 10.0

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        if len(self.calls) == self.stall_at:
            self.calls.append(list(input_ids))
            await asyncio.sleep(self.stall_s)
        return await super().generate(input_ids, params)


async def test_a_step_whose_time_ran_out_mid_reply_goes_on_token_exact(
    provider: BwrapProvider, tmp_path: Path, tokenizer: ByteTokenizer
) -> None:
    """Step 1's wall time ends while the model answers its second turn: the ids then end with the first
    turn's observation and an open assistant prefix, which the next step's user turn must follow."""
    task = greeter(tmp_path)
    replies = [
        bash("printf '#!/bin/bash\\necho hello\\n' > greet.sh && chmod +x greet.sh"),
        bash("printf '#!/bin/bash\\necho \"Hello, $(cat /app/config.txt)!\"\\n' > greet.sh"),
        bash("submit"),
        bash("echo '# greet.sh' > README.md"),
        bash("submit"),
    ]
    policy = StallingPolicy([replies[0], "(never seen)", *replies[1:]], stall_at=1, stall_s=10.0)
    config = EpisodeConfig(Budget(max_turns=3, wall_time_s=2.0))
    t = await run_episode(task, provider, LLMAgent(tokenizer), policy=policy, config=config)
    assert (t.status, t.reward, t.error) == ("completed", 1.0, None)
    assert [s["agent"] for s in steps_of(t)] == [  # type: ignore[index]
        {"stop_reason": "wall_time", "turns": [0, 1]},
        {"stop_reason": "submitted", "turns": [1, 3]},
        {"stop_reason": "submitted", "turns": [3, 5]},
    ]
    messages, open_turn = tokenizer.parse_messages(t.ids)
    assert not open_turn and tokenizer.encode_messages(messages) == t.ids
    roles = ["system", "user", "assistant", "tool", "user", "assistant", "tool", "assistant", "user"]
    assert [m["role"] for m in messages] == [*roles, "assistant", "tool", "assistant"]
    assert [m["content"] for m in messages if m["role"] == "user"] == [s.instruction for s in task.steps]


async def test_a_step_below_min_reward_ends_the_episode(
    provider: BwrapProvider, tmp_path: Path, tokenizer: ByteTokenizer
) -> None:
    task = greeter(tmp_path)
    policy = ScriptedPolicy([bash("echo nothing"), bash("submit")])
    t = await run_episode(task, provider, LLMAgent(tokenizer), policy=policy)
    # Step 1 failed its min_reward: no further step's setup, agent or verifier ran; the roll-up is step 1's.
    assert (t.status, t.reward, t.passed) == ("completed", 0.0, False)
    assert len(policy.calls) == 2 and t.num_turns == 2
    assert [(s["step"], s["reward"], s.get("stopped")) for s in steps_of(t)] == [("scaffold", 0.0, True)]
    # The null agent on the same task: the same, without a model.
    t = await run_episode(task, provider, NullAgent())
    assert (t.reward, [s["step"] for s in steps_of(t)]) == (0.0, ["scaffold"])


async def test_a_later_steps_failing_healthcheck_scores_that_step_0(provider: BwrapProvider, tmp_path: Path) -> None:
    # Step 2's healthcheck needs what step 1 did not leave (a policy could do so): that step counts 0 and ends it.
    toml = TASK_TOML.replace('command = "test -x /app/greet.sh"', 'command = "test -f /app/greet.conf"')
    task = greeter(tmp_path, **{"task.toml": toml})
    t = await run_episode(task, provider, OracleAgent())
    steps = steps_of(t)
    assert [(s["step"], s["reward"]) for s in steps] == [("scaffold", 1.0), ("implement", 0.0)]
    assert "healthcheck failed 2 times in a row" in str(steps[1]["error"]) and steps[1]["stopped"]
    assert (t.status, t.reward, t.error, t.num_turns) == ("completed", 0.5, None, 1)


async def test_a_first_step_whose_setup_fails_is_the_tasks_failure(provider: BwrapProvider, tmp_path: Path) -> None:
    task = greeter(tmp_path, **{"steps/scaffold/workdir/setup.sh": "exit 3\n"})
    t = await run_episode(task, provider, OracleAgent())
    assert t.status == "infra_error" and t.reward is None and t.error is not None
    assert (t.error.phase, t.error.error_code) == ("setup", "step_setup_failed")
    assert "scaffold's workdir/setup.sh failed (exit 3)" in t.error.message


def test_a_fresh_run_per_step_is_a_new_segment() -> None:
    """An agent that cannot continue a conversation (a harness) runs each step afresh: its ids follow as a segment."""
    one = AgentResult("submitted", [Turn(0, "a", 2, 4, 2, observation_start=4, observation_end=4)], [1, 2, 3, 4])
    one.loss_mask, one.logprobs, one.prompt_len = [0, 0, 1, 1], [0.0, 0.0, -1.0, -1.0], 2
    two = AgentResult("done", [Turn(0, "b", 1, 2, 1, observation_start=2, observation_end=3)], [5, 6, 7])
    two.loss_mask, two.logprobs, two.prompt_len = [0, 1, 0], [0.0, -2.0, 0.0], 1
    both = after(one, two)
    assert (both.ids, both.loss_mask, both.segment_starts, both.prompt_len) == (
        [1, 2, 3, 4, 5, 6, 7],
        [0, 0, 1, 1, 0, 1, 0],
        [0, 4],
        2,
    )
    assert [(u.index, u.output_start, u.output_end, u.observation_end) for u in both.turns] == [
        (0, 2, 4, 4),
        (1, 5, 6, 7),
    ]
    assert both.stop_reason == "done" and after(None, two) is two


@dataclass
class ScriptedWithTokenizer(ScriptedPolicy):
    """The scripted policy with what a gateway needs of a policy: its tokenizer and context."""

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    @property
    def max_context(self) -> int:
        return 8192


async def test_a_harness_runs_each_step_as_a_session_of_its_own(provider: BwrapProvider, tmp_path: Path) -> None:
    pytest.importorskip("minisweagent", reason="the harness extra is not installed: pip install -e '.[harness]'")
    task = greeter(tmp_path)
    done = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    # Short commands: the byte-level tokens of a reply are bounded by the harness's per-turn limit.
    commands = [
        "echo echo hello>greet.sh;chmod +x greet.sh",
        done,
        "echo 'echo Hello, $(</app/config.txt)!'>greet.sh",
        done,
        "echo '# greet.sh'>README.md",
        done,
    ]
    calls = [
        f'<tool_call>\n{{"name": "bash", "arguments": {{"command": {json.dumps(c)}}}}}\n</tool_call>' for c in commands
    ]
    policy = ScriptedWithTokenizer(calls)
    async with open_agent(RolloutConfig(agent="mini-swe-agent"), policy) as agent:  # type: ignore[arg-type]
        t = await run_episode(task, provider, agent, policy=policy)  # type: ignore[arg-type]
    assert (t.status, t.stop_reason, t.reward, t.error) == ("completed", "submitted", 1.0, None)
    t.check()
    # Three sessions, three segments: each step's run starts from the harness's own prompt, its instruction in it.
    assert len(t.segment_starts) == 3 and [turn.index for turn in t.turns] == list(range(6))
    bounds = [*t.segment_starts, len(t.ids)]
    for k, step in enumerate(task.steps):
        segment = ByteTokenizer().decode(t.ids[bounds[k] : bounds[k + 1]])
        assert step.instruction.strip() in segment
        assert all(other.instruction.strip() not in segment for other in task.steps if other is not step)
    for turn, seen in zip(t.turns, policy.calls, strict=True):
        start = max(s for s in t.segment_starts if s <= turn.output_start)
        assert seen == t.ids[start : turn.output_start]  # each call saw exactly its segment so far
    assert [s["agent"]["turns"] for s in steps_of(t)] == [[0, 2], [2, 4], [4, 6]]  # type: ignore[index]
