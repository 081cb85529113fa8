"""The agent's configuration: the boot reader (:mod:`agent.config.boot`, standard library only, for the
no-op recovery), the full loader (:mod:`agent.config.loader`, tomllib + cattrs) and the cross-key path rules
both apply (:mod:`agent.config.pathrules`). Imports nothing at package level, for the boot path.
"""
