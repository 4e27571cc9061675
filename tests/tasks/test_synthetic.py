"""The synthetic arithmetic task: seeded, disjoint splits and correct answers, and its errors."""

import pytest

from gmc.settings import ConfigError
from gmc.tasks.datasets import (
    DataError,
)
from gmc.tasks.synthetic import SyntheticTask, eval_expression, solution_steps


def test_synthetic_task_is_seeded_disjoint_and_correct():
    task = SyntheticTask()
    train = task.generate("train", 500, seed=0)
    test = task.generate("test", 200, seed=0)
    assert [r.problem for r in train] == [r.problem for r in task.generate("train", 500, seed=0)]
    assert not {r.problem for r in train} & {r.problem for r in test}
    assert len({r.problem for r in train}) == 500
    for r in train[:100]:
        expr = r.meta["expression"]
        assert int(r.answer) == eval(expr)  # the reference evaluator of the test, not the library
        assert solution_steps(expr).endswith(f"\\boxed{{{r.answer}}}")
    hard = SyntheticTask(min_operands=4, max_operands=5, min_digits=2, max_digits=3, operators="*")
    assert all(r.problem.count("*") >= 3 for r in hard.generate("test", 20))
    # a validation split takes its share from the train split alone: test stays as it was
    held = SyntheticTask(validation_fraction=0.1)
    validation = held.generate("validation", 200, seed=0)
    assert [r.problem for r in held.generate("test", 200, seed=0)] == [r.problem for r in test]
    assert not {r.problem for r in validation} & (
        {r.problem for r in held.generate("train", 2000)} | {r.problem for r in test}
    )


def test_synthetic_errors():
    with pytest.raises(ConfigError, match="synthetic.operators: must be a non-empty subset of"):
        SyntheticTask(operators="/")
    with pytest.raises(ConfigError, match=r"synthetic.max_operands: must be >= min_operands \(4\)"):
        SyntheticTask(min_operands=4)
    with pytest.raises(DataError, match="split"):
        SyntheticTask().generate("valid", 3)
    with pytest.raises(DataError, match="no validation split"):
        SyntheticTask().generate("validation", 3)
    with pytest.raises(ConfigError, match="synthetic.validation_fraction: test_fraction \\+ validation_fraction"):
        SyntheticTask(test_fraction=0.5, validation_fraction=0.5)
    with pytest.raises(DataError, match="not an arithmetic expression"):
        eval_expression("2**3")
