#!/bin/bash
# apt-get with its arguments, waiting up to 10 minutes for another apt or dpkg
# at work (unattended-upgrades, a second shell) instead of failing. Its output
# is shown only when it fails.
#
# DPkg::Lock::Timeout makes apt wait for dpkg's frontend lock; apt 2.6 does not
# wait for the package lists' lock (update) or the download cache's lock with
# it, so a failure that names a lock is retried until the same deadline.
set -euo pipefail
lock_wait_s=600
deadline=$((SECONDS + lock_wait_s))
said=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
while :; do
    rc=0
    apt-get -o DPkg::Lock::Timeout="$lock_wait_s" "$@" >"$log" 2>&1 || rc=$?
    if [ $rc -eq 0 ] || ! grep -q "Could not get lock" "$log" || [ $SECONDS -ge $deadline ]; then
        break
    fi
    [ $said -eq 1 ] || echo "apt-get-wait.sh: $(grep -m1 "Could not get lock" "$log" | sed 's/^E: //'); waiting" >&2
    said=1
    sleep 5
done
[ $rc -eq 0 ] || { cat "$log" >&2; echo "apt-get-wait.sh: apt-get $* failed (exit $rc)" >&2; }
exit $rc
