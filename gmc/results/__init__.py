"""Results read from run directories, never retrained: the registry of tables and figures
(:mod:`.outputs`), statistics over seeds (:mod:`.stats`), the tables (:mod:`.tables`) and figures
(:mod:`.figures`), published bundles (:mod:`.bundles`, with the time per stage from Snakemake's
logs, :mod:`.stages`), the check of a re-run against a bundle (:mod:`.compare`) and documents
that quote bundles (:mod:`.quotes`). No torch is imported.
"""
