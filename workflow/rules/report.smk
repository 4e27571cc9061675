rule tables:
    """Main table (paper layout), ratio diagnostics and paired differences, in CSV, Markdown and LaTeX."""
    input:
        TRAIN_DONE,
        EVAL_DONE,
    output:
        [
            (
                report(
                    f"{RESULTS}/tables/{t}.{ext}",
                    category="Tables",
                    caption="../report/tables.rst",
                )
                if ext == "md"
                else f"{RESULTS}/tables/{t}.{ext}"
            )
            for t in TABLE_NAMES
            for ext in ("csv", "md", "tex")
        ],
    log:
        f"{RESULTS}/logs/tables.log",
    conda:
        CONDA_ENV
    params:
        results=lambda wildcards, output: str(Path(output[0]).parents[1]),
    shell:
        "python -m gmc tables --results {params.results} > {log} 2>&1"


rule figures_from_results:
    """Every figure from the run directories (PNG for the report, PDF beside it)."""
    input:
        TRAIN_DONE,
        EVAL_DONE,
    output:
        [
            report(
                f"{RESULTS}/figures/{f}.png",
                category="Figures",
                caption=f"../report/{f}.rst",
            )
            for f in FIGURE_NAMES
        ],
    log:
        f"{RESULTS}/logs/figures.log",
    conda:
        CONDA_ENV
    params:
        results=lambda wildcards, output: str(Path(output[0]).parents[1]),
    shell:
        "python -m gmc figures --results {params.results} > {log} 2>&1"
