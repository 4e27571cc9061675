"""verl's v1 trainers with gmc's group weights (verl 0.9), loaded on ``import verl`` by the
``verl.plugins`` entry point ``gmc_trainers`` (``pyproject.toml``), or named in
``VERL_USE_EXTERNAL_MODULES`` beside :mod:`gmc.integrations.verl`; it needs verl's v1 trainer, and
so TransferQueue.

verl's driver is the one place that sees a whole group: its policy losses see micro-batches, whose
rows verl's batch balancing has reordered, so the groups are known only by ``uid``. Each trainer
here is one of verl's, registered with verl's ``register_trainer`` under ``gmc_<mode>``
(``trainer.v1.trainer_mode=gmc_sync``, ``gmc_colocate_async``, ``gmc_separate_async``), and runs
as verl's mode of that name (the configuration's ``trainer_mode`` is set back to it, so verl's
settings of the mode and its replay buffer apply). After verl has computed the advantages, a
trainer whose loss is group-weighted (``gmc_gmc``) reads each row's ``uid`` and log-probs, computes
the weights by ``uid`` (:func:`gmc.integrations.verl.group_weights`) and writes them, on every
valid token of their row, as the rows' ``rollout_is_weights``, which verl's actor hands to the
policy loss. The configuration is checked at construction
(:func:`gmc.integrations.verl.check_config`). A trainer of one's own takes the same step by putting
:class:`GroupWeights` before its verl base class.
"""

from __future__ import annotations

import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSeparateAsync, PPOTrainerSync, register_trainer

from gmc.integrations.verl import check_config, nested_group_weights, uses_group_weights


class GroupWeights:
    """Before a verl ``PPOTrainer`` class: its mode (:attr:`verl_mode`), the configuration checked,
    and gmc's group weights added after the advantages."""

    verl_mode: str = "sync"
    """The verl trainer mode this trainer runs as."""

    def __init__(self, config: DictConfig):
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.verl_mode
        check_config(config, self.verl_mode)
        super().__init__(config)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics)
        if not uses_group_weights(self.config):
            return batch
        fields = ["uid", "response_mask", "old_log_probs", "rollout_log_probs"]
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        padding = [tag.get("is_padding", False) for tag in batch.tags]
        weights, stats = nested_group_weights(rows, self.config.actor_rollout_ref.rollout.n, padding)
        metrics.update(stats)
        output = TensorDict({"rollout_is_weights": weights}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


@register_trainer("gmc_sync")
class GMCTrainerSync(GroupWeights, PPOTrainerSync):
    """verl's ``sync`` trainer with gmc's group weights."""

    verl_mode = "sync"


@register_trainer("gmc_colocate_async")
class GMCTrainerColocateAsync(GroupWeights, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` trainer with gmc's group weights."""

    verl_mode = "colocate_async"


@register_trainer("gmc_separate_async")
class GMCTrainerSeparateAsync(GroupWeights, PPOTrainerSeparateAsync):
    """verl's ``separate_async`` trainer with gmc's group weights."""

    verl_mode = "separate_async"
