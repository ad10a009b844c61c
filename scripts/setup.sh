#!/usr/bin/env bash
# Make this machine ready for tflab: a Docker Engine, mmdebstrap, an ssh client, and
# tflab itself in .venv (with a Compose v2 binary). Idempotent; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
as_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
    if as_root && command -v apt-get >/dev/null; then
        [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    else
        say "please install: $* (Debian/Ubuntu: sudo apt-get install $*)"; exit 1
    fi
}

command -v docker >/dev/null || { say "installing the Docker Engine (docker.io)"; apt_install docker.io; }
if ! docker info >/dev/null 2>&1; then
    if as_root && command -v dockerd >/dev/null; then
        say "starting dockerd"
        (dockerd >/var/log/tflab-dockerd.log 2>&1 &)
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    fi
    docker info >/dev/null 2>&1 || { say "the Docker daemon is not running: start it (sudo systemctl start docker)"; exit 1; }
fi
command -v mmdebstrap >/dev/null || { say "installing mmdebstrap (for the registry-free base image)"; apt_install mmdebstrap; }
command -v ssh >/dev/null || { say "installing the ssh client"; apt_install openssh-client; }
for extra in "$@"; do
    command -v "$extra" >/dev/null || { say "installing $extra"; apt_install "$extra"; }
done

# The guard runs in nodes on Python 3.6 and later (TensorFlow 1.15's images): the tests run it under 3.6 too.
if ! ls "$HOME"/.pyenv/versions/3.6*/bin/python3.6 >/dev/null 2>&1 && ! command -v python3.6 >/dev/null; then
    if command -v pyenv >/dev/null || [ -x "$HOME/.pyenv/bin/pyenv" ]; then
        say "installing Python 3.6 for the guard's tests (pyenv install 3.6.15)"
        "$(command -v pyenv || echo "$HOME/.pyenv/bin/pyenv")" install -s 3.6.15 >/dev/null 2>&1 \
            || say "could not install Python 3.6: the guard's 3.6 tests will fail (install it with pyenv)"
    else
        say "no Python 3.6: the guard's 3.6 tests will fail (install pyenv, then: pyenv install 3.6.15)"
    fi
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || { say "tflab needs Python 3.11+ ($PYTHON is older); set PYTHON=python3.11"; exit 1; }
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || { say "installing python3-venv"; apt_install python3-venv; }
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import tflab, pytest, sklearn" 2>/dev/null || [ pyproject.toml -nt .venv/.tflab-installed ]; then
    say "installing tflab into .venv"
    # --no-compile: Python writes a module's bytecode when first imported; pip's compiling every module of
    # every package up front took 13 of the install's 32 s here
    .venv/bin/pip install -q --no-compile -e ".[compose,examples,test]"
    touch .venv/.tflab-installed
fi
say "ready: $(.venv/bin/tflab --help >/dev/null && echo tflab) $(docker version --format 'engine {{.Server.Version}}')"
