# Every target bootstraps .venv itself (idempotent), so each works as the only command typed on a clean clone.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp

.PHONY: demo test test-long lint bench mutants clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	@./scripts/bootstrap.sh

demo: $(STAMP)
	@$(PY) -m agent.cli demo

test: $(STAMP)
	@$(PY) -m tests.runner

test-long: $(STAMP)
	@UPGRADE_CORE_LONG=1 $(PY) -m tests.runner

lint: $(STAMP)
	$(VENV)/bin/ruff check upgrade_core journal agent tests benchmarks examples ansible
	$(VENV)/bin/mypy
	@# the Ansible collection imports itself as ansible_collections.upgrade_core.fleet, rooted at ansible/
	MYPYPATH=ansible $(VENV)/bin/mypy --explicit-package-bases -p ansible_collections.upgrade_core.fleet

bench: $(STAMP)
	@$(PY) -m benchmarks

mutants: $(STAMP)
	@$(PY) -m tests.mutants

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
