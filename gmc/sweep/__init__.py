"""A sweep of runs (algorithm x delay x group size x seed) as the Snakemake workflow plans it:
its points and the paths that name them (:mod:`.points`) and the whole configuration of each run,
with the histories, prefills and runs that points share (:mod:`.resolve`). The schema and the
validation of ``config.yaml`` are :mod:`gmc.workflow`'s, at the top (its sections span every
room). No torch is imported.
"""
