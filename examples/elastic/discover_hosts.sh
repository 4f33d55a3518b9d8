#!/usr/bin/env bash
# Host discovery for elastic horovodrun (--host-discovery-script): prints the hosts file's "host:slots" lines.
# The file is $HOROVOD_HOSTS_FILE, or hosts.txt next to this script; blank lines and # comments are skipped.
# Edit the file while the job runs to add or remove hosts: horovodrun calls this script about every second.
set -euo pipefail

hosts_file="${HOROVOD_HOSTS_FILE:-$(dirname "$0")/hosts.txt}"
if [[ ! -r "$hosts_file" ]]; then
    echo "discover_hosts.sh: cannot read the hosts file '$hosts_file': create it (one host:slots per line, e.g." \
         "'localhost:2'; see hosts.example.txt) or point HOROVOD_HOSTS_FILE at it" >&2
    exit 1
fi
# Drop comments and surrounding blanks, then empty lines.
sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$hosts_file" | grep -v '^$' || true
