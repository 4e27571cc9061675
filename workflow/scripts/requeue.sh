#!/usr/bin/env bash
# A job of the sweep that may stop with a checkpoint (rules train and history): `python -m gmc
# COMMAND ARGS...`, its output in LOG.
#   usage: requeue.sh LOG COMMAND ARGS...
# Exit status 75: the run was stopped by SIGTERM or SIGUSR1 with a checkpoint written. Under SLURM
# a job still RUNNING got its time-limit warning: it requeues itself and resumes, as often as the
# run needs (Snakemake's retries are not spent); a cancelled one (scancel: COMPLETING) is not
# requeued. The trap keeps this shell alive through the signal until the trainer has checkpointed.
set -u
log=$1
shift
trap true TERM USR1
python -m gmc "$@" > "$log" 2>&1
status=$?
if [ "$status" = 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "$(squeue -h -j "$SLURM_JOB_ID" -o %T)" = RUNNING ]; then
    scontrol requeue "$SLURM_JOB_ID" && sleep 3 && scontrol update JobId="$SLURM_JOB_ID" StartTime=now
    sleep 60
fi
exit "$status"
