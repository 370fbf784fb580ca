"""The Harbor environment reads a task's Dockerfile with sandrl's parser (sandrl.images.dockerfile),
in Harbor's own Python (where sandrl is installed without its dependencies)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..harbor_venv import harbor_venv

SANDRL_USED = {"sandrl", "sandrl.errors", "sandrl.images", "sandrl.images.dockerfile"}
"""The sandrl modules sandrl-harbor imports: scripts/harbor-env.sh reinstalls sandrl when one of
them changes, so a new one must join its list there too."""

PROBE = r"""
import json, sys, tempfile
from pathlib import Path

import sandrl_harbor
from sandrl.errors import ImageBuildError
from sandrl.images.dockerfile import key_values
from sandrl_harbor.dockerfile import DockerfileError, copy_sources, parse

out = {"modules": sorted(m for m in sys.modules if m == "sandrl" or m.startswith("sandrl."))}
plan = parse("# escape=`\nFROM host\nRUN echo \\\nWORKDIR '/a b'\nENV A='$HOME' B=${HOME:+set}\n", "Df")
out["steps"] = [[s.keyword, s.args] for s in plan.steps]
out["env"] = key_values(plan.steps[2], {"HOME": "/root"})
context = Path(tempfile.mkdtemp())
(context / "x y").write_text("")
(copy,) = parse('FROM host\nCOPY ["x y", "/dst/"]\n').steps
out["copy"] = [[p.name for p in copy_sources(copy, context, {})[0]], copy_sources(copy, context, {})[1]]
errors = []
for text in ("FROM host\nRUN <<EOF\necho\nEOF\n", "FROM host\nRUN echo \\\n"):
    try:
        parse(text, "Df")
    except (DockerfileError, ImageBuildError) as exc:
        errors.append([type(exc).__name__, str(exc)])
out["errors"] = errors
print(json.dumps(out))
"""


def test_the_harbor_environment_reads_dockerfiles_as_sandrl_does() -> None:
    python = Path(harbor_venv()) / "bin" / "python"
    r = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["modules"]) == SANDRL_USED
    # Under "# escape=`" a backslash joins nothing; quotes and ${VAR:+x} follow Docker's rules.
    assert out["steps"] == [["RUN", "echo \\"], ["WORKDIR", "'/a b'"], ["ENV", "A='$HOME' B=${HOME:+set}"]]
    assert out["env"] == [["A", "$HOME"], ["B", "set"]]
    assert out["copy"] == [["x y"], "/dst/"]
    assert out["errors"] == [
        [
            "DockerfileError",
            "Df:2: heredocs (<<EOF) are not applied by the sandrl environment; put the script in a file of the "
            "build context and COPY it",
        ],
        ["ImageBuildError", "Df:2: the instruction's last line ends with '\\\\' (a continuation)"],
    ]
