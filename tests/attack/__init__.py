"""Attacks on every path the agent keeps, through the real CLI (design §10, docs/host.md#ownership).

Root must touch only what it can prove is its own: every path it writes, removes or runs is reached from a
checked directory, one component at a time. These tests try what a local unprivileged user could do to
each such path (a symlink, a FIFO, a hard link, a foreign owner, a writable mode: ``test_hostile_trees``) and
what a swap by path could do while a command runs (``test_races``), with canaries outside that must keep
their bytes and inode. Templates are made by the real agent (``_hosts``); the components and replacements
are ``_trees``; the race attacker is ``_flipper``. ``host.systemctl_prefix`` is ``/bin/false``: nothing
reaches a service manager, and ``install``, ``upgrade`` and ``rollback`` stop at their first restart, after
every filesystem step before it.

Paths under the test host ``H`` (``R = H/root``, ``S = H/state``; ``NAME`` is the agent), the commands that
touch each, and the tests attacking them:

==================================  ====================================  ====================================
agent path                          commands                              test
==================================  ====================================  ====================================
``H`` (parent of R, S, the lock's   all ten                               hostile[each]
and the spool's directories, the
mirror)
R, R/lib, R/bin                     all but operator spool pass           hostile[each]
R/lib/NAME                          all but operator spool pass           hostile[each]; race: upgrade staging
R/lib/NAME/NAME-blue, NAME-green    upgrade, rollback, recover,           hostile[each]
(the slots)                         uninstall, status
NAME-current, NAME-last-good        upgrade, rollback, recover,           hostile[each]
                                    uninstall, status
R/bin/NAME                          install, upgrade, rollback, recover,  hostile[each]
                                    uninstall, status
S (``state_dir``)                   all ten                               hostile[each]; race: install record
                                                                          write
S/journal, S/results                all but install                       hostile[each]; race: uninstall
                                                                          (S/results)
S/journal/<live segment>,           all but install and operator spool    hostile[each]
S/journal/owner.json                pass
S/results/OP.json                   upgrade, rollback, recover, reset,    hostile[each]
                                    uninstall, status
S/install.json (the install         upgrade, rollback, recover, reset,    hostile[each]; race: install (S
record)                             uninstall, status                     while the record is written)
S/trust, S/trust/keyring.json (the  upgrade, uninstall                    hostile[each]
trust cache)
H/run (the lock's directory),       all ten (install creates H/run)       hostile[each]
H/run/NAME.lock
H/spool, op-1.json,                 operator spool pass                   hostile[each]; race: spool pass
op-1.status.json
H/mirror, H/mirror/bin,             upgrade, rollback (mirror sync);      hostile[each]; race: upgrade
H/mirror/bin/NAME                   install (H/mirror, absent)            (H/mirror/bin, flipped by uid 65534)
(``[[mirrors]]``)
H/units, H/units/NAME.service       install (H/units), upgrade,           hostile[each]
                                    rollback, reset, uninstall, status
==================================  ====================================  ====================================

``hostile[cmd]`` is ``test_hostile_trees.py::test_a_hostile_component_is_refused_or_left_alone[cmd]``, the
command's words joined by ``-`` (the exact component lists: ``_trees.TOUCHES``); the races are
``test_races.py``:
``test_results_swapped_for_a_symlink_while_uninstall_removes_them``,
``test_the_agent_directory_swapped_while_upgrade_stages``,
``test_state_dir_swapped_while_install_writes_its_record``,
``test_a_mirror_directory_its_owner_swaps_during_mirror_sync``,
``test_the_spool_directory_swapped_during_a_spool_pass``.

Sizes: 20 hostile trees per command and 20 runs per race in ``make test``; 200 of each with
``UPGRADE_CORE_LONG=1`` (``make test-long``).
"""
