"""Releases: fetching bytes (:mod:`~agent.release.fetch`), content decoders and extraction
(:mod:`~agent.release.extract`), the ``ArchiveSource`` port (:mod:`~agent.release.source`), signatures and
keyrings (:mod:`~agent.release.minisign`, :mod:`~agent.release.trust`) and the candidate's version check
(:mod:`~agent.release.verify`).
"""
