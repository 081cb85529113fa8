#!/bin/bash
# The baseline of the `upgrade.end_to_end` benchmark (design §9): the checks `upgrade-agent upgrade` makes,
# done as a careful operator would with standard tools and no journal: the archive's sha256 taken while it
# streams (tee into sha256sum), the member extracted beside the slot, its version command run, the file and
# its directory synced, the slot replaced by rename, the `current` link switched atomically (ln -s then
# mv -T), synced, the unit restarted, then the health window: the probe must answer 200 within TIMEOUT_S and
# keep answering with the same MainPID for STABILITY_S. It does not roll back (the benchmark's upgrades all
# pass); any failed check exits non-zero.
#
# usage: upgrade_strong.sh URL SHA256 MEMBER SLOT CURRENT_LINK UNIT VERSION HEALTH_URL STABILITY_S TIMEOUT_S
#                          [SYSTEMCTL_PREFIX...]
#   URL           the release archive (tar.gz) over HTTP
#   SHA256        the archive's expected sha256 (64 hex)
#   MEMBER        the member path inside the archive
#   SLOT          the inactive slot file to replace (absolute path)
#   CURRENT_LINK  the `current` symlink, repointed at SLOT's basename
#   UNIT          the systemd unit to restart
#   VERSION       the version the candidate's `version` command must print
#   HEALTH_URL    the health probe (HTTP 200 when healthy)
#   STABILITY_S   seconds the probe must keep passing with the same MainPID
#   TIMEOUT_S     seconds the first passing probe may take after the restart
#   SYSTEMCTL_PREFIX  argv before `systemctl` (e.g. nsenter into a private systemd), like host.systemctl_prefix
set -euo pipefail
url=$1 sha=$2 member=$3 slot=$4 current=$5 unit=$6 version=$7 health=$8 stability=$9 timeout=${10}
shift 10
dir=$(dirname "$slot")
stage=$(mktemp -d "$dir/.strong.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# tee >(sha256sum) with a named pipe, so that the script can wait for the sum to be written
mkfifo "$stage/fifo"
sha256sum < "$stage/fifo" > "$stage/sum" &
hasher=$!
curl -fsS "$url" | tee "$stage/fifo" | tar -xzf - -C "$stage" "$member"
wait "$hasher"
read -r got _ < "$stage/sum"
[ "$got" = "$sha" ] || { echo "sha256 mismatch: $got" >&2; exit 1; }
chmod 0755 "$stage/$member"
out=$(timeout 10 "$stage/$member" version)
case "$out" in *"$version"*) ;; *) echo "version check failed: $out" >&2; exit 1 ;; esac
sync "$stage/$member"
mv -f "$stage/$member" "$slot"
sync "$dir"
ln -s "$(basename "$slot")" "$current.next"
mv -T "$current.next" "$current"
sync "$(dirname "$current")"

"$@" systemctl restart "$unit"
pid=$("$@" systemctl show -p MainPID --value "$unit")
deadline=$(( $(date +%s%N) + ${timeout%.*} * 1000000000 ))
until curl -fsS -o /dev/null --max-time 1 "$health"; do
    [ "$(date +%s%N)" -lt "$deadline" ] || { echo "no healthy answer in ${timeout} s" >&2; exit 1; }
    sleep 0.05
done
# "%.0f", not "%d": mawk (Debian's awk) saturates %d at 2^31 - 1, which cut a 3 s window to 2.147 s
end=$(( $(date +%s%N) + $(awk -v s="$stability" 'BEGIN { printf "%.0f", s * 1000000000 }') ))
while [ "$(date +%s%N)" -lt "$end" ]; do
    now=$("$@" systemctl show -p MainPID --value "$unit")
    [ "$now" = "$pid" ] || { echo "MainPID changed: $pid -> $now" >&2; exit 1; }
    curl -fsS -o /dev/null --max-time 1 "$health" || { echo "health probe failed" >&2; exit 1; }
    sleep 0.2
done
