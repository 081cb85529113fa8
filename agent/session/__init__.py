"""The embedding session (:class:`agent.session.session.Session`) and what it owns: the wiring of the real
ports and the journal port, request checking, the readers' reports, set-up and removal, quarantine and
Ignition. Below the command line and the managed-operations process; above host, config, release, systemd
and fs.
"""
