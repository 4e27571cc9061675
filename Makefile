# Two entry points for a fresh machine: `make run` (install + the default job) and
# `make test` (install + the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# CPU torch first, so that nothing pulls a multi-GB CUDA build; GPU machines: make TORCH=torch==2.14.0 EXTRAS=dev,gpu
TORCH ?= torch==2.13.0
EXTRAS ?= dev
CORES ?= all
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run figures report test test-slurm lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

# the default sweep (config.yaml): tiny CPU model, grpo/tic/gmc x delays x group sizes, evaluation,
# MLflow, tables, figures and the theory lab
run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores $(CORES)

# every table and figure again from the run directories in results/ (no training)
figures: $(STAMP)
	$(BIN)/gmc report --results results

# the HTML report of the last run
report: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" snakemake --report results/report.html

test: $(STAMP)
	$(BIN)/python -m pytest -q

# the sweep through workflow/profiles/slurm on a one-node SLURM started on this machine (needs
# root; installs Debian's SLURM, munge and MariaDB first; every daemon is stopped at the end)
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
test-slurm: $(STAMP)
	which slurmctld slurmd slurmdbd sbatch munged mariadbd >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) >/dev/null; }
	$(BIN)/python -c "import snakemake_executor_plugin_slurm" 2>/dev/null || \
		$(BIN)/python -m pip install -q -e ".[$(EXTRAS),slurm]"
	PYTHON=$(BIN)/python ci/slurm/run.sh

lint: $(STAMP)
	$(BIN)/ruff check gmc tests workflow/scripts ci
	$(BIN)/snakefmt --check Snakefile workflow/rules
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

clean:
	rm -rf results .snakemake
