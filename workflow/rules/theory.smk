rule theory_lab:
    """The exactly solvable tabular world: bias vs group size, shortfall, delayed ascent."""
    output:
        [
            (
                report(
                    f,
                    category="Theory lab",
                    caption="../report/theory.rst",
                    labels={"figure": Path(f).stem.removeprefix("theory_")},
                )
                if f.endswith(".png")
                else f
            )
            for f in THEORY
        ],
    log:
        f"{RESULTS}/logs/theory.log",
    conda:
        CONDA_ENV
    threads: 1
    params:
        quick="--quick" if CONFIG.theory.quick else "",
        out=folder("output"),
    shell:
        "OMP_NUM_THREADS={threads} python -m gmc theory --out {params.out} {params.quick} > {log} 2>&1"


# the gradient lab, where the config enables it (gradient_lab.enabled), on one history of the sweep
if LAB_HISTORY is not None:

    rule gradient_lab_config:
        """The gradient lab's settings (config.yaml's gradient_lab section, GradientLabConfig)."""
        output:
            f"{RESULTS}/configs/gradient_lab.yaml",
        log:
            f"{RESULTS}/logs/gradient_lab_config.log",
        localrule: True
        conda:
            CONDA_ENV
        params:
            kind="gradient_lab",
            values=CONFIG.lab_values(),
        script:
            "../scripts/write_config.py"

    rule gradient_lab:
        """The estimators measured on the policy's gradients at pairs of weights from one history of
        the sweep (gmc gradient-lab): tables, their Markdown and figures."""
        input:
            history=f"{RESULTS}/history/{LAB_HISTORY}/summary.json",
            cfg=f"{RESULTS}/configs/gradient_lab.yaml",
            data=f"{RESULTS}/data/manifest.json",
        output:
            [
                (
                    report(
                        f,
                        category="Gradient lab",
                        caption="../report/gradient_lab.rst",
                        labels={"figure": Path(f).stem.removeprefix("gradient_")},
                    )
                    if f.endswith(".png")
                    else f
                )
                for f in GRADIENT_LAB
            ],
        log:
            f"{RESULTS}/logs/gradient_lab.log",
        conda:
            conda_env("gradient_lab", TRAIN_GPUS)
        threads: 1
        resources:
            gpu=TRAIN_GPUS,
        params:
            history=folder("input", "history"),
            out=folder("output"),
        shell:
            "OMP_NUM_THREADS={threads} TQDM_MININTERVAL=10 python -m gmc gradient-lab --history {params.history} "
            "--config {input.cfg} --out {params.out} > {log} 2>&1"
