#!/bin/sh
# The baseline of the `upgrade.end_to_end` benchmark (design §9): the same steps as `upgrade-agent upgrade`,
# done the naive way, with no journal, no digest, no version check, no fsync, no health check and no
# rollback. Its only wait is the stability window, which the supervised upgrade also has to hold.
#
# usage: upgrade_naive.sh URL MEMBER SLOT CURRENT_LINK UNIT STABILITY_S [SYSTEMCTL_PREFIX...]
#   URL           the release archive (tar.gz) over HTTP
#   MEMBER        the member path inside the archive
#   SLOT          the inactive slot file to overwrite (absolute path)
#   CURRENT_LINK  the `current` symlink, repointed at SLOT's basename
#   UNIT          the systemd unit to restart
#   STABILITY_S   seconds to wait after the restart (the same window the supervised upgrade holds)
#   SYSTEMCTL_PREFIX  argv before `systemctl` (e.g. nsenter into a private systemd), like host.systemctl_prefix
set -eu
url=$1 member=$2 slot=$3 current=$4 unit=$5 stability=$6
shift 6
curl -fsS "$url" | tar -xzf - -O "$member" > "$slot"
chmod 0755 "$slot"
ln -sfn "$(basename "$slot")" "$current"
"$@" systemctl restart "$unit"
sleep "$stability"
