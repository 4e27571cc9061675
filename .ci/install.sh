#!/usr/bin/env bash
# `make test-install`: gmc as a user installs it without the Makefile. The files a fresh clone
# holds (tracked and untracked ones git does not ignore) are copied into a temporary folder; a
# fresh virtual environment gets CPU torch ($TORCH) first, then `pip install .` (not editable)
# from that copy. Fails on a missing-extra warning of pip, on build/ or *.egg-info left in the
# copy, on `gmc plan-memory --preset workflow/presets/paper.yaml` failing, and on `gmc quickstart`
# failing or taking longer than $QUICKSTART_LIMIT seconds (default 300). The folder is removed
# when everything passes, kept (and named) when not.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
LIMIT=${QUICKSTART_LIMIT:-300}
DIR=$(mktemp -d /tmp/gmc-install.XXXXXX)
finish() {
    local rc=$?
    if [ "$rc" = 0 ]; then rm -rf "$DIR"; else echo "test-install failed; its folder: $DIR" >&2; fi
}
trap finish EXIT
mkdir "$DIR/src"
git ls-files -z --cached --others --exclude-standard | tar --null -cf - -T - | tar -xf - -C "$DIR/src"
start=$(date +%s)
"$PYTHON" -m venv "$DIR/venv"
"$DIR/venv/bin/python" -m pip install -q --upgrade pip
"$DIR/venv/bin/python" -m pip install -q "$TORCH"
(cd "$DIR/src" && "$DIR/venv/bin/python" -m pip install -q . 2>&1 | tee "$DIR/pip.log")
echo "test-install: fresh environment with gmc in $(( $(date +%s) - start )) s"
if grep -i "does not provide the extra" "$DIR/pip.log"; then
    echo "test-install: pip warns of a missing extra (pyproject.toml's dependencies)" >&2
    exit 1
fi
left=$(cd "$DIR/src" && ls -d build ./*.egg-info 2>/dev/null || true)
if [ -n "$left" ]; then
    echo "test-install: pip install . left $left in the tree" >&2
    exit 1
fi
installed=$(cd / && "$DIR/venv/bin/python" -c "import gmc; print(gmc.__file__)")
case "$installed" in
    "$DIR/venv/"*) ;;
    *) echo "test-install: gmc imports from $installed, not the environment" >&2; exit 1 ;;
esac
cd "$DIR/src"
"$DIR/venv/bin/gmc" plan-memory --preset workflow/presets/paper.yaml
start=$(date +%s)
"$DIR/venv/bin/gmc" quickstart
seconds=$(( $(date +%s) - start ))
echo "test-install: gmc quickstart in $seconds s (limit $LIMIT s)"
test -s results/quickstart/eval/trained/synthetic.json
if [ "$seconds" -gt "$LIMIT" ]; then
    echo "test-install: gmc quickstart took $seconds s, more than $LIMIT s" >&2
    exit 1
fi
