"""A sweep of runs (algorithm x delay x group size x seed) as the Snakemake workflow plans it:
its points and the paths that name them (:mod:`.points`), the whole configuration of each run
(:mod:`.resolve`) and the schema and validation of ``config.yaml`` (:mod:`.schema`). No torch is
imported.
"""
