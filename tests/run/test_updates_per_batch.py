"""Several optimizer updates per batch (``updates_per_batch``): the batch's groups in order in
mini-batches, one update each; versions and staleness counted in updates; the later
mini-batches of an on-policy batch take the first update's policy as their behaviour, and a
decoupled loss its proximal policy; a hand-run of the same updates gives the same weights."""

import copy
import dataclasses

import pytest
import torch
from helpers import train

from gmc.io import read_jsonl
from gmc.policy.logprobs import Rows, sequence_logprobs
from gmc.rollouts.sources import read_trace
from gmc.run.config import ConfigError
from gmc.run.summary import without_time
from gmc.run.trainer import Trainer


def test_a_batch_that_does_not_split_into_whole_groups_is_refused(small_config):
    with pytest.raises(ConfigError, match="updates_per_batch"):
        small_config(prompts_per_step=3, updates_per_batch=2)


def test_versions_and_staleness_count_updates_and_the_trace_counts_steps(tmp_path, train_small):
    """d = 1 after a prefill, two updates of two groups per step: step 0 trains the prefill
    (version 0) with updates 0 and 1, step s > 0 the batch of step s - 1 (update 2 (s - 1)) with
    updates 2 s and 2 s + 1: staleness 2 and 3. The trace replays in steps."""
    out = train(tmp_path, "k2", train_small, prompts_per_step=4, updates_per_batch=2, **{"delay.d": 1})
    groups = read_jsonl(out / "groups.jsonl")
    assert [g["consumed_version"] for g in groups] == [u for u in range(6) for _ in range(2)]
    assert [g["version"] for g in groups] == [0] * 4 + [0] * 4 + [2] * 4
    assert [g["staleness"] for g in groups] == [0, 0, 1, 1] + [2, 2, 3, 3] * 2
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["async/staleness_mean"] for m in metrics] == [0.5, 2.5, 2.5]
    trace = read_trace(out / "staleness_trace.jsonl")
    assert [(t["version"], t["consumed_version"]) for t in trace] == [(0, 0)] * 4 + [(0, 1)] * 4 + [(1, 2)] * 4


def test_the_trainer_hands_its_source_versions_in_updates(tmp_path, small_config):
    """Two updates per batch: the source generates step s's batch with the weights of update 2 s
    and labels it so (what its queue holds after the step), and receives the weights of update
    2 (s + 1) after it."""
    cfg = small_config(prompts_per_step=4, updates_per_batch=2, steps=3, **{"delay.d": 1})
    run = Trainer(cfg, tmp_path / "run", progress=False)
    published, publish = [], run.source.publish
    run.source.publish = lambda model, version: (published.append(version), publish(model, version))
    try:
        for s in range(3):
            run.train_step()
            assert {g.version for g in run.source.queued_groups()} == {2 * s}
            run.step += 1
    finally:
        run.close()
    assert published == [2, 4, 6]


def test_a_history_hands_on_its_batches_labelled_in_updates(tmp_path, train_small, small_config):
    """After a history of 2 steps of two updates, a queue of d = 1 starts with the batch the
    history generated with its last version, update 2, from the prompts after its own, and so
    labelled 2 - 4 = -2: every step trains a batch 1 step old, 2 and 3 updates stale, each group
    for the first time; the trace counts the same in steps. A run of one update per batch refuses
    that history."""
    run = dict(prompts_per_step=4, **{"delay.d": 1, "delay.warmup": "history", "delay.history_steps": 2})
    out = train(tmp_path, "k2h", train_small, updates_per_batch=2, **run)
    history = read_jsonl(out / "history" / "groups.jsonl")
    assert [g["consumed_version"] for g in history] == [u for u in range(4) for _ in range(2)]
    groups = read_jsonl(out / "groups.jsonl")
    assert [g["version"] for g in groups] == [-2] * 4 + [0] * 4 + [2] * 4
    assert [g["staleness"] for g in groups] == [2, 2, 3, 3] * 3
    assert {g["reused"] for g in groups} == {False}
    assert not {g["prompt_index"] for g in groups} & {g["prompt_index"] for g in history}
    trace = read_trace(out / "staleness_trace.jsonl")
    assert [(t["version"], t["consumed_version"]) for t in trace] == [(-1, 0)] * 4 + [(0, 1)] * 4 + [(1, 2)] * 4
    with pytest.raises(ConfigError, match=r"made for other settings \(differing: updates_per_batch\)"):
        Trainer(small_config(**run), tmp_path / "k1", progress=False, history=out / "history")


@pytest.mark.parametrize("K", [2, 4])
def test_the_updates_of_an_on_policy_batch_equal_the_same_updates_by_hand(tmp_path, small_config, K):
    """One step of K mini-batches of one group equals, to the bit, K updates made by hand with the
    trainer's parts: the first group on-policy, then each later one with the starting weights'
    log-probs as its behaviour (no new generation in between); the schedule steps once."""
    cfg = small_config(prompts_per_step=K, updates_per_batch=K, steps=1, algorithm="gmc", **{"delay.mode": "sync"})
    run = Trainer(cfg, tmp_path / "run", progress=False)
    try:
        step = run.train_step()
        trained = {k: v.clone() for k, v in run.model.state_dict().items()}
        assert run.scheduler.last_epoch == 1
    finally:
        run.close()
    first, *later = step.groups
    assert [g.consumed_version for g in step.groups] == list(range(K)) and first.behaviour_logp is None

    ref = Trainer(cfg, tmp_path / "ref", progress=False)
    try:
        start = ref.update.group_logprobs(later)
        assert all(torch.equal(lp, g.behaviour_logp) for lp, g in zip(start, later))
        losses = []
        for k, g in enumerate(step.groups):
            groups = [g if k == 0 else dataclasses.replace(g, behaviour_logp=start[k - 1])]
            loss, _, _ = ref.update.backward(groups, k == 0)
            torch.nn.utils.clip_grad_norm_(ref.model.parameters(), cfg.max_grad_norm)
            ref.optimizer.step()
            ref.optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss))
        assert all(torch.equal(trained[k], v) for k, v in ref.model.state_dict().items())
        assert step.metrics["train/loss"] == sum(losses) / K
    finally:
        ref.close()


@pytest.mark.parametrize("algorithm, proximal", [("m2po", True), ("kpop", True), ("tic", False)])
def test_a_decoupled_loss_takes_the_policy_of_the_batchs_first_update_as_its_proximal(
    tmp_path, small_config, monkeypatch, algorithm, proximal
):
    """The later mini-batches of a stale batch get, as ``proximal``, their log-probs under the
    weights before the step's first update; the first gets None (the current policy); an
    estimator without a proximal policy never gets one."""
    from gmc.policy.update import Update

    seen = []
    real = Update.backward

    def spy(self, groups, on_policy, proximal=None):
        seen.append((groups, proximal))
        return real(self, groups, on_policy, proximal)

    monkeypatch.setattr(Update, "backward", spy)
    cfg = small_config(algorithm=algorithm, prompts_per_step=4, updates_per_batch=2, steps=2, **{"delay.d": 1})
    run = Trainer(cfg, tmp_path / "run", progress=False)
    try:
        run.train_step()
        before = copy.deepcopy(run.model)
        seen.clear()
        run.train_step()
    finally:
        run.close()
    (first, none), (second, prox) = seen
    assert none is None
    if not proximal:
        assert prox is None
        return
    rows = Rows.from_groups(second)
    expected = sequence_logprobs(
        before, rows, cfg.micro_batch_tokens, run.tokenizer.pad_token_id, cfg.sampling.temperature
    )
    G = cfg.group_size
    for k, lp in enumerate(prox):
        T = min(lp.shape[1], expected.shape[1])
        assert torch.equal(lp[:, :T], expected[k * G : (k + 1) * G, :T])


def test_a_run_of_two_updates_per_batch_stopped_and_resumed_equals_the_uninterrupted_run(
    tmp_path, small_config, monkeypatch
):
    """Stopped at a step boundary (a stop signal after the second step), the checkpoint resumes to
    the uninterrupted run: metrics, groups and trace."""
    import signal

    from gmc.run.trainer import Preempted
    from gmc.stop import STOP

    cfg = small_config(prompts_per_step=4, updates_per_batch=2, steps=4, algorithm="m2po", **{"delay.d": 1})
    Trainer(cfg, tmp_path / "straight", progress=False).run()
    real = Trainer.train_step

    def stop_after_two(self):
        out = real(self)
        if self.step == 1:
            STOP.received.append(signal.SIGTERM)
        return out

    monkeypatch.setattr(Trainer, "train_step", stop_after_two)
    with pytest.raises(Preempted):
        Trainer(cfg, tmp_path / "stopped", progress=False).run()
    monkeypatch.setattr(Trainer, "train_step", real)
    Trainer(cfg, tmp_path / "stopped", resume=True, progress=False).run()
    for name in ("metrics.jsonl", "groups.jsonl", "staleness_trace.jsonl"):
        a, b = read_jsonl(tmp_path / "straight" / name), read_jsonl(tmp_path / "stopped" / name)
        if name == "metrics.jsonl":
            a, b = without_time(a), without_time(b)
        assert a == b, name


def test_a_checkpoint_that_counts_versions_in_steps_is_refused_where_steps_and_updates_differ(tmp_path, small_config):
    """A checkpoint without the mark of versions counted in updates (a previous release's) is refused
    by a run of several updates per step, whose queue it would mislabel, and resumed by one of one."""
    from gmc.run.rundir import CheckpointError

    for k in (1, 2):
        cfg = small_config(prompts_per_step=4, updates_per_batch=k, steps=2, checkpoint_every=1, **{"delay.d": 1})
        run = Trainer(cfg, tmp_path / f"k{k}", progress=False)
        try:
            run.train_step()
            run.step += 1
            run.save_checkpoint()
        finally:
            run.close()
        state = torch.load(run.ckpt_path, weights_only=False)
        assert state.pop("version_unit") == "update"
        torch.save(state, run.ckpt_path)
        if k == 1:
            Trainer(cfg, tmp_path / f"k{k}", resume=True, progress=False).close()
        else:
            with pytest.raises(CheckpointError, match="labels the queued groups' versions in steps"):
                Trainer(cfg, tmp_path / f"k{k}", resume=True, progress=False)
