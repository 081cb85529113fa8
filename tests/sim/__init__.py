"""A simulated host for the orchestrator crash-injection tests (SPEC 8)."""
