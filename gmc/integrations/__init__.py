"""gmc's corrections inside other trainers: any gmc estimator, and the sampler-mismatch
correction, as the loss of a trainer researchers already use (:mod:`gmc.integrations.trl`: a
``GRPOTrainer`` subclass; :mod:`gmc.integrations.verl`: verl's policy losses, and the group
weights its driver computes by ``uid``).

Each integration reuses :mod:`gmc.estimators` (the registry, the losses on ``[B, G, T]``
tensors, the mismatch correction) and copies none of its math; each imports its framework only
when it is itself imported, and refuses, naming the key, what it cannot compute exactly.
docs/integrations.md says how to use them.
"""
