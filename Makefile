# Every target bootstraps .venv itself (idempotent), so each works as the only command typed on a clean clone.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp
# `make demo` needs the project alone (no test tools): its own, lighter set-up
DEMO_STAMP := $(VENV)/.stamp-demo
# `make install`: where the tool goes on a classic host (its own venv, off the checkout and off /usr)
PREFIX ?= /opt/upgrade-core

.PHONY: demo test test-long lint bench mutants mutation clean install bundle cli-docs ansible-sanity

$(STAMP): pyproject.toml scripts/bootstrap.sh
	@./scripts/bootstrap.sh

$(DEMO_STAMP): pyproject.toml scripts/bootstrap.sh
	@./scripts/bootstrap.sh --demo

demo: $(DEMO_STAMP)
	@$(PY) -m agent.cli demo

# the real kube-apiserver and etcd of the Kubernetes tests: built from source once (about 8 minutes on 2 cores),
# then cached outside the checkout (tests/kube/realserver.py)
test: $(STAMP)
	@scripts/kube-real build
	@$(PY) -m tests.runner

test-long: $(STAMP)
	@scripts/kube-real build
	@UPGRADE_CORE_LONG=1 $(PY) -m tests.runner

lint: $(STAMP)
	$(VENV)/bin/ruff check upgrade_core journal agent tests benchmarks examples ansible scripts
	$(VENV)/bin/mypy
	@# the Ansible collection imports itself as ansible_collections.upgrade_core.fleet, rooted at ansible/
	MYPYPATH=ansible $(VENV)/bin/mypy --explicit-package-bases -p ansible_collections.upgrade_core.fleet

bench: $(STAMP)
	@$(PY) -m benchmarks

mutants: $(STAMP)
	@$(PY) -m tests.mutants

# mutmut over the pure core (docs/mutation.md); slow, so not part of `make test`; work files in .mutation/
mutation: $(STAMP)
	@$(PY) scripts/mutation.py

# docs/install.md: the wheel built from this checkout, in a venv at PREFIX (scripts/install_prefix.sh)
install: $(STAMP)
	@EXTRAS="$(EXTRAS)" ./scripts/install_prefix.sh "$(PREFIX)"

# the self-contained runtime (PyInstaller one-folder, tar.gz) into dist/; cached in .cache/bundle
bundle: $(STAMP)
	@$(PY) scripts/build_bundle.py --dist dist

# the man page and bash/zsh completions, generated from the parser (scripts/cli_docs.py) into build/cli-docs
cli-docs: $(STAMP)
	@$(PY) scripts/cli_docs.py build/cli-docs

# ansible-test sanity for the collection under ansible/ (scripts/ansible_sanity.py says what it needs)
ansible-sanity: $(STAMP)
	@$(PY) scripts/ansible_sanity.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache .mutation
