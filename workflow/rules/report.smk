rule analysis_config:
    """How the tables judge differences (config.yaml's analysis section); bundles keep it."""
    output:
        f"{RESULTS}/{ANALYSIS}",
    log:
        f"{RESULTS}/logs/analysis_config.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        kind="analysis",
        values=CONFIG.analysis,
    script:
        "../scripts/write_config.py"


rule tables:
    """Every table of gmc.results.outputs.TABLES and the study tables its analysis asks for
    (STUDY_TABLES; a tuning sweep's tuned.yaml), in CSV, Markdown, LaTeX and HTML (the report's).
    """
    input:
        TRAIN_DONE,
        EVAL_DONE,
        f"{RESULTS}/{ANALYSIS}",
    output:
        [
            (
                report(
                    f,
                    category="Tables",
                    caption="../report/tables.rst",
                    labels={
                        "table": Path(f).stem,
                        "shows": table_entry(Path(f).stem).label,
                    },
                )
                if f.endswith(".html")
                else f
            )
            for f in TABLE_FILES
        ],
    log:
        f"{RESULTS}/logs/tables.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        results=folder("output", up=2),
    shell:
        "python -m gmc tables --results {params.results} > {log} 2>&1"


rule figures_from_results:
    """Every figure of gmc.results.outputs.FIGURES from the run directories (PNG for the report, PDF beside it)."""
    input:
        TRAIN_DONE,
        EVAL_DONE,
    output:
        [
            (
                report(
                    f,
                    category="Figures",
                    caption="../report/figures.rst",
                    labels={
                        "figure": Path(f).stem,
                        "shows": FIGURES[Path(f).stem].label,
                    },
                )
                if f.endswith(".png")
                else f
            )
            for f in FIGURE_FILES
        ],
    log:
        f"{RESULTS}/logs/figures.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        results=folder("output", up=2),
    shell:
        "python -m gmc figures --results {params.results} > {log} 2>&1"
