"""CLI agents in task images: Claude Code and Codex, fetched from npm at their pinned versions (into sandrl's
cache, kept between test runs), laid over a built-in task's image, run in its sandbox; images they cannot
run in, and agents that are not there, refused in one line naming the fix."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, ImageBuildError
from sandrl.inference.gateway import Gateway
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout.agents.cli import CLI_AGENTS, CliAgent, CliAgentsConfig, cli_install
from sandrl.rollout.agents.cli.config import CLAUDE_CODE_VERSION, CODEX_VERSION
from sandrl.rollout.agents.cli.install import AgentImages
from sandrl.rollout.images import TaskImages
from sandrl.rollout.runner import RolloutRunner, RunnerConfig
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig

from .conftest import ScriptedPolicy as _Scripted


@dataclass
class ScriptedPolicy(_Scripted):
    """The scripted policy with what a gateway needs of a policy: its tokenizer and context."""

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    @property
    def max_context(self) -> int:
        return 1 << 20


VERSIONS = {"claude-code": CLAUDE_CODE_VERSION, "codex": CODEX_VERSION}


@pytest.mark.parametrize("name", sorted(CLI_AGENTS))
async def test_the_pinned_cli_runs_in_a_builtin_tasks_sandbox(
    name: str, builtin_tasks: list[Task], provider: BwrapProvider
) -> None:
    install = cli_install(name, CliAgentsConfig())
    await install.prepare()  # from npm the first time, from sandrl's cache after
    task = builtin_tasks[0]
    images = AgentImages(install, TaskImages(provider), provider)
    image = await images(task)
    assert await images(task) == image  # made and checked once per task image
    base = await TaskImages(provider)(task)
    assert provider.images.meta(image)["base"] == base  # a record over the task's image, not a copy of it
    async with await provider.create(task.to_sandbox_spec(image=image)) as sandbox:
        exe = f"/opt/sandrl/agents/{name}-{VERSIONS[name]}/{CLI_AGENTS[name].executable}"
        result = await sandbox.exec(f"{exe} --version && cat /workspace/app.conf >/dev/null", timeout_s=60)
        assert result.exit_code == 0 and VERSIONS[name] in result.stdout, result.stderr
    # A second task image shares the agent's layer: one more record, no more copies.
    other = await AgentImages(install, TaskImages(provider), provider)(builtin_tasks[1])
    assert provider.images.meta(other)["layers"] == provider.images.meta(image)["layers"]


def rootfs(tmp_path: Path, name: str, sh: bytes | None) -> Path:
    root = tmp_path / name
    (root / "usr").mkdir(parents=True)
    (root / "bin").mkdir()
    if sh is not None:
        (root / "bin" / "sh").write_bytes(sh)
        os.chmod(root / "bin" / "sh", 0o755)
    return root


AARCH64_ELF = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHI", 2, 183, 1) + bytes(40)
"""The head of an arm64 executable: what a task image built for another CPU holds."""


@pytest.mark.parametrize(
    ("image", "sh", "said"),
    [("cli-no-shell", None, "No such file or directory"), ("cli-other-cpu", AARCH64_ELF, "Exec format error")],
    ids=["no-shell", "other-cpu"],
)
async def test_an_image_the_cli_cannot_run_in_is_refused_in_one_line(
    image: str, sh: bytes | None, said: str, tmp_path: Path, provider: BwrapProvider, echo_task: Task
) -> None:
    provider.images.add_rootfs(image, rootfs(tmp_path, image, sh))
    install = cli_install("codex", CliAgentsConfig())
    await install.prepare()

    async def task_image(task: Task) -> str:
        return image

    with pytest.raises(ImageBuildError) as caught:
        await AgentImages(install, task_image, provider)(echo_task)
    message = caught.value.message
    assert f"codex {CODEX_VERSION} cannot run in the image {image}" in message and said in message
    assert "it needs Linux on x86-64 or arm64" in message and "/bin/sh" in message and "\n" not in message


async def test_an_image_whose_opt_is_a_link_is_refused_rather_than_hidden(
    tmp_path: Path, provider: BwrapProvider, echo_task: Task
) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink("usr/local", linked / "opt")
    image = "cli-opt-link"
    provider.images.add_image(image, [provider.images.add_layer(linked)], base="host")

    async def task_image(task: Task) -> str:
        return image

    with pytest.raises(ImageBuildError, match="its /opt is a link"):
        await AgentImages(cli_install("codex", CliAgentsConfig()), task_image, provider)(echo_task)


async def test_an_episode_on_such_an_image_is_an_infra_error_not_retried(
    tmp_path: Path, provider: BwrapProvider, echo_task: Task
) -> None:
    """Through the runner: the agent's image is made per task (RolloutRunner asks the agent), and a
    task whose image it cannot run in is a broken environment, not the policy's failure."""
    provider.images.add_rootfs("cli-no-shell-2", rootfs(tmp_path, "noshell", None))
    install = cli_install("claude-code", CliAgentsConfig())
    policy = ScriptedPolicy(["unused"])
    agent = CliAgent(install, CliAgentsConfig(), Gateway(policy, model_name="m"), "http://127.0.0.1:9")  # type: ignore[arg-type]

    async def task_image(task: Task) -> str:
        return "cli-no-shell-2"

    runner = RolloutRunner(provider, agent, image_for=task_image, config=RunnerConfig(group_size=2, max_attempts=3))
    result = await runner.run([echo_task])
    statuses = {(t.status, t.error.error_code if t.error else None) for t in result.trajectories}
    assert statuses == {("infra_error", "image_build_failed")}
    assert all(t.attempt == 1 and not t.retried_errors for t in result.trajectories)
    assert "its /bin/sh did not run" in result.trajectories[0].error.message  # type: ignore[union-attr]
    assert not policy.calls


def test_an_agent_that_is_not_there_names_the_ones_that_are() -> None:
    with pytest.raises(ConfigError) as caught:
        RolloutConfig(agent="claude")
    message = caught.value.message
    assert "claude-code" in message and "codex" in message and "module:function" in message and "'claude'" in message


async def test_a_provider_that_cannot_lay_the_cli_is_refused_before_any_episode(echo_task: Task) -> None:
    from sandrl.sandbox.remote.provider import RemoteProvider

    remote = RemoteProvider.__new__(RemoteProvider)  # only its kind matters: nothing is sent
    with pytest.raises(ConfigError, match=r'local bubblewrap sandboxes \(\[rollout\] sandboxes = "local"\)'):
        AgentImages(cli_install("codex", CliAgentsConfig()), TaskImages(remote), remote)
