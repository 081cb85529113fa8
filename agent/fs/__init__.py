"""File primitives: durable writes and renames (:mod:`~agent.fs.durable`), regular-file reads
(:mod:`~agent.fs.regular`) and checked state files (:mod:`~agent.fs.statefile`). Imports nothing at package
level, for the boot path. """
