"""Real asynchrony (method.md section 4): rollout workers on Ray that generate ahead of the
trainer with the newest weights they have, under a strict staleness bound.

:mod:`.admission` is the bound (which groups may start, which finished ones are too old),
:mod:`.transport` moves weights to the workers (Ray's object store, or a ``torch.distributed``
broadcast), :mod:`.worker` is a rollout worker (the collector of :mod:`gmc.rollouts.collect` on its own
policy copy) and :mod:`.source` the trainer's side, delay mode ``ray``. Ray is an extra
(``gmc[ray]``); nothing here is imported unless a run asks for that mode.
"""
