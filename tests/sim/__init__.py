"""A simulated host for the orchestrator crash-injection tests (design §8)."""
