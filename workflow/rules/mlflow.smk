# MLflow: where the runs go (config, else MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME, else a
# sqlite store in the results folder), a parent run for the sweep before training (live logging
# only), and the import of every run with its evaluation scores at the end.
import shlex

from gmc.run.tracking import resolve_experiment, resolve_uri

MLFLOW_LIVE_URI = resolve_uri(CONFIG.tracking_uri, default=None)
MLFLOW_URI = resolve_uri(CONFIG.tracking_uri, default=f"sqlite:///{RESULTS}/mlflow.db")
MLFLOW_EXPERIMENT = resolve_experiment(CONFIG.experiment)
MLFLOW_SWEEP = f"{RESULTS}/mlflow/sweep.json"
# live logging (a tracking URI set): training jobs nest under the sweep's parent run, made first
# (the runs' configs carry the URI and experiment: gmc.sweep.resolve.Sweep.run_values)
MLFLOW_TRAIN_INPUT = [MLFLOW_SWEEP] if MLFLOW_LIVE_URI else []


rule mlflow_sweep:
    """The sweep's parent run, made before training so that live runs nest under it."""
    output:
        MLFLOW_SWEEP,
    log:
        f"{RESULTS}/logs/mlflow_sweep.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        results=folder("output", up=2),
        uri=shlex.quote(MLFLOW_URI),
        experiment=shlex.quote(MLFLOW_EXPERIMENT),
    shell:
        "python -m gmc mlflow-sync --sweep {params.results} --tracking-uri {params.uri} "
        "--experiment {params.experiment} --out {output} > {log} 2>&1"


rule mlflow_sync:
    """Import every point's run (a shared point's as a run of its own), its evaluation scores and
    the base model's into MLflow (idempotent)."""
    input:
        train=TRAIN_DONE,
        evaluations=EVAL_DONE,
    output:
        MLFLOW_DONE,
    log:
        f"{RESULTS}/logs/mlflow_sync.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        dirs=lambda wildcards, input: " ".join(str(Path(p).parent) for p in input.train),
        results=folder("output", up=2),
        uri=shlex.quote(MLFLOW_URI),
        experiment=shlex.quote(MLFLOW_EXPERIMENT),
    shell:
        "python -m gmc mlflow-sync {params.dirs} --sweep {params.results} --tracking-uri {params.uri} "
        "--experiment {params.experiment} --out {output} > {log} 2>&1"
