#!/bin/sh
# The image's entrypoint: one image for the launcher and for the ssh workers of a multi-container job.
#
#   horovod-entrypoint worker             sshd in the foreground on $HOROVOD_SSH_PORT (a worker)
#   horovod-entrypoint launcher CMD...    ssh set up, wait for $HOROVOD_WAIT_FOR, then run CMD (horovodrun ...)
#   horovod-entrypoint indexed CMD...     launcher on index 0 of an indexed Job (JOB_COMPLETION_INDEX) or
#                                         ordinal 0 of a StatefulSet (host name ending in -0), worker elsewhere
#   horovod-entrypoint CMD...             CMD as it is (python, bash, horovodrun on one container)
#
# ssh keys: $HOROVOD_SSH_KEY_DIR (a mounted Secret) holds id_rsa and authorized_keys (or id_rsa.pub); they are
# copied to /root/.ssh with mode 0600. Host keys are made per container at start. No passwords are accepted.
set -eu

PORT="${HOROVOD_SSH_PORT:-2222}"
KEY_DIR="${HOROVOD_SSH_KEY_DIR:-/etc/horovod/ssh}"

setup_ssh() {
    mkdir -p /root/.ssh /run/sshd
    chmod 700 /root/.ssh
    if [ -f "$KEY_DIR/id_rsa" ]; then
        install -m 600 "$KEY_DIR/id_rsa" /root/.ssh/id_rsa
    fi
    if [ -f "$KEY_DIR/authorized_keys" ]; then
        install -m 600 "$KEY_DIR/authorized_keys" /root/.ssh/authorized_keys
    elif [ -f "$KEY_DIR/id_rsa.pub" ]; then
        install -m 600 "$KEY_DIR/id_rsa.pub" /root/.ssh/authorized_keys
    fi
    ssh-keygen -A >/dev/null
    # Peers are containers of this job whose host keys are made at their start: they cannot be known ahead.
    cat > /root/.ssh/config <<CONFIG
Host *
    Port $PORT
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONFIG
    chmod 600 /root/.ssh/config
}

wait_for_workers() {
    # HOROVOD_WAIT_FOR="host1:2222,host2:2222": wait until each accepts TCP (the job's workers' sshd).
    [ -n "${HOROVOD_WAIT_FOR:-}" ] || return 0
    python - "$HOROVOD_WAIT_FOR" "${HOROVOD_WAIT_TIMEOUT:-300}" <<'PY'
import socket, sys, time
targets, deadline = sys.argv[1].split(","), time.monotonic() + float(sys.argv[2])
for target in filter(None, (t.strip() for t in targets)):
    host, port = target.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"horovod-entrypoint: {target} is not reachable ({exc}); is its worker running?")
            time.sleep(2)
PY
}

run_worker() {
    setup_ssh
    exec /usr/sbin/sshd -D -e -p "$PORT"
}

run_launcher() {
    setup_ssh
    wait_for_workers
    exec "$@"
}

role="${1:-}"
case "$role" in
    worker)
        run_worker ;;
    launcher)
        shift
        run_launcher "$@" ;;
    indexed)
        shift
        index="${JOB_COMPLETION_INDEX:-$(hostname | sed -n 's/.*-\([0-9][0-9]*\)$/\1/p')}"
        if [ "$index" = "0" ]; then run_launcher "$@"; else run_worker; fi ;;
    *)
        exec "$@" ;;
esac
