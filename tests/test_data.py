"""Data loading, normalisation, the synthetic task and prompt formatting."""

import json

import pytest

from gmc.answers import last_boxed, normalize_gold
from gmc.data import (
    BENCHMARKS,
    INSTRUCTION,
    PLAIN_TEMPLATE,
    DataError,
    format_prompt,
    load_dataset,
    load_file,
)
from gmc.settings import ConfigError
from gmc.synthetic import SyntheticTask, eval_expression, solution_steps

EXPECTED_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva_math": 272, "olympiadbench": 675}


@pytest.mark.parametrize(
    "raw, norm",
    [("025", "25"), (25, "25"), (27.0, "27"), ("27.0", "27"), ("-1.0", "-1"), (" $\\frac12$ ", "\\frac12"),
     (["69", "84"], "69,84"), ("0.5", "0.5"), ("\\pi", "\\pi")],
)
def test_normalize_gold(raw, norm):
    assert normalize_gold(raw) == norm


def test_last_boxed_nested():
    assert last_boxed("\\boxed{a} and \\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{a} \\boxed{b") == "a"
    assert last_boxed("nothing") is None


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmarks_load_locally(shared_data, name):
    records = load_dataset(name, root=shared_data)
    assert len(records) == EXPECTED_SIZES[name]
    assert all(r.problem and r.answer and r.source == name for r in records)
    assert len({r.id for r in records}) == len(records)


def test_gold_answers_are_normalised(shared_data):
    aime24 = load_dataset("aime24", root=shared_data)
    assert all(not r.answer.startswith("0") for r in aime24)
    amc = load_dataset("amc23", root=shared_data)
    assert amc[0].answer == "27" and all(".0" not in r.answer for r in amc)
    assert load_dataset("aime25", root=shared_data)[0].answer == "70"


def test_training_set_and_duplicates_reported(shared_data, caplog):
    records = load_dataset("math", root=shared_data)
    assert len(records) == 7470
    assert "duplicate problem" in caplog.text


def test_unknown_name_and_bad_source():
    with pytest.raises(DataError, match="unknown dataset 'math501'.*math500"):
        load_dataset("math501")
    with pytest.raises(DataError, match="data.source"):
        load_dataset("math500", source="ftp")


def test_hub_failure_names_the_setting(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="data.source: local"):
        load_dataset("aime25", source="hub")


def test_bad_files_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON"):
        load_file(bad)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"problem": "1+1", "answer": "2"}\n\n{"problem": "2+2"}\n')
    with pytest.raises(DataError, match=r"missing\.jsonl:3: missing or empty field 'answer'"):
        load_file(missing)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="holds no rows"):
        load_file(empty)
    with pytest.raises(DataError, match="file not found"):
        load_file(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="unsupported format"):
        (tmp_path / "x.csv").write_text("a")
        load_file(tmp_path / "x.csv")


def test_json_and_parquet_files(tmp_path):
    import pandas as pd

    rows = [{"problem": "p1", "answer": 3.0, "extra": 1}, {"problem": "p2", "answer": "007"}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"data": rows}))
    pd.DataFrame([{"problem": "p1", "answer": "3.0"}, {"problem": "p2", "answer": "007"}]).to_parquet(tmp_path / "c.parquet")
    for name in ("a.json", "b.json", "c.parquet"):
        recs = load_file(tmp_path / name)
        assert [r.answer for r in recs] == ["3", "7"]
    assert load_file(tmp_path / "a.json")[0].meta["extra"] == 1


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


def test_synthetic_errors():
    with pytest.raises(ConfigError, match="synthetic.operators: must be a non-empty subset of"):
        SyntheticTask(operators="/")
    with pytest.raises(ConfigError, match=r"synthetic.max_operands: must be >= min_operands \(4\)"):
        SyntheticTask(min_operands=4)
    with pytest.raises(DataError, match="split"):
        SyntheticTask().generate("valid", 3)
    with pytest.raises(DataError, match="not an arithmetic expression"):
        eval_expression("2**3")


def test_prompt_formats():
    class Plain:
        chat_template = None

    assert format_prompt(Plain(), "Compute 1+1.") == PLAIN_TEMPLATE.format(problem="Compute 1+1.")

    class Chat:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt, enable_thinking):
            return f"<user>{messages[0]['content']}</user><think={enable_thinking}>"

    out = format_prompt(Chat(), "Compute 1+1.", thinking=True)
    assert INSTRUCTION in out and "<think=True>" in out
