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
        quick="--quick" if config["theory"]["quick"] else "",
        out=folder("output"),
    shell:
        "OMP_NUM_THREADS={threads} python -m gmc theory --out {params.out} {params.quick} > {log} 2>&1"
