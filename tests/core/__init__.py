"""Tests of upgrade_core: lifecycle, fold, decide, health, orchestrator, crash injection."""
