#!/usr/bin/env bash
# `make test-slurm`: a one-node SLURM on localhost, the SLURM test against it, and every daemon
# stopped again on exit (also on failure or Ctrl-C). Needs root and the packages that the
# make target installs. Daemon logs and the test's folders stay in the printed folder when
# the test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
DIR=$(mktemp -d /tmp/gmc-slurm.XXXXXX)
finish() {
    local rc=$?
    .ci/slurm/cluster.sh down "$DIR"
    if [ "$rc" = 0 ]; then rm -rf "$DIR"; else echo "test-slurm failed; logs under $DIR" >&2; fi
}
trap finish EXIT
.ci/slurm/cluster.sh up "$DIR"
# shellcheck disable=SC1091
source "$DIR/env"
# each test is bounded by its timeout mark (pytest-timeout, 1800 s); this bounds the whole run
OMP_NUM_THREADS=1 timeout 3600 "$PYTHON" -m pytest -q -s -p no:cacheprovider --basetemp "$DIR/pytest" \
    tests/e2e/test_slurm.py
