rule prepare_data:
    """Load and check every data set the sweep needs; fail early on bad data."""
    output:
        f"{RESULTS}/data/manifest.json",
    log:
        f"{RESULTS}/logs/prepare_data.log",
    priority: START_PRIORITY
    localrule: True
    conda:
        CONDA_ENV
    params:
        train=TRAIN_DATA,
        source=CONFIG.data_source,
        root=f"--data-root {CONFIG.data_root}" if CONFIG.data_root else "",
        benchmarks=" ".join(BENCHMARKS),
    shell:
        "python -m gmc prepare-data --train {params.train} --benchmarks {params.benchmarks} "
        "--source {params.source} {params.root} --out {output} > {log} 2>&1"
