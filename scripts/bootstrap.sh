#!/usr/bin/env bash
# The one install script: Debian packages and the project's virtualenv. Idempotent:
# every step checks first, so `make test` on a set-up machine costs a second.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(bubblewrap debootstrap docker-registry skopeo umoci slirp4netns chromium gcc g++ libc6-dev musl-tools make git jq patch tar python3 python3-venv python3-pytest python3-yaml procps util-linux iproute2)
VENV=.venv
STAMP="$VENV/.sandrl-installed"

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    echo "bootstrap: installing Debian packages: ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bootstrap: creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when the project's dependency list, or the extras installed, changed.
EXTRAS="dev,train,cluster,harness,trackers"
want=$( (cat pyproject.toml && echo "extras: $EXTRAS") | sha256sum | cut -d' ' -f1)
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
    echo "bootstrap: installing Python packages into $VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # torch first and pinned, so nothing later pulls a CUDA build.
    "$VENV/bin/pip" install -q "torch==2.13.0"
    "$VENV/bin/pip" install -q -e ".[$EXTRAS]"
    echo "$want" >"$STAMP"
fi

# Host limits for many live sandboxes (`sandrl bench density --live 10000`): raised, never lowered,
# and skipped where /proc/sys is read-only (a container; its host decides).
raise_sysctl() { # NAME VALUE WHY
    local path="/proc/sys/${1//.//}" have
    have=$(cat "$path" 2>/dev/null) || return 0
    if ((have < $2)); then
        if echo "$2" >"$path" 2>/dev/null; then echo "bootstrap: $1 $have -> $2 ($3)"; else echo "bootstrap: cannot raise $1 ($have) to $2: $3" >&2; fi
    fi
}
if [[ $(id -u) -eq 0 ]]; then
    # Each idle sandbox is 2 processes (pid 1 and its monitor), 3 with the network (slirp4netns): the
    # default 32768 pids cap a host at ~15,000 idle sandboxes less everything else it runs.
    raise_sysctl kernel.pid_max 4194304 "2-3 processes per live sandbox"
    # Each sandbox makes two user namespaces (outer and inner, counted against root, who makes them)
    # and one each of mount, network, pid, ipc, uts and cgroup namespaces.
    for ns in user mnt net pid ipc uts cgroup; do
        raise_sysctl "user.max_${ns}_namespaces" 65536 "2 user namespaces and one of each other kind per live sandbox"
    done
fi
