#!/usr/bin/env bash
# Idempotent set-up of .venv from a clean clone on a fresh Debian.
# Installs what a fresh machine may lack (python3-venv, systemd, curl, util-linux tools), then the project
# with its test extra. Re-running it is cheap: pip only acts when pyproject.toml changed (see Makefile stamp).
# `--demo` (make demo): only what the demo needs, the project without its test tools, and systemd and
# unshare from the distribution.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
demo=0
[ "${1:-}" = --demo ] && demo=1

need_apt=()
"$PY" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ "$demo" = 0 ]; then
# `make install` (tests/cli/test_install_prefix.py) makes its venv with the distribution's interpreter
if [ ! -x /usr/bin/python3 ]; then
    need_apt+=(python3 python3-venv)
elif ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
    need_apt+=(python3-venv)
fi
command -v curl >/dev/null || need_apt+=(curl)
command -v zstd >/dev/null || need_apt+=(zstd)
# tests/agent_fetch/test_formats.py makes archives with the publishers' own tools
command -v pigz >/dev/null || need_apt+=(pigz)
command -v xz >/dev/null || need_apt+=(xz-utils)
command -v bzip2 >/dev/null || need_apt+=(bzip2)
command -v tar >/dev/null || need_apt+=(tar)
command -v openssl >/dev/null || need_apt+=(openssl)
# tests/agent_fetch/test_signatures.py signs releases with the publishers' own tool
command -v minisign >/dev/null || need_apt+=(minisign)
# tests/cli/test_ignition*.py check and apply `upgrade-agent ignition` configs with Debian's real Ignition
{ [ -x /usr/bin/ignition-validate ] && [ -x /usr/lib/dracut/modules.d/30ignition/ignition ]; } || need_apt+=(ignition)
fi
{ [ -x /usr/lib/systemd/systemd ] || [ -x /lib/systemd/systemd ]; } || need_apt+=(systemd)
command -v unshare >/dev/null || need_apt+=(util-linux)
if [ "$demo" = 0 ]; then
# tests/systemd/test_first_boot.py compiles its native sample daemon (a host with no Python runs it)
command -v cc >/dev/null || need_apt+=(gcc)
[ -e /usr/include/stdio.h ] || need_apt+=(libc6-dev)
command -v script >/dev/null || need_apt+=(bsdutils)
# tests/cli/test_cli_docs.py parses the generated zsh completion with zsh itself
command -v zsh >/dev/null || need_apt+=(zsh)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bootstrap: installing ${need_apt[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "bootstrap: missing ${need_apt[*]}; install them (as root: apt-get install ${need_apt[*]})" >&2
        exit 2
    fi
fi

# One line for a person; pip's own output (index warnings, build notes) goes to .venv/bootstrap.log and is
# shown only when a step fails.
if [ "$demo" = 1 ]; then
    what="the project alone, for the demo (about a minute the first time)" target=. stamps=.venv/.stamp-demo
else
    what="the project and its test tools (about 2 minutes the first time)" target='.[test,kubernetes]'
    stamps=".venv/.stamp .venv/.stamp-demo"  # the test extra includes everything the demo needs
fi
if [ -x .venv/bin/python ]; then
    echo "bootstrap: updating .venv with $what" >&2
else
    echo "bootstrap: creating .venv with $what" >&2
    "$PY" -m venv .venv
fi
log=.venv/bootstrap.log
if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
       .venv/bin/python -m pip install -q --disable-pip-version-check -e "$target"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "bootstrap: pip failed; the whole log is $log" >&2
    exit 1
fi
# shellcheck disable=SC2086  # a list of files on purpose
touch $stamps
