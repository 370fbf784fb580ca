"""The task's side of a Harbor multi-step episode, step by step, as Harbor's ``MultiStepTrial`` runs it.

::

    for each step k (sandrl.rollout.multi_step drives the loop):
        prepare_step(task, k, sandbox)   /tests and /logs/verifier emptied (k > 0), workdir/ copied in,
                                         setup.sh run (step 1's in prepare_environment, so that a fork
                                         group shares it); check_step: the step's healthcheck
        the agent on step_task(task, k)  the step's instruction, timeout and solution (the oracle's)
        collect_artifacts(task, k, ...)  the step's artifacts, recorded (bounded)
        verify(step_task(task, k), ...)  the step's tests; its record; min_reward: stop?
    roll_up(task, records, ...)          mean (or final) over the verified steps

A step's setup or healthcheck that fails raises :class:`~sandrl.errors.TaskError`
(:mod:`sandrl.tasks.step_setup`); what that means for the episode is the rollout's to say.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from sandrl.sandbox.base import Sandbox
from sandrl.tasks.result import VerifyResult
from sandrl.tasks.task import Task
from sandrl.tasks.verify import reward_of

ARTIFACT_FILES = 32
"""Most files recorded per step (a directory's files count one each)."""
ARTIFACT_TEXT_BYTES = 4096
"""Most bytes of one file's text kept in the record."""
ARTIFACT_STEP_TEXT_BYTES = 16384
"""Most bytes of text kept per step (a trajectory is a training record: its artifacts stay small);
past it a file is recorded by path and size alone."""
_PROBE_TIMEOUT_S = 30.0


def step_task(task: Task, index: int) -> Task:
    """Step ``index`` of ``task`` as a single-step task: what its agent works on and its verifier judges."""
    step = task.steps[index]
    return dataclasses.replace(
        task,
        instruction=step.instruction,
        verifier=step.verifier,
        solution=step.solution,
        agent_timeout_s=step.agent_timeout_s,
        steps=(),
    )


async def collect_artifacts(task: Task, index: int, sandbox: Sandbox) -> list[dict[str, object]]:
    """Step ``index``'s artifacts as they are after its agent: per file its path, size and the start of its
    text (bounded: :data:`ARTIFACT_FILES` files, :data:`ARTIFACT_TEXT_BYTES` each and
    :data:`ARTIFACT_STEP_TEXT_BYTES` in all); a path that is not
    there is recorded as missing (Harbor's ``/logs/artifacts`` only when it has files)."""
    step = task.steps[index]
    if not step.artifacts:
        return []
    workdir = task.environment.workdir
    paths = " ".join(shlex.quote(p if p.startswith("/") else f"{workdir.rstrip('/')}/{p}") for p in step.artifacts)
    # One exec lists every file: "F<TAB>size<TAB>path" per file, "M<TAB>path" per missing source.
    script = (
        f"for p in {paths}; do "
        f'if [ -d "$p" ]; then find "$p" -type f 2>/dev/null | head -n {ARTIFACT_FILES}; '
        'elif [ -f "$p" ]; then printf "%s\\n" "$p"; else printf "M\\t%s\\n" "$p"; fi; done | '
        'while IFS= read -r f; do case "$f" in M"\t"*) printf "%s\\n" "$f";; '
        '*) [ -f "$f" ] && printf "F\\t%s\\t%s\\n" "$(wc -c < "$f")" "$f";; esac; done'
    )
    listed = await sandbox.exec(script, timeout_s=_PROBE_TIMEOUT_S, cwd="/")
    records: list[dict[str, object]] = []
    text_left = ARTIFACT_STEP_TEXT_BYTES
    for line in listed.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "M":
            if rest.rstrip("/") != "/logs/artifacts":
                records.append({"path": rest, "missing": True})
            continue
        size, _, path = rest.partition("\t")
        if kind != "F" or not size.strip().isdigit() or len(records) >= ARTIFACT_FILES:
            continue
        record: dict[str, object] = {"path": path, "bytes": int(size)}
        records.append(record)
        want = min(ARTIFACT_TEXT_BYTES, text_left)
        if want <= 0:
            continue
        head = await sandbox.exec(["head", "-c", str(want), "--", path], timeout_s=_PROBE_TIMEOUT_S, cwd="/")
        if head.exit_code == 0 and "\x00" not in head.stdout:
            record["text"] = head.stdout[:want]
            record["truncated"] = int(size) > want
            text_left -= len(head.stdout[:want].encode())
    return records


def step_record(name: str, result: VerifyResult) -> dict[str, object]:
    """What one verified step contributes to the trajectory's ``verifier["steps"]`` and to the roll-up."""
    found = result.details.get("rewards")
    rewards = dict(found) if isinstance(found, Mapping) else {"reward": result.reward}
    record: dict[str, object] = {"step": name, "reward": result.reward, "rewards": rewards}
    record["exit_code"] = result.exit_code
    if result.error:
        record["error"] = result.error
    return record


def below_min_reward(task: Task, index: int, record: Mapping[str, object]) -> bool:
    """Harbor's early stop: the step's verifier gave no reward, or a reward is below its ``min_reward``
    (a missing key counts as below)."""
    rewards = record.get("rewards")
    if not isinstance(rewards, Mapping) or record.get("error") is not None:
        return True
    thresholds = task.steps[index].min_reward or {}
    return any(rewards.get(key, -math.inf) < value for key, value in thresholds.items())


def roll_up(
    task: Task, records: Sequence[dict[str, object]], last: VerifyResult | None, *, duration_s: float
) -> VerifyResult | None:
    """The episode's verifier result from its steps' records (those with ``rewards`` were verified): the
    per-key mean over the verified steps, a key a step lacks counting 0 (``mean``), or the last verified
    step's (``final``); the reward is read from those rewards as a single-step task's is. None when no
    step was verified."""
    verified = [r["rewards"] for r in records if isinstance(r.get("rewards"), Mapping)]
    if not verified:
        return None
    per_step = [{str(k): float(v) for k, v in dict(r).items()} for r in verified if isinstance(r, Mapping)]
    if task.step_reward == "final":
        rolled = per_step[-1]
    else:
        keys = sorted({key for rewards in per_step for key in rewards})
        rolled = {key: sum(r.get(key, 0.0) for r in per_step) / len(per_step) for key in keys}
    reward, rule = reward_of(rolled, task.verifier.reward_key)
    error = None if reward is not None else f"the steps' rewards have no {task.verifier.reward_key!r}: {rule}"
    return VerifyResult(
        reward=reward if reward is not None else 0.0,
        passed=reward is not None and reward >= 1.0,
        duration_s=duration_s,
        details=MappingProxyType(
            {"steps": list(records), "rewards": rolled, "reward_rule": f"{task.step_reward} over the steps; {rule}"}
        ),
        stdout_tail=last.stdout_tail if last is not None else "",
        exit_code=last.exit_code if last is not None else None,
        timed_out=last.timed_out if last is not None else False,
        error=error,
        infra_error=error is not None,
    )
