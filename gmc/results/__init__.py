"""Results read from run directories, never retrained: the registry of tables and figures
(:mod:`.outputs`), the runs read as a frame (:mod:`.collect`), statistics over seeds
(:mod:`.stats`) and what the tables infer with them (:mod:`.inference`), the tables
(:mod:`.tables`, their Markdown, LaTeX and HTML :mod:`.render`) and figures (:mod:`.figures`),
published bundles (:mod:`.bundles`, with the time per stage from Snakemake's logs,
:mod:`.stages`), the check of a re-run against a bundle (:mod:`.compare`) and documents that
quote bundles (:mod:`.quotes`). No torch is imported.
"""
