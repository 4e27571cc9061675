#!/usr/bin/env bash
# A one-node SLURM on localhost for CI: munge, MariaDB, slurmdbd, slurmctld, slurmd.
#   .ci/slurm/cluster.sh up DIR     start everything with its state, logs and database under DIR;
#                                  write DIR/env (source it: partition and account to use)
#   .ci/slurm/cluster.sh down DIR   stop every daemon that `up DIR` started (pid files, reverse
#                                  order) and remove the config files it wrote to /etc/slurm
# Needs root and the Debian packages slurm-wlm munge slurmdbd mariadb-server. Outside DIR it
# writes /etc/slurm/{slurm,gres,slurmdbd}.conf (the job steps' `srun` reads only the default
# location: the executor plugin clears SLURM_CONF), refusing to replace files it did not write,
# and a hosts entry when the short host name does not resolve.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CMD="${1:?usage: cluster.sh up|down DIR}"
DIR="${2:?usage: cluster.sh up|down DIR}"
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; stopped in reverse
CONFS=(slurm.conf gres.conf slurmdbd.conf)
ETC=/etc/slurm
MARK="# written by gmc .ci/slurm/cluster.sh for"

log() { echo "[cluster] $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2; shift 2
    for _ in $(seq $((limit * 2))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    log "timed out after ${limit}s waiting for $what; logs in $DIR/log"
    tail -n 20 "$DIR"/log/*.log >&2 || true
    return 1
}

fill() {  # fill TEMPLATE OUT: substitute the @...@ values, mark the file as ours
    { echo "$MARK $DIR"; sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" "$1"; } >"$2"
}

down() {
    local i pid
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        [ -f "$DIR/run/${DAEMONS[i]}.pid" ] || continue
        pid=$(cat "$DIR/run/${DAEMONS[i]}.pid")
        if kill "$pid" 2>/dev/null; then
            for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
            kill -9 "$pid" 2>/dev/null || true
            log "stopped ${DAEMONS[i]} ($pid)"
        fi
        rm -f "$DIR/run/${DAEMONS[i]}.pid"
    done
    for f in "${CONFS[@]}"; do
        if [ "$(head -n 1 "$ETC/$f" 2>/dev/null)" = "$MARK $DIR" ]; then rm -f "$ETC/$f"; fi
    done
}

up() {
    HOST=$(hostname -s)
    CTLD_PORT=${GMC_CI_SLURMCTLD_PORT:-6817} SLURMD_PORT=${GMC_CI_SLURMD_PORT:-6818}
    DBD_PORT=${GMC_CI_SLURMDBD_PORT:-6819} DB_PORT=${GMC_CI_MARIADB_PORT:-3307}
    [ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }
    getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >>/etc/hosts
    for f in "${CONFS[@]}"; do
        if [ -e "$ETC/$f" ] && ! head -n 1 "$ETC/$f" | grep -q "^$MARK"; then
            log "$ETC/$f exists and was not written by this script; not replacing it"
            exit 1
        fi
    done
    mkdir -p "$ETC" "$DIR"/{state,spool,run,log,munge,mysql,dev}
    for i in {0..7}; do mknod "$DIR/dev/gpu$i" c 1 3; done   # like /dev/null
    chmod 755 "$DIR"
    for f in "${CONFS[@]}"; do fill "$HERE/$f.in" "$ETC/$f"; done
    chmod 600 "$ETC/slurmdbd.conf"

    # munge on its standard socket (every SLURM client looks there), with the package's key;
    # one that is already running is used and left running
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munge already running"
    else
        [ -f /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
        mkdir -p /run/munge && chown munge: /run/munge "$DIR/munge"
        runuser -u munge -- /usr/sbin/munged --pid-file="$DIR/munge/munged.pid" \
            --seed-file="$DIR/munge/seed" --log-file="$DIR/munge/munged.log"
        wait_for 10 munge bash -c "munge -n | unmunge"
        cp "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
        log "munge up"
    fi

    # accounting store: a fresh MariaDB data directory, TCP on 127.0.0.1 only
    mariadb-install-db --user=root --datadir="$DIR/mysql" --auth-root-authentication-method=normal \
        --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1
    setsid mariadbd --user=root --datadir="$DIR/mysql" --socket="$DIR/run/mysql.sock" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$DIR/run/mariadbd.pid" \
        --log-error="$DIR/log/mariadbd.log" --skip-log-bin </dev/null >/dev/null 2>&1 &
    wait_for 60 MariaDB mysqladmin --socket="$DIR/run/mysql.sock" ping
    mariadb --socket="$DIR/run/mysql.sock" -e "CREATE DATABASE slurm_acct_db;
        CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
        CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    log "MariaDB up"

    slurmdbd
    wait_for 60 slurmdbd grep -q "started" "$DIR/log/slurmdbd.log"
    log "slurmdbd up"
    sacctmgr -i add cluster gmcci >/dev/null
    slurmctld
    wait_for 60 slurmctld scontrol ping
    slurmd
    wait_for 60 "the node to be idle" bash -c "sinfo -h -N -o %t | grep -qx idle"
    sacctmgr -i add account ci >/dev/null
    sacctmgr -i add user root account=ci >/dev/null
    printf 'export GMC_SLURM_PARTITION=debug GMC_SLURM_ACCOUNT=ci\n' >"$DIR/env"
    sinfo >&2
}

case "$CMD" in
up) up ;;
down) down ;;
*) echo "usage: cluster.sh up|down DIR" >&2; exit 2 ;;
esac
