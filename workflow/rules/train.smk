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
    shell:
        "OMP_NUM_THREADS={threads} TQDM_MININTERVAL=10 python -m gmc train --config {input.base} "
        "--set model={input.model} {params.overrides} {params.mlflow} --out {params.dir} --resume > {log} 2>&1"
