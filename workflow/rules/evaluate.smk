rule eval_config:
    """The EvalConfig every evaluation job reads (config.yaml's evaluate section and data settings)."""
    output:
        f"{RESULTS}/configs/eval.yaml",
    log:
        f"{RESULTS}/logs/eval_config.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        kind="eval",
        values=SWEEP.eval_values(),
    script:
        "../scripts/write_config.py"


# a trained run's evaluation, where its training job does not make it (resources.eval_with_training)
if not EVAL_WITH_TRAINING:

    rule evaluate:
        """Greedy accuracy and Pass@1 of one trained checkpoint on every benchmark (model loaded once)."""
        input:
            summary=f"{RESULTS}/train/{POINT}/summary.json",
            cfg=f"{RESULTS}/configs/eval.yaml",
        output:
            POINT_EVAL,
        log:
            f"{RESULTS}/logs/eval/{POINT}.log",
        conda:
            conda_env("evaluate", EVAL_GPUS)
        threads: 1
        resources:
            gpu=EVAL_GPUS,
        params:
            run=folder("input", "summary"),
            out=folder("output"),
        shell:
            "OMP_NUM_THREADS={threads} python -m gmc evaluate --model {params.run}/model --out {params.out} "
            "--config {input.cfg} > {log} 2>&1"


# the starting point, per seed where each seed has its own base model
BASE_EVAL = per_seed(f"{RESULTS}/eval/base")


rule evaluate_base:
    """The starting point: the base model before RL (of each seed, where each has its own)."""
    input:
        model=base_model,
        cfg=f"{RESULTS}/configs/eval.yaml",
    output:
        [f"{BASE_EVAL}/{b}.json" for b in BENCHMARKS],
    log:
        per_seed(f"{RESULTS}/logs/eval/base", ".log"),
    conda:
        conda_env("evaluate_base", EVAL_GPUS)
    threads: 1
    resources:
        gpu=EVAL_GPUS,
    params:
        out=folder("output"),
    shell:
        "OMP_NUM_THREADS={threads} python -m gmc evaluate --model {input.model} --out {params.out} "
        "--config {input.cfg} > {log} 2>&1"
