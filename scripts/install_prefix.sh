#!/usr/bin/env bash
# `make install PREFIX=/opt/upgrade-core`: install upgrade-core on a classic host (one with Python), off the
# checkout, into its own virtual environment at PREFIX, so the units name PREFIX/bin/recover-agent-upgrade and
# the checkout can be moved or deleted afterwards (docs/install.md).
#
# Why a venv at the prefix and not `pip install` into the system: the host's /usr stays the distribution's
# (nothing of ours under /usr, no clash with Debian's python3-* packages), the dependencies are pinned to
# what this project was tested with, and removal is `rm -rf PREFIX` after `upgrade-agent uninstall`.
#
# Steps: copy the package sources into a scratch directory (so the checkout gets no build/ or egg-info),
# build the wheel there with the checkout venv's setuptools (`pip wheel --no-deps --no-build-isolation`),
# create PREFIX with $PYTHON (default /usr/bin/python3: the distribution's interpreter, a stable path; a
# venv made from a per-user Python such as pyenv's is refused by `install`), and install the wheel with
# its dependencies from the package index. Re-running upgrades the prefix in place.
#
# Usage: scripts/install_prefix.sh PREFIX   (environment: PYTHON, BUILD_PYTHON, PIP_ARGS, EXTRAS)
# Exit: 0 installed; 2 bad usage (no PREFIX, a relative PREFIX, PREFIX under /usr); 1 a step failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-}
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD_PYTHON=${BUILD_PYTHON:-.venv/bin/python}

if [ -z "$PREFIX" ]; then
    echo "install: PREFIX is required, e.g. make install PREFIX=/opt/upgrade-core" >&2
    exit 2
fi
case "$PREFIX" in
    /usr|/usr/*) echo "install: PREFIX=$PREFIX is under /usr; pick a prefix off /usr, e.g. /opt/upgrade-core" >&2
                 exit 2 ;;
    /*) ;;
    *) echo "install: PREFIX=$PREFIX must be an absolute path, e.g. /opt/upgrade-core" >&2; exit 2 ;;
esac
if [ ! -x "$PYTHON" ]; then
    echo "install: PYTHON=$PYTHON is not an executable; set PYTHON to a Python 3.11+ interpreter" >&2
    exit 2
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/src"
cp pyproject.toml README.md "$scratch/src/"
for package in upgrade_core journal agent; do
    cp -r "$package" "$scratch/src/$package"
done
find "$scratch/src" -name __pycache__ -prune -exec rm -rf {} +
"$BUILD_PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$scratch/wheel" "$scratch/src" >&2

"$PYTHON" -m venv "$PREFIX"
# shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
wheel=$(echo "$scratch"/wheel/*.whl)
# EXTRAS=kubernetes adds the operator's Kubernetes source (an optional extra: most hosts do not use it)
"$PREFIX/bin/python" -m pip install -q --disable-pip-version-check ${PIP_ARGS:-} "$wheel${EXTRAS:+[$EXTRAS]}" >&2
# pip's entry scripts import re to strip a Windows ".exe" from argv[0]: about 4 ms at every start, where the
# boot-time no-op recovery may cost about 6 ms more than `python -c pass` (design §9 recover.noop). Each is
# rewritten with pip's own interpreter line and the same call, without re (and again at every re-run).
for entry in upgrade-agent:main agent-upgrade:main_upgrade recover-agent-upgrade:main_recover; do
    script="$PREFIX/bin/${entry%%:*}"
    func=${entry#*:}
    { head -n 1 "$script"
      printf 'import sys\nfrom agent.cli.main import %s\n\nif __name__ == "__main__":\n    sys.exit(%s())\n' \
          "$func" "$func"
    } > "$script.lean"
    chmod 0755 "$script.lean"
    mv -f "$script.lean" "$script"
done
# the man page and the shell completions, generated from the parser by the checkout venv's tools
"$BUILD_PYTHON" scripts/cli_docs.py "$PREFIX" >/dev/null
echo "installed: $PREFIX/bin/upgrade-agent, $PREFIX/bin/recover-agent-upgrade, $PREFIX/bin/agent-upgrade"
echo "manual: man -l $PREFIX/share/man/man1/upgrade-agent.1 (or add $PREFIX/share/man to MANPATH); completions:"
echo "  $PREFIX/share/bash-completion/completions/upgrade-agent, $PREFIX/share/zsh/site-functions/_upgrade-agent"
