"""Deliberately broken variants of upgrade_core; run with ``python -m tests.mutants``."""
