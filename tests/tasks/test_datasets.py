"""The benchmarks and training sets: local loading, gold normalisation, files named with the line
at fault, the registry's labels and sample counts, and prompt formats."""

import json

import pytest

from gmc.run.evaluate import DEFAULT_SAMPLES, EvalConfig
from gmc.tasks.datasets import (
    BENCHMARKS,
    INSTRUCTION,
    PLAIN_TEMPLATE,
    REFERENCE_SOLUTION_FIELDS,
    DataError,
    benchmark_specs,
    format_prompt,
    load_dataset,
    load_file,
)


def test_long_integer_answers_load_as_text(tmp_path):
    from gmc.tasks.datasets import load_file

    big = "1" + "0" * 4_999
    data = tmp_path / "train.jsonl"
    data.write_text(f'{{"problem": "p", "answer": {big}}}\n{{"problem": "q", "answer": "000{big}"}}\n')
    assert [r.answer for r in load_file(data)] == [big, big]


def test_benchmarks_carry_label_k_and_reference_solutions():
    assert list(benchmark_specs()) == ["synthetic", *BENCHMARKS]
    assert all(spec.label for spec in benchmark_specs().values())
    assert DEFAULT_SAMPLES == {
        "synthetic": 4,
        "math500": 4,
        "aime24": 16,
        "aime25": 16,
        "amc23": 16,
        "minerva_math": 4,
        "olympiadbench": 4,
    }
    assert EvalConfig().k_for("aime25") == 16 and EvalConfig(samples={"aime25": 2}).k_for("aime25") == 2
    assert set(REFERENCE_SOLUTION_FIELDS) == {"math500", "aime24", "minerva_math", "olympiadbench"}


EXPECTED_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva_math": 272, "olympiadbench": 675}


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
    with pytest.raises(DataError, match="data_source"):
        load_dataset("math500", source="ftp")


def test_hub_failure_names_the_setting(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="data_source: local"):
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
    pd.DataFrame([{"problem": "p1", "answer": "3.0"}, {"problem": "p2", "answer": "007"}]).to_parquet(
        tmp_path / "c.parquet"
    )
    for name in ("a.json", "b.json", "c.parquet"):
        recs = load_file(tmp_path / name)
        assert [r.answer for r in recs] == ["3", "7"]
    assert load_file(tmp_path / "a.json")[0].meta["extra"] == 1


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
