rule train_config:
    """The TrainConfig keys shared by every sweep point (config.yaml's train, data and mlflow sections)."""
    output:
        f"{RESULTS}/configs/train.yaml",
    log:
        f"{RESULTS}/logs/train_config.log",
    conda:
        CONDA_ENV
    params:
        kind="train",
        values=train_values(),
    script:
        "../scripts/write_config.py"


rule train:
    """One training run; rerunning a killed job resumes from its checkpoint."""
    input:
        model=MODEL_DIR,
        base=f"{RESULTS}/configs/train.yaml",
        data=f"{RESULTS}/data/manifest.json",
        mlflow=MLFLOW_TRAIN_INPUT,
    output:
        f"{RESULTS}/train/{POINT}/summary.json",
    log:
        f"{RESULTS}/logs/train/{POINT}.log",
    conda:
        conda_env("train", config["resources"]["train_gpus"])
    threads: 1
    resources:
        gpu=config["resources"]["train_gpus"],
    params:
        dir=lambda wildcards, output: str(Path(output[0]).parent),
        overrides=train_overrides,
        mlflow=MLFLOW_TRAIN_ARGS,
    # exit status 75: stopped by SIGTERM/SIGUSR1 with a checkpoint written. Under SLURM a job still
    # RUNNING got its time-limit warning: it requeues itself and resumes, as often as the run needs
    # (retries are not spent); a cancelled one (scancel: COMPLETING) is not requeued.
    # The trap keeps this shell alive through the signal until the trainer has checkpointed.
    shell:
        "trap true TERM USR1; OMP_NUM_THREADS={threads} TQDM_MININTERVAL=10 python -m gmc train --config {input.base} "
        "--set model={input.model} {params.overrides} {params.mlflow} --out {params.dir} --resume > {log} 2>&1 "
        '|| {{ status=$?; if [ $status = 75 ] && [ -n "${{SLURM_JOB_ID:-}}" ] '
        '&& [ "$(squeue -h -j $SLURM_JOB_ID -o %T)" = RUNNING ]; then '
        "scontrol requeue $SLURM_JOB_ID && sleep 3 && scontrol update JobId=$SLURM_JOB_ID StartTime=now; sleep 60; fi; "
        "exit $status; }}"
