"""The image builder for real, on small Dockerfiles over the host image."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import pytest

from sandrl.errors import ImageBuildError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import BuildOptions, ImageBuilder, StepEvent


def _context(tmp_path: Path, dockerfile: str, files: dict[str, str]) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(parents=True)
    for rel, text in files.items():
        path = ctx / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


async def _sh(provider: BwrapProvider, image: str, command: str, workdir: str = "/workspace") -> str:
    # The spec, not the image, says where commands run (as for tasks: Task.to_sandbox_spec).
    async with await provider.create(SandboxSpec(image=image, ttl_s=120, workdir=workdir)) as sandbox:
        result = await sandbox.exec(command)
    assert result.ok, result
    return result.stdout


APP = """\
FROM host
ARG GREETING=hello
ENV APP_HOME=/srv/app \\
    MODE="fast mode"
WORKDIR $APP_HOME
COPY app/ ./
COPY setup/ /tmp/setup/
RUN sh /tmp/setup/make.sh "$GREETING" && rm -rf /tmp/setup
RUN ["sh", "-c", "echo exec-form > exec.txt"]
CMD ["python3", "main.py"]
EXPOSE 8000
"""
FILES = {
    "app/main.py": "print('hi')\n",
    "app/lib/util.py": "X = 1\n",
    "setup/make.sh": 'echo "$1 $MODE" > greeting.txt\n',
}


async def test_build_then_all_cache_hits_then_invalidation(provider: BwrapProvider, tmp_path: Path) -> None:
    ctx = _context(tmp_path, APP, FILES)
    events: list[StepEvent] = []
    builder = ImageBuilder(provider, on_event=events.append)
    first = await builder.build(ctx / "Dockerfile")
    assert (first.built, first.cached) == (4, 0)
    assert first.workdir == "/srv/app" and first.env["MODE"] == "fast mode" and "GREETING" not in first.env
    out = await _sh(
        provider,
        first.image,
        "pwd; cat greeting.txt exec.txt; ls lib; test ! -e /tmp/setup && echo gone; stat -c %u main.py; echo $MODE",
        workdir="/srv/app",
    )
    assert out.split("\n")[:-1] == ["/srv/app", "hello fast mode", "exec-form", "util.py", "gone", "0", "fast mode"]

    start = time.monotonic()
    again = await builder.build(ctx / "Dockerfile")
    assert (again.built, again.cached, again.image) == (0, 4, first.image)
    assert time.monotonic() - start < 1.0, "a rebuild with nothing changed starts no sandbox"

    (ctx / "setup" / "make.sh").write_text('echo "$1 changed" > greeting.txt\n')
    events.clear()
    changed = await builder.build(ctx / "Dockerfile")
    statuses = [e.status for e in events if e.phase == "done" and e.instruction.keyword in ("COPY", "RUN")]
    assert statuses == ["cached", "built", "built", "built"], "the changed COPY and every step after it rebuild"
    assert changed.image != first.image
    assert (await _sh(provider, changed.image, "cat greeting.txt", "/srv/app")) == "hello changed\n"
    # A build argument changes the RUN steps' keys too.
    with_arg = await builder.build(ctx / "Dockerfile", options=BuildOptions(build_args={"GREETING": "hey"}))
    assert with_arg.cached == 2 and with_arg.built == 2
    assert (await _sh(provider, with_arg.image, "cat greeting.txt", "/srv/app")) == "hey changed\n"


async def test_copy_file_semantics_add_archive_shell_and_user(provider: BwrapProvider, tmp_path: Path) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        data = b"from the archive\n"
        info = tarfile.TarInfo("pkg/inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ctx = _context(
        tmp_path,
        "FROM host\n"
        "COPY one.txt /etc/renamed.conf\n"
        "COPY --chmod=700 one.txt two.txt /opt/many/\n"
        "COPY one.txt /workspace\n"
        "ADD bundle.tar.gz /opt/unpacked/\n"
        'SHELL ["/bin/bash", "-c"]\n'
        "RUN [[ -n $BASH_VERSION ]] && echo bash > /opt/shell.txt\n"
        "USER nobody\n"
        "RUN id -u > /tmp/whoami\n"
        "USER root\n",
        {"one.txt": "1\n", "two.txt": "2\n"},
    )
    (ctx / "bundle.tar.gz").write_bytes(archive.getvalue())
    result = await ImageBuilder(provider).build(ctx / "Dockerfile")
    out = await _sh(
        provider,
        result.image,
        "cat /etc/renamed.conf; stat -c %a /opt/many/two.txt; cat /workspace/one.txt; cat /opt/unpacked/pkg/inside.txt;"
        "cat /opt/shell.txt /tmp/whoami",
    )
    assert out.split("\n")[:-1] == ["1", "700", "1", "from the archive", "bash", "65534"]


async def test_failing_run_reports_its_step(provider: BwrapProvider, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM host\nWORKDIR /workspace\nRUN echo building; echo 'no such thing' >&2; exit 3\n", {})
    with pytest.raises(ImageBuildError) as info:
        await ImageBuilder(provider).build(ctx / "Dockerfile")
    message = str(info.value)
    assert "step 3/3" in message and "Dockerfile:3" in message and "exit code 3" in message
    assert "building" in message and "no such thing" in message


async def test_build_timeout(provider: BwrapProvider, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM host\nRUN sleep 30\n", {})
    start = time.monotonic()
    with pytest.raises(ImageBuildError, match="did not finish within 2 s"):
        await ImageBuilder(provider).build(ctx / "Dockerfile", options=BuildOptions(timeout_s=2))
    assert time.monotonic() - start < 15


HEREDOCS = (
    r"Dockerfile:2: RUN: heredocs \(<<EOF\) are not supported by sandrl's builder; put the script in a file and COPY it"
)


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM host\nRUN true\nONBUILD RUN x\nFOO bar\n", r"Dockerfile:4: FOO: is not an instruction"),
        ("FROM host\nCOPY --from=builder /a /b\n", r"Dockerfile:2: COPY: --from"),
        ("FROM host\nADD https://example.com/x.tar.gz /opt/\n", r"Dockerfile:2: ADD: .*is a URL"),
        ("FROM host\nCOPY missing.txt /opt/\n", r"Dockerfile:2: COPY: 'missing.txt' is not in the build context"),
        ("FROM host\nCOPY ../outside /opt/\n", r"Dockerfile:2: COPY: '../outside' is outside the build context"),
        ("FROM host AS a\nFROM a\n", r"Dockerfile:2: FROM: multi-stage"),
        (
            "FROM 127.0.0.1:9/python:3.11\n",
            r"Dockerfile:1: FROM: cannot pull '127.0.0.1:9/python:3.11'.*tried http://127",
        ),
        ("FROM scratch\n", r"Dockerfile:1: FROM: FROM scratch is not supported"),
        ("RUN true\n", r"has no FROM"),
        ("FROM host\nRUN --mount=type=cache,target=/x true\n", r"Dockerfile:2: RUN: the option --mount"),
        ("FROM host\nRUN <<EOF\necho\nEOF\n", HEREDOCS),
        ("FROM host\nRUN cat <<EOF > /x\nhi\nEOF\n", HEREDOCS),
    ],
)
async def test_unsupported_is_a_clear_error(
    provider: BwrapProvider, tmp_path: Path, dockerfile: str, message: str
) -> None:
    ctx = _context(tmp_path, dockerfile, {})
    with pytest.raises(ImageBuildError, match=message):
        await ImageBuilder(provider).build(ctx / "Dockerfile")


async def test_metadata_instructions_are_recorded(provider: BwrapProvider, tmp_path: Path) -> None:
    ctx = _context(
        tmp_path,
        'FROM host\nLABEL a=b\nEXPOSE 80\nVOLUME /data\nENTRYPOINT ["/bin/sh"]\nCMD ["-c", "true"]\n',
        {},
    )
    result = await ImageBuilder(provider).build(ctx / "Dockerfile", tag="meta-test")
    assert result.image == "meta-test" and result.steps == 6 and result.built == 0
    config = provider.images.meta("meta-test")["config"]
    assert isinstance(config, dict)
    assert config["cmd"] == ["-c", "true"] and config["entrypoint"] == ["/bin/sh"]
    assert config["exposed_ports"] == ["80/tcp"]
    assert [item["instruction"] for item in config["ignored"]] == ["LABEL", "VOLUME"]


async def test_runtime_config_follows_dockers_rules(provider: BwrapProvider, tmp_path: Path) -> None:
    """A base's ENTRYPOINT/CMD carry over; a new ENTRYPOINT drops the inherited CMD; shell forms use SHELL."""
    base = _context(tmp_path / "base", 'FROM host\nENTRYPOINT ["/e"]\nCMD ["c"]\nEXPOSE 80 53/udp\n', {})
    await ImageBuilder(provider).build(base / "Dockerfile", tag="rt-base")
    child = _context(tmp_path / "child", "FROM rt-base\nHEALTHCHECK --interval=5s CMD test -e /ok\n", {})
    await ImageBuilder(provider).build(child / "Dockerfile", tag="rt-child")
    config = provider.images.meta("rt-child")["config"]
    assert isinstance(config, dict)
    assert (config["entrypoint"], config["cmd"]) == (["/e"], ["c"])
    assert config["exposed_ports"] == ["80/tcp", "53/udp"] and config["healthcheck"] == ["CMD-SHELL", "test -e /ok"]
    reset = _context(tmp_path / "reset", "FROM rt-base\nENTRYPOINT exec /other\nHEALTHCHECK NONE\n", {})
    await ImageBuilder(provider).build(reset / "Dockerfile", tag="rt-reset")
    config = provider.images.meta("rt-reset")["config"]
    assert isinstance(config, dict)
    assert config["entrypoint"] == ["/bin/sh", "-c", "exec /other"] and "cmd" not in config
    assert "healthcheck" not in config
