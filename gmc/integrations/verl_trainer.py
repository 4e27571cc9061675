"""verl's v1 trainers with gmc's group weights (verl 0.9), loaded by
``VERL_USE_EXTERNAL_MODULES=gmc.integrations.verl_trainer`` (verl imports the module in every
process; it imports :mod:`gmc.integrations.verl`, the losses). It imports verl's whole v1 trainer
stack, and so needs TransferQueue; no entry point loads it, so that ``import verl`` stays light for
a run with verl's own trainers.

verl's driver is the one place that sees a whole group: its policy losses see micro-batches, whose
rows verl's batch balancing has reordered, so the groups are known only by ``uid``. Each trainer
here is one of verl's, registered with verl's ``register_trainer`` under ``gmc_<mode>``
(``trainer.v1.trainer_mode=gmc_sync``, ``gmc_colocate_async``, ``gmc_separate_async``), and runs
as verl's mode of that name (the configuration's ``trainer_mode`` is set back to it, so verl's
settings of the mode and its replay buffer apply). After verl has computed the advantages, a
trainer whose loss is group-weighted (``gmc_gmc``) reads each row's ``uid`` and log-probs, computes
the weights by ``uid`` (:func:`gmc.integrations.verl.group_weights`) and writes them, on every
valid token of their row, as the rows' ``rollout_is_weights``, which verl's actor hands to the
policy loss; at construction it switches the loss to its internal name
(:data:`gmc.integrations.verl.GROUP_WEIGHTED_LOSS_MODES`), the one loss that reads them as group
weights. The configuration is checked at construction (:func:`gmc.integrations.verl.check_config`),
for every ``gmc_<name>`` loss. A trainer of one's own takes the same step by putting
:class:`GroupWeights` before its verl base class.
"""

from __future__ import annotations

import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSeparateAsync, PPOTrainerSync, register_trainer

from gmc.integrations.verl import GROUP_WEIGHTED_LOSS_MODES, check_config, nested_group_weights, uses_group_weights


class GroupWeights:
    """Before a verl ``PPOTrainer`` class: its mode (:attr:`verl_mode`), the configuration checked,
    a group-weighted loss switched to its internal name, and gmc's group weights added after the
    advantages."""

    verl_mode: str = "sync"
    """The verl trainer mode this trainer runs as."""

    def __init__(self, config: DictConfig):
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.verl_mode
        check_config(config, self.verl_mode)
        policy_loss = config.actor_rollout_ref.actor.policy_loss
        policy_loss.loss_mode = GROUP_WEIGHTED_LOSS_MODES.get(policy_loss.loss_mode, policy_loss.loss_mode)
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
