rule train_config:
    """The whole TrainConfig of one run (gmc.sweep.resolve.Sweep.run): the train section with the sweep
    point, the delay mode's section, the model, data, synthetic and mlflow settings. A changed key
    rewrites exactly the files of the runs it reaches, and those runs alone train again.
    """
    output:
        f"{RESULTS}/configs/train/{POINT}.yaml",
    log:
        f"{RESULTS}/logs/train_config/{POINT}.log",
    priority: START_PRIORITY
    localrule: True
    conda:
        CONDA_ENV
    params:
        kind="train",
        values=run_config,
    script:
        "../scripts/write_config.py"


rule train:
    """One training run; rerunning a killed job resumes from its checkpoint. With
    resources.eval_with_training, the job then evaluates the trained model (rule evaluate's files).
    """
    input:
        model=base_model,
        cfg=f"{RESULTS}/configs/train/{POINT}.yaml",
        data=f"{RESULTS}/data/manifest.json",
        mlflow=MLFLOW_TRAIN_INPUT,
        eval_cfg=[f"{RESULTS}/configs/eval.yaml"] if EVAL_WITH_TRAINING else [],
        prefill=prefill_file,
        history=history_summary,
    output:
        summary=f"{RESULTS}/train/{POINT}/summary.json",
        evaluations=POINT_EVAL if EVAL_WITH_TRAINING else [],
    log:
        f"{RESULTS}/logs/train/{POINT}.log",
    conda:
        conda_env("train", TRAIN_GPUS)
    threads: 1
    resources:
        gpu=TRAIN_GPUS,
    params:
        script=REQUEUE_SCRIPT,
        dir=folder("output", "summary"),
        evaluate=lambda wildcards, input, output: (
            f"--evaluate {input.eval_cfg[0]} --eval-out {Path(output.evaluations[0]).parent}"
            if EVAL_WITH_TRAINING
            else ""
        ),
        prefill=lambda wildcards, input: (
            f"--prefill {input.prefill}" if input.prefill else ""
        ),
        history=lambda wildcards, input: (
            f"--history {Path(input.history[0]).parent}" if input.history else ""
        ),
    # workflow/scripts/requeue.sh: exit status 75 (stopped with a checkpoint) requeues a SLURM job
    shell:
        "OMP_NUM_THREADS={threads} TQDM_MININTERVAL=10 bash {params.script} {log} train --config {input.cfg} "
        "--out {params.dir} --resume {params.evaluate} {params.prefill} {params.history}"


rule history:
    """The on-policy history every run of one class (every setting but the estimator and the
    delay) starts from under warmup: history, trained once with the first member's config and
    kept as a run directory of its own: its weights, optimizer state and the batches of its last
    updates, as many as the largest fixed delay among the members needs (gmc history). A killed
    job resumes from the history's checkpoint.
    """
    input:
        model=lambda wildcards: SWEEP.model_dir(
            HISTORY_MAKERS[wildcards.history][0].seed
        ),
        cfg=lambda wildcards: f"{RESULTS}/configs/train/{HISTORY_MAKERS[wildcards.history][0].path}.yaml",
        data=f"{RESULTS}/data/manifest.json",
    output:
        f"{RESULTS}/history/{{history}}/summary.json",
    log:
        f"{RESULTS}/logs/history/{{history}}.log",
    priority: START_PRIORITY
    conda:
        conda_env("history", TRAIN_GPUS)
    threads: 1
    resources:
        gpu=TRAIN_GPUS,
    params:
        script=REQUEUE_SCRIPT,
        dir=folder("output"),
        keep=lambda wildcards: HISTORY_MAKERS[wildcards.history][1],
    shell:
        "OMP_NUM_THREADS={threads} TQDM_MININTERVAL=10 bash {params.script} {log} history --config {input.cfg} "
        "--out {params.dir} --keep {params.keep}"


rule prefill:
    """The queue of the fixed-delay runs of one prefill class (every setting but the estimator):
    its d batches of the starting weights, generated once with the first member's config; each
    member starts from it as if it had generated it (gmc train --prefill). Removed once they
    have all trained.
    """
    input:
        model=lambda wildcards: SWEEP.model_dir(PREFILL_MAKERS[wildcards.prefill].seed),
        cfg=lambda wildcards: f"{RESULTS}/configs/train/{PREFILL_MAKERS[wildcards.prefill].path}.yaml",
        data=f"{RESULTS}/data/manifest.json",
    output:
        temp(f"{RESULTS}/prefill/{{prefill}}.pt"),
    log:
        f"{RESULTS}/logs/prefill/{{prefill}}.log",
    priority: START_PRIORITY
    conda:
        conda_env("prefill", TRAIN_GPUS)
    threads: 1
    resources:
        gpu=TRAIN_GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m gmc prefill --config {input.cfg} --out {output} > {log} 2>&1"


rule share_run:
    """A point whose run is provably identical to another's: the record of which (no training)."""
    input:
        cfg=f"{RESULTS}/configs/train/{POINT}.yaml",
        run_cfg=lambda wildcards: f"{RESULTS}/configs/train/{shared_run(wildcards).path}.yaml",
        run=lambda wildcards: f"{RESULTS}/train/{shared_run(wildcards).path}/summary.json",
    output:
        f"{RESULTS}/train/{POINT}/{SHARED_FILE}",
    log:
        f"{RESULTS}/logs/share_run/{POINT}.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        run=lambda wildcards: shared_run(wildcards).path,
    script:
        "../scripts/share_run.py"
