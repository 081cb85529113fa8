"""Test and demo harness, shipped in the wheel so that ``upgrade-agent demo`` runs from an install.

Nothing here is used by an upgrade or a recovery; it only drives the real CLI from outside:

- :mod:`~agent.testing.sandbox`: a private, real systemd (PID 1 of its own namespaces), ``python -m
  agent.testing.sandbox -- CMD`` (the real-systemd tests, the end-to-end benchmark, the demo);
- :mod:`~agent.testing.releases`: reproducible release archives of a sample agent, and a loopback HTTP
  server for them;
- :mod:`~agent.testing.sample_agent`: the sample host daemon those archives hold (a script, baked with
  its version and behaviour);
- :mod:`~agent.testing.demo`: ``upgrade-agent demo`` (``make demo``).
"""
