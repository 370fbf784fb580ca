#!/usr/bin/env bash
# Harbor's own virtualenv, with sandrl's Harbor environment (integrations/harbor) installed in it.
#
# Harbor needs Python >= 3.12 and sandrl supports 3.11, so Harbor lives in a virtualenv of its own,
# made with the first Python >= 3.12 found ($HARBOR_PYTHON, python3.13, python3.12, pyenv's). It is
# kept outside the checkout, keyed by the Python and Harbor versions:
#   ${SANDRL_HARBOR_VENV:-${XDG_CACHE_HOME:-~/.cache}/sandrl/harbor-venv/py<version>-harbor<version>}
# Idempotent: Harbor is installed once per key; sandrl-harbor again only when its sources change.
# The last line printed is the virtualenv's path.
#
#   scripts/harbor-env.sh                 # fails (exit 3) when no Python >= 3.12 exists
#   scripts/harbor-env.sh --if-possible   # says so and exits 0 instead (make test)
set -euo pipefail
cd "$(dirname "$0")/.."

HARBOR_VERSION=0.26.0
optional=false
[[ "${1:-}" == "--if-possible" ]] && optional=true

is_312() { [[ -n "$1" ]] && command -v "$1" >/dev/null 2>&1 && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }

python=""
for candidate in "${HARBOR_PYTHON:-}" python3.13 python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    if is_312 "$candidate"; then python=$(command -v "$candidate"); break; fi
done
if [[ -z "$python" ]]; then
    echo "harbor-env: no Python >= 3.12 here (Harbor needs one): install one, or point HARBOR_PYTHON at it" >&2
    $optional && exit 0
    exit 3
fi

pyver=$("$python" -c 'import platform; print(platform.python_version())')
venv=${SANDRL_HARBOR_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sandrl/harbor-venv/py$pyver-harbor$HARBOR_VERSION}
if [[ ! -f "$venv/.harbor-installed" ]]; then
    echo "harbor-env: installing harbor==$HARBOR_VERSION into $venv (Python $pyver; once)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "harbor==$HARBOR_VERSION"
    touch "$venv/.harbor-installed"
fi
# sandrl-harbor itself, and sandrl without its dependencies (sandrl-harbor reads Dockerfiles with
# sandrl's parser, sandrl.images.dockerfile, which imports only the standard library and
# sandrl.errors): reinstalled (without touching Harbor) whenever they change. Only the sandrl
# modules sandrl-harbor imports count (tests/integrations/test_harbor_dockerfile.py holds that list).
sandrl_used=(pyproject.toml src/sandrl/__init__.py src/sandrl/errors.py src/sandrl/images/__init__.py src/sandrl/images/dockerfile.py)
want=$({ find integrations/harbor -type f \( -name '*.py' -o -name '*.toml' \) -print0; printf '%s\0' "${sandrl_used[@]}"; } | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [[ ! -f "$venv/.sandrl-harbor" || "$(cat "$venv/.sandrl-harbor")" != "$want" ]]; then
    echo "harbor-env: installing sandrl (without its dependencies) and sandrl-harbor into $venv" >&2
    tmp=$(mktemp -d)
    mkdir "$tmp/sandrl" "$tmp/harbor"
    cp -r pyproject.toml README.md src "$tmp/sandrl"
    cp -r integrations/harbor/. "$tmp/harbor"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$tmp/sandrl" "$tmp/harbor"
    rm -rf "$tmp"
    echo "$want" >"$venv/.sandrl-harbor"
fi
echo "$venv"
