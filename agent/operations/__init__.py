"""Managed upgrades (docs/managed.md): ``upgrade-agent operator`` and the sources it takes operations
from.

- :mod:`.model`: one operation as a source holds it (:class:`~.model.Operation`), the
  :class:`~.model.OperationSource` port both sources implement, the checks that turn a spec into a
  request, and the status documents (camelCase for Kubernetes, snake_case for the spool).
- :mod:`.spool`: the spool directory (``<id>.json`` in, ``<id>.status.json`` out, both atomic).
- :mod:`.kubernetes`: ``UpgradeOperation`` objects (group ``upgrades.upgrade-core.io``, ``v1alpha1``) through
  ``kubernetes_asyncio``.
- :mod:`.operator`: the loop: start-up gate, one operation at a time, exactly-once terminal status.

Nothing here is imported by the other commands: the operator's dependencies load only when it runs.
"""
