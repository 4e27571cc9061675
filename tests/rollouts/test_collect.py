"""The collector on its own: prompts -> generate -> grade -> behaviour log-probs -> groups, with
its measurements returned (no trainer involved), and the prompt cursor."""

import pytest
import torch

from gmc.policy.logprobs import sequence_logprobs
from gmc.rollouts.collect import (
    Collector,
    PromptCursor,
    RunRollouts,
    rollout_metrics,
    training_records,
)
from gmc.rollouts.engines import SamplingConfig
from gmc.rollouts.hf_engine import HFEngine
from gmc.tasks.grading import Grader
from gmc.tasks.synthetic import SyntheticTask


@pytest.fixture(scope="module")
def parts(tiny_policy):
    model, tokenizer = tiny_policy
    grader = Grader()
    yield model, tokenizer, grader
    grader.close()


def collector(parts, behaviour, seed=0):
    model, tokenizer, grader = parts
    engine = HFEngine(model, tokenizer, seed=seed)
    pad = tokenizer.pad_token_id
    return Collector(
        engine,
        tokenizer,
        grader,
        group_size=3,
        sampling=SamplingConfig(max_new_tokens=16),
        behaviour=behaviour,
        logprobs=lambda rows: sequence_logprobs(model, rows, 0, pad),
    )


RECORDS = SyntheticTask().generate("train", 20, seed=0)


@pytest.mark.parametrize("behaviour", ["none", "sampler", "trainer"])
def test_groups_carry_their_prompts_version_grades_and_behaviour_logprobs(parts, behaviour):
    picked = [(4, RECORDS[4]), (11, RECORDS[11])]
    out = collector(parts, behaviour).collect(picked, version=7)
    assert [g.prompt_index for g in out.groups] == [4, 11] and {g.version for g in out.groups} == {7}
    _, tokenizer, grader = parts
    for (_, record), g in zip(picked, out.groups):
        assert g.response_ids.shape == g.response_mask.shape == g.sampler_logp.shape and g.response_ids.shape[0] == 3
        texts = [
            tokenizer.decode(ids[mask], skip_special_tokens=True) for ids, mask in zip(g.response_ids, g.response_mask)
        ]
        assert g.rewards.tolist() == [x.reward for x in grader.grade_batch(texts, [record.answer] * 3)]
        assert tokenizer.decode(g.prompt_ids).endswith("Solution:")
        if behaviour == "none":
            assert g.behaviour_logp is None
        elif behaviour == "sampler":
            assert g.behaviour_logp is g.sampler_logp
        else:  # the trainer's numerics, within float32 rounding of the sampler's
            assert g.behaviour_logp is not g.sampler_logp
            torch.testing.assert_close(g.behaviour_logp, g.sampler_logp, rtol=0, atol=1e-4)
    stats = out.stats
    assert stats.samples == 6 and stats.tokens == sum(int(g.lengths.sum()) for g in out.groups)
    assert stats.reward_sum == sum(float(g.rewards.sum()) for g in out.groups)
    assert (stats.mismatch is None) == (behaviour != "trainer") and stats.seconds >= stats.behaviour_seconds >= 0


def test_the_collector_keeps_no_state_between_calls(parts):
    """The same prompts with a fresh engine of the same seed give the same groups, whatever came before."""
    a = collector(parts, "sampler", seed=3)
    a.collect([(0, RECORDS[0])], version=0)  # an earlier call of this engine
    first = a.collect([(1, RECORDS[1])], version=1).groups[0]
    b = collector(parts, "sampler", seed=3)
    b.engine.set_generator_state(a.engine.generator_state() | {"calls": 1})
    again = b.collect([(1, RECORDS[1])], version=1).groups[0]
    assert torch.equal(first.response_ids, again.response_ids) and torch.equal(first.rewards, again.rewards)


def test_rollout_metrics_sum_the_calls_of_a_step(parts):
    c = collector(parts, "trainer")
    stats = [c.collect([(i, RECORDS[i])], version=0).stats for i in range(3)]
    metrics = rollout_metrics(stats)
    assert metrics["rollout/samples"] == 9 and metrics["rollout/generate_calls"] == 3
    assert metrics["rollout/reward_mean"] == pytest.approx(sum(s.reward_sum for s in stats) / 9)
    assert metrics["rollout/logp_mismatch_max"] == max(s.mismatch for s in stats)
    assert rollout_metrics([]) == {}


def test_the_cursor_walks_a_seeded_permutation_per_epoch_and_resumes():
    records = training_records("synthetic", SyntheticTask(), seed=0)[:7]
    cursor = PromptCursor(records, seed=5)
    first = cursor.take(10)  # crosses into the second epoch
    assert sorted(first[:7]) == list(range(7)) and len(set(first[7:])) == 3
    resumed = PromptCursor(records, seed=5)
    resumed.load_state_dict(cursor.state_dict())
    assert resumed.take(4) == cursor.take(4)
    rollouts = RunRollouts(PromptCursor(records, seed=5), collector=None)
    assert rollouts.take(10) == first
