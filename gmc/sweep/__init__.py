"""A sweep of runs (algorithm x delay x group size x seed) as the Snakemake workflow plans it: its
points, their delays and the paths that name them (:mod:`.points`), its sections of the workflow's
configuration (:mod:`.config`), and the sweep resolved once (:mod:`.resolve`: each run's whole
configuration, the histories, prefills and runs that points share). The whole configuration and
its loading are :mod:`gmc.workflow`'s, at the top (its sections span every room). No torch is
imported.
"""
