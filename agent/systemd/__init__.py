"""systemd: the ``ServiceManager`` port (:mod:`~agent.systemd.manager`), unit rendering
(:mod:`~agent.systemd.units`), application health probes (:mod:`~agent.systemd.probes`) and the stable-path
rule for executables that units name (:mod:`~agent.systemd.stable_paths`).
"""
