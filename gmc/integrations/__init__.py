"""gmc's corrections inside other trainers: each module registers gmc's estimators, unchanged, where
another framework looks for its losses (:mod:`gmc.integrations.verl`: verl's policy losses, and the
group weights its driver computes by ``uid``). docs/integrations.md says how to use them."""
