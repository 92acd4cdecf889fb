"""dapo_verl.data: DAPO-Math-17k and AIME 2024 to verl's RL parquet schema, deduplicated, with clear input errors."""

from __future__ import annotations

import ast
import doctest
import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dapo_verl.data.schema
from dapo_verl import cli
from dapo_verl.data import (
    MAX_AIME_REPEAT,
    OUTPUT_SCHEMA,
    ConflictPolicy,
    DedupKey,
    PrepareOptions,
    check_verl_schema,
    dapo_prompt,
    prepare_aime,
    prepare_data,
    prepare_train,
    split_dapo_prompt,
)
from tests.data_prep_samples import (
    DAPO_ROWS,
    PREFIX,
    SUFFIX,
    aime_problems,
    dapo_rows,
    write_aime_bytedtsinghua,
    write_aime_h4,
    write_aime_maxwell,
    write_dapo_math,
)

DATA_PACKAGE = Path(__file__).resolve().parents[2] / "dapo_verl" / "data"


@pytest.fixture
def dapo_file(tmp_path: Path) -> Path:
    return write_dapo_math(tmp_path / "data" / "dapo-math-17k.parquet")


@pytest.fixture
def byted_file(tmp_path: Path) -> Path:
    return write_aime_bytedtsinghua(tmp_path / "data" / "aime-2024.parquet")


def _train(path: Path, **options) -> tuple[pa.Table, object]:
    return prepare_train(path, PrepareOptions(**options))


def _messages(table: pa.Table) -> list[list[dict]]:
    return table.column("prompt").to_pylist()


# --- prompt format ---------------------------------------------------------------------------------------------


def test_schema_docstring_examples_run():
    result = doctest.testmod(dapo_verl.data.schema, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0


def test_prompt_template_is_the_published_dapo_text():
    assert dapo_prompt("Find x.") == PREFIX + "Find x." + SUFFIX
    assert 'after "Answer:".' in dapo_prompt("Find x.")
    assert split_dapo_prompt(PREFIX + "Find x." + SUFFIX) == "Find x."
    assert split_dapo_prompt("Find x." + SUFFIX) is None


def test_templated_prompts_are_kept_verbatim_and_raw_problems_are_wrapped(dapo_file):
    table, stats = _train(dapo_file)
    by_id = {
        row["source_id"]: (messages[0]["content"], row["raw_problem"])
        for row, messages in zip(table.column("extra_info").to_pylist(), _messages(table))
    }
    assert by_id["u0"] == (PREFIX + "What is 1+1?" + SUFFIX, "What is 1+1?")
    assert by_id["u8"] == (PREFIX + "Evaluate 10/2." + SUFFIX, "Evaluate 10/2.")  # stored without the template
    assert stats.prompts_built == 1


# --- verl schema -------------------------------------------------------------------------------------------------


def test_train_output_has_verls_rl_schema(dapo_file):
    table, _ = _train(dapo_file)
    assert table.schema.equals(OUTPUT_SCHEMA)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert set(table.column("data_source").to_pylist()) == {"math_dapo"}
    assert all(len(m) == 1 and m[0]["role"] == "user" and "Answer:" in m[0]["content"] for m in _messages(table))
    truths = [r["ground_truth"] for r in table.column("reward_model").to_pylist()]
    assert all(isinstance(t, str) for t in truths) and "-3" in truths
    assert [r["index"] for r in table.column("extra_info").to_pylist()] == list(range(table.num_rows))
    assert {r["split"] for r in table.column("extra_info").to_pylist()} == {"train"}
    assert check_verl_schema(table) == table.num_rows


# --- deduplication -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "conflicts", "rows_out", "dropped"),
    [
        ("prompt", "keep", 6, 0),
        ("prompt", "drop", 5, 1),
        ("uuid", "keep", 9, 0),
        ("uuid", "drop", 7, 2),
        ("prompt_answer", "keep", 7, 0),
        ("prompt_answer", "drop", 5, 2),
    ],
)
def test_dedup_counts_per_key_and_conflict_policy(dapo_file, key, conflicts, rows_out, dropped):
    table, stats = _train(dapo_file, dedup_key=key, conflicts=conflicts)
    assert (table.num_rows, stats.rows_out, stats.conflict_rows_dropped) == (rows_out, rows_out, dropped)
    # The counts under every key are reported whatever key was chosen.
    assert (
        stats.rows_in,
        stats.unique_source_ids,
        stats.unique_prompts,
        stats.unique_prompt_answers,
        stats.conflicting_prompts,
    ) == (DAPO_ROWS, 9, 6, 7, 1)


def test_dropping_conflicts_removes_every_row_of_that_problem(dapo_file):
    table, _ = _train(dapo_file, dedup_key="uuid", conflicts="drop")
    raw = [r["raw_problem"] for r in table.column("extra_info").to_pylist()]
    assert "Find x if x-5=0." not in raw
    assert {r["source_id"] for r in table.column("extra_info").to_pylist()} == {
        "u0",
        "u1",
        "u3",
        "u4",
        "u5",
        "u7",
        "u8",
    }


def test_first_occurrence_in_file_order_is_kept(dapo_file):
    rows = dapo_rows()
    first_conflicting = next(r for r in rows if "x-5=0" in r["prompt"][0]["content"])
    first_repeated = next(r for r in rows if "3*4" in r["prompt"][0]["content"])
    table, stats = _train(dapo_file)
    kept = {r["extra_info"]["raw_problem"]: r for r in table.to_pylist()}
    assert kept["Find x if x-5=0."]["reward_model"]["ground_truth"] == first_conflicting["reward_model"]["ground_truth"]
    assert kept["Compute 3*4."]["extra_info"]["source_id"] == first_repeated["extra_info"]["index"]
    assert (stats.copies_min, stats.copies_max) == (1, 5)  # u8 once; u2 x3 + u6 x2
    assert _train(dapo_file)[0].equals(table)  # deterministic


def test_whitespace_variants_of_a_problem_are_one_prompt(dapo_file):
    table, _ = _train(dapo_file)
    assert sum("2+3" in r["raw_problem"] for r in table.column("extra_info").to_pylist()) == 1


def test_plain_problem_answer_table_is_accepted_and_uuid_key_needs_identifiers(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"problem": ["A?", "B?", "A?"], "answer": ["1", "2", "1"]}), path)
    table, stats = _train(path)
    assert (table.num_rows, stats.prompts_built, stats.unique_source_ids) == (2, 2, None)
    with pytest.raises(ValueError, match=r"dedup key 'uuid' needs extra_info.index.*--dedup-key prompt"):
        _train(path, dedup_key="uuid")


def _uuid_rows(*items):
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": PREFIX + problem + SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule"},
            "extra_info": {"index": uuid},
        }
        for uuid, problem, answer in items
    ]


@pytest.mark.parametrize(
    ("second", "what"),
    [
        (("u1", "What is 2+2?", "4"), "problem text ('What is 1+1?' vs 'What is 2+2?')"),
        (("u1", "What is 1+1?", "3"), "answer ('2' vs '3')"),
    ],
)
def test_uuid_key_refuses_two_problems_under_one_identifier(tmp_path, capsys, second, what):
    path = write_dapo_math(
        tmp_path / "ids.parquet", _uuid_rows(("u0", "Other?", "1"), ("u1", "What is 1+1?", "2"), second)
    )
    with pytest.raises(
        ValueError,
        match=rf"rows 1 and 2 share extra_info.index 'u1' but differ in their "
        rf"{re.escape(what)}; --dedup-key uuid would keep one and drop the other",
    ):
        _train(path, dedup_key="uuid")
    out = tmp_path / "o"
    assert cli.main(["prepare-data", "--dapo-math", str(path), "--dedup-key", "uuid", "--out", str(out)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1 and not out.exists()
    assert _train(path)[0].num_rows >= 2  # the default key tells the problems apart by their text


def test_uuid_key_merges_copies_of_one_problem_whitespace_aside(tmp_path):
    path = write_dapo_math(
        tmp_path / "ids.parquet", _uuid_rows(("u1", "What is 1+1?", "2"), ("u1", "What  is 1+1?\n", " 2"))
    )
    table, stats = _train(path, dedup_key="uuid")
    assert (table.num_rows, stats.copies_max) == (1, 2)


UNSCORABLE = [
    ("   ", r"'   ' is blank \(3 whitespace character\(s\)\)"),
    ("1\n2", r"'1\\n2' spans two lines"),
    ("12\x00", r"'12\\x00' holds the control character '\\x00'"),
    ("7\r8", r"'7\\r8' holds the control character '\\r'"),
]


@pytest.mark.parametrize(("answer", "said"), UNSCORABLE)
def test_a_ground_truth_that_can_never_score_names_the_file_row_and_value(tmp_path, answer, said):
    rows = dapo_rows()
    rows[6] = {**rows[6], "reward_model": {"ground_truth": answer, "style": "rule"}}
    path = write_dapo_math(tmp_path / "bad.parquet", rows)
    with pytest.raises(
        ValueError,
        match=rf"{path} \(DAPO-Math-17k\), row 6: reward_model.ground_truth {said}.*so no "
        r"response can be scored right against it\. Fix or drop that row",
    ):
        _train(path)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"problem": ["A?", "B?"], "answer": ["1", answer]}), plain)
    with pytest.raises(ValueError, match=rf"row 1: reward_model.ground_truth {said}"):
        prepare_aime(plain, PrepareOptions())


def test_float_answers_keep_their_exact_text_and_booleans_or_inexact_floats_are_refused(tmp_path):
    floats = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"problem": ["A?", "B?", "C?"], "answer": [33.0, 0.5, -2.0]}), floats)
    assert [
        r["ground_truth"] for r in prepare_aime(floats, PrepareOptions())[0].column("reward_model").to_pylist()
    ] == ["33", "0.5", "-2"]
    for name, values, said in [
        ("big", [1.0, 1e30], r"row 1: answer is the float 1e\+30, which has no exact decimal"),
        ("nan", [float("nan")], r"row 0: answer is the float nan"),
        ("bool", [True, False], r"row 0: answer is the boolean True, expected a math answer"),
    ]:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"problem": [f"P{i}?" for i in range(len(values))], "answer": values}), path)
        with pytest.raises(ValueError, match=rf"{path}: {said}"):
            prepare_aime(path, PrepareOptions())
    rows = dapo_rows()[:2]
    pq.write_table(
        pa.Table.from_pylist([{**r, "reward_model": {"ground_truth": True}} for r in rows]),
        tmp_path / "verl_bool.parquet",
    )
    with pytest.raises(ValueError, match=r"row 0: reward_model.ground_truth is the boolean True"):
        _train(tmp_path / "verl_bool.parquet")


def test_what_is_accepted_scores_with_verls_math_dapo_and_what_is_refused_cannot():
    math_dapo = pytest.importorskip("verl.utils.reward_score.math_dapo")
    from dapo_verl.data.dedup import unscorable_reason

    accepted = (
        {r["reward_model"]["ground_truth"] for r in dapo_rows()}
        | {a for _, a in aime_problems()}
        | {" 12\n", "1\t2", "0.5", "33", "-3", "1e+30", "true", "\\frac{1}{2}"}
    )
    for answer in accepted:
        assert unscorable_reason(answer) is None, answer
        assert math_dapo.compute_score(f"Some work.\nAnswer: {answer.strip()}", answer)["acc"], answer
    assert not math_dapo.compute_score("Answer: 1\n2", "1\n2")["acc"]  # one line is read: never a match
    assert not math_dapo.compute_score("Answer: 42", "   ")["acc"]  # a blank truth matches no real answer...
    assert math_dapo.compute_score("Answer: $", "   ")["acc"]  # ...only one that normalises to nothing


def test_string_prompt_column_is_read_as_the_problem(tmp_path):
    path = tmp_path / "processed.parquet"
    pq.write_table(
        pa.table(
            {
                "prompt": ["Find y.", PREFIX + "Find z." + SUFFIX],
                "reward_model": [{"ground_truth": "1", "style": "rule"}] * 2,
            }
        ),
        path,
    )
    table, stats = _train(path)
    assert [m[0]["content"] for m in _messages(table)] == [dapo_prompt("Find y."), dapo_prompt("Find z.")]
    assert stats.prompts_built == 1


# --- AIME --------------------------------------------------------------------------------------------------------


def test_aime_bytedtsinghua_is_deduplicated_to_30_problems(byted_file):
    assert pq.read_table(byted_file).num_rows == 960
    table, stats = prepare_aime(byted_file, PrepareOptions())
    assert (table.num_rows, stats.rows_in, stats.copies_min, stats.copies_max) == (30, 960, 32, 32)
    assert "__index_level_0__" not in table.column_names
    assert set(table.column("data_source").to_pylist()) == {"aime-2024"}
    assert {r["ground_truth"] for r in table.column("reward_model").to_pylist()} == {a for _, a in aime_problems()}
    assert sorted(int(r["source_id"]) for r in table.column("extra_info").to_pylist()) == list(range(30))
    assert check_verl_schema(table) == 30


@pytest.mark.parametrize("writer", [write_aime_h4, write_aime_maxwell])
def test_plain_aime_sets_give_the_same_prompts_and_answers(tmp_path, byted_file, writer):
    table, stats = prepare_aime(writer(tmp_path / "plain.parquet"), PrepareOptions())
    reference, _ = prepare_aime(byted_file, PrepareOptions())

    def pairs(t: pa.Table) -> set[tuple[str, str]]:
        truths = [r["ground_truth"] for r in t.column("reward_model").to_pylist()]
        return {(m[0]["content"], truth) for m, truth in zip(_messages(t), truths)}

    assert (table.num_rows, stats.prompts_built) == (30, 30)
    assert pairs(table) == pairs(reference)


def test_aime_integer_answers_lose_leading_zeros(tmp_path):
    path = tmp_path / "aime.parquet"
    pq.write_table(pa.table({"problem": ["P1", "P2"], "answer": ["033", " 7 "]}), path)
    table, _ = prepare_aime(path, PrepareOptions())
    assert [r["ground_truth"] for r in table.column("reward_model").to_pylist()] == ["33", "7"]


def test_aime_with_two_answers_for_one_problem_is_an_error(tmp_path):
    path = tmp_path / "aime.parquet"
    pq.write_table(pa.table({"problem": ["P1", "P1"], "answer": ["1", "2"]}), path)
    with pytest.raises(ValueError, match="appear with different answers"):
        prepare_aime(path, PrepareOptions())


# --- input errors ------------------------------------------------------------------------------------------------


def test_missing_file_wrong_extension_and_directory_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file.*nothing is downloaded"):
        _train(tmp_path / "absent.parquet")
    json_file = tmp_path / "dapo.json"
    json_file.write_text("[]")
    with pytest.raises(ValueError, match=r"extension '.json', expected '.parquet'"):
        _train(json_file)
    folder = tmp_path / "folder.parquet"
    folder.mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        _train(folder)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="cannot be read as parquet"):
        _train(broken)


def test_missing_column_names_the_column_and_the_expected_type(tmp_path):
    path = tmp_path / "no_reward.parquet"
    pq.write_table(pa.table({"prompt": [[{"content": "x", "role": "user"}]]}), path)
    with pytest.raises(ValueError, match=r"no column 'reward_model', expected struct\{ground_truth: string"):
        _train(path)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"question": ["x"]}), other)
    with pytest.raises(ValueError, match=r"no column 'prompt'.*columns present: \['question'\]"):
        _train(other)


def test_wrong_column_type_and_bad_rows_are_reported(tmp_path):
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"prompt": [1], "reward_model": [{"ground_truth": "1"}]}), path)
    with pytest.raises(TypeError, match="column 'prompt' has type int64"):
        _train(path)
    rows = dapo_rows()
    rows[4] = {**rows[4], "prompt": rows[4]["prompt"] * 2}
    with pytest.raises(ValueError, match=r"row 4: 'prompt' holds 2 messages, expected exactly one"):
        _train(write_dapo_math(tmp_path / "two.parquet", rows))
    rows = dapo_rows()
    rows[2] = {**rows[2], "prompt": [{"content": PREFIX + "Half a template", "role": "user"}]}
    with pytest.raises(ValueError, match="row 2: the text has only part of the DAPO prompt template"):
        _train(write_dapo_math(tmp_path / "half.parquet", rows))
    rows = dapo_rows()
    rows[5] = {**rows[5], "prompt": [{"content": PREFIX + "  " + SUFFIX, "role": "user"}]}
    with pytest.raises(ValueError, match="row 5: the problem text is empty"):
        _train(write_dapo_math(tmp_path / "blank.parquet", rows))


def test_empty_input_and_empty_result_are_errors(tmp_path):
    empty = write_dapo_math(tmp_path / "empty.parquet", [])
    with pytest.raises(ValueError, match="has 0 rows"):
        _train(empty)
    path = tmp_path / "all_conflicting.parquet"
    pq.write_table(pa.table({"problem": ["P", "P"], "answer": ["1", "2"]}), path)
    with pytest.raises(ValueError, match=r"no rows left after deduplication.*--conflicts keep"):
        _train(path, conflicts="drop")


def test_bad_options_are_reported():
    with pytest.raises(ValueError, match=r"dedup_key='text' is not one of \['prompt', 'uuid', 'prompt_answer'\]"):
        PrepareOptions(dedup_key="text")
    with pytest.raises(ValueError, match="not scored by math_dapo.*starting with 'aime'"):
        PrepareOptions(aime_data_source="AIME24")
    with pytest.raises(ValueError, match="aime_repeat=-1 must be an integer >= 0"):
        PrepareOptions(aime_repeat=-1)
    assert PrepareOptions(aime_repeat=MAX_AIME_REPEAT).aime_repeat == 1024
    with pytest.raises(
        ValueError,
        match=r"aime_repeat=100,000,000 is above 1024: .*3,000,000,000 rows.*Use "
        r"--aime-repeat 32 \(the paper's avg@32\) or at most 1024",
    ):
        PrepareOptions(aime_repeat=100_000_000)
    assert PrepareOptions(dedup_key="uuid", conflicts="drop").dedup_key is DedupKey.UUID


# --- output checker ----------------------------------------------------------------------------------------------


def test_schema_check_names_the_problem(dapo_file, tmp_path):
    table, _ = _train(dapo_file)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['reward_model'\]"):
        check_verl_schema(table.drop_columns(["reward_model"]))
    renamed = table.set_column(0, "data_source", pa.array(["gsm8k"] * table.num_rows))
    with pytest.raises(ValueError, match="data_source 'gsm8k' is not scored by math_dapo"):
        check_verl_schema(renamed)
    rows = table.to_pylist()
    rows[1]["prompt"] = [{"content": "no instruction", "role": "user"}]
    with pytest.raises(ValueError, match=r"row 1: prompt\[0\].content does not ask for the answer after 'Answer:'"):
        check_verl_schema(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA))
    with pytest.raises(ValueError, match="0 rows"):
        check_verl_schema(table.slice(0, 0))
    with pytest.raises(FileNotFoundError):
        check_verl_schema(tmp_path / "absent.parquet")


# --- CLI ---------------------------------------------------------------------------------------------------------


def test_cli_prepare_data_writes_files_and_prints_counts(dapo_file, byted_file, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(
        [
            "prepare-data",
            "--dapo-math",
            str(dapo_file),
            "--aime",
            str(byted_file),
            "--out",
            str(out),
            "--dedup-key",
            "uuid",
            "--conflicts",
            "drop",
            "--aime-repeat",
            "32",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    assert "unique by prompt text 6 | by prompt+answer 7 | by extra_info.index 9" in printed
    assert "conflicting answers: 1 prompt(s) (drop; 2 row(s) dropped)" in printed
    assert "val-core/aime-2024/acc/mean@32" in printed
    assert f"{out / 'train.parquet'}  (7 rows)" in printed
    assert check_verl_schema(out / "train.parquet") == 7
    assert check_verl_schema(out / "aime-2024.parquet") == 30
    repeated = pq.read_table(out / "aime-2024-x32.parquet")
    counts = {}
    for message in _messages(repeated):
        counts[message[0]["content"]] = counts.get(message[0]["content"], 0) + 1
    assert (repeated.num_rows, set(counts.values()), len(counts)) == (960, {32}, 30)
    report = json.loads((out / "prepare_data.json").read_text())["outputs"]
    assert report["train.parquet"]["dedup"]["conflict_rows_dropped"] == 2
    assert report["train.parquet"]["options"]["dedup_key"] == "uuid"
    assert report["train.parquet"]["input"] == str(dapo_file) and report["aime-2024-x32.parquet"]["rows"] == 960


def test_a_second_run_into_the_folder_keeps_the_entries_of_the_files_it_did_not_rewrite(
    dapo_file, byted_file, tmp_path, capsys
):
    out = tmp_path / "out"
    assert cli.main(["prepare-data", "--dapo-math", str(dapo_file), "--out", str(out), "--conflicts", "drop"]) == 0
    first = json.loads((out / "prepare_data.json").read_text())["outputs"]["train.parquet"]
    assert cli.main(["prepare-data", "--aime", str(byted_file), "--out", str(out)]) == 0
    outputs = json.loads((out / "prepare_data.json").read_text())["outputs"]
    assert set(outputs) == {"train.parquet", "aime-2024.parquet"}
    assert outputs["train.parquet"] == first  # counts, input and options of the first run, untouched
    assert outputs["aime-2024.parquet"]["input"] == str(byted_file) and outputs["aime-2024.parquet"]["rows"] == 30
    assert cli.main(["prepare-data", "--dapo-math", str(dapo_file), "--out", str(out)]) == 0
    again = json.loads((out / "prepare_data.json").read_text())["outputs"]
    assert (
        again["train.parquet"]["options"]["conflicts"] == "keep"
        and again["aime-2024.parquet"] == outputs["aime-2024.parquet"]
    )


def test_an_earlier_flat_manifest_is_converted_and_an_unreadable_one_stops_the_run(
    dapo_file, byted_file, tmp_path, capsys
):
    out = tmp_path / "out"
    assert cli.main(["prepare-data", "--aime", str(byted_file), "--out", str(out)]) == 0
    flat = {
        "options": {"dedup_key": "prompt"},
        "files": {"aime": str(out / "aime-2024.parquet"), "report": str(out / "prepare_data.json")},
        "rows": {"aime": 30},
        "train": None,
        "aime": {"rows_in": 30},
    }
    (out / "prepare_data.json").write_text(json.dumps(flat))
    assert cli.main(["prepare-data", "--dapo-math", str(dapo_file), "--out", str(out)]) == 0
    outputs = json.loads((out / "prepare_data.json").read_text())["outputs"]
    assert outputs["aime-2024.parquet"] == {
        "rows": 30,
        "input": None,
        "options": {"dedup_key": "prompt"},
        "dedup": {"rows_in": 30},
        "written": None,
    }
    (out / "prepare_data.json").write_text("{not json")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert cli.main(["prepare-data", "--dapo-math", str(dapo_file), "--out", str(out)]) == 2
    assert "is not a prepare-data manifest" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    rc = cli.main(["prepare-data", "--dapo-math", str(tmp_path / "absent.parquet"), "--out", str(tmp_path)])
    assert rc == 2
    assert "absent.parquet: no such file" in capsys.readouterr().err
    assert cli.main(["prepare-data", "--out", str(tmp_path)]) == 2
    assert "Nothing to prepare" in capsys.readouterr().err
    assert cli.main(["prepare-data", "--aime", "x.parquet", "--out", str(tmp_path), "--conflicts", "ignore"]) == 2


def test_cli_help_names_every_choice_and_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["prepare-data", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = PrepareOptions()
    for choice in [*DedupKey, *ConflictPolicy]:
        assert choice.value in text
    assert f"{defaults.dedup_key.value} (default" in text and f"{defaults.conflicts.value} (default)" in text
    assert f"default: {defaults.aime_data_source}" in text


# --- boundaries --------------------------------------------------------------------------------------------------


def test_data_package_imports_only_stdlib_pandas_pyarrow_itself_and_the_file_writer():
    # dapo_verl.files, the one atomic writer, imports only the standard library itself (test_import_boundaries.py).
    allowed = {"pyarrow", "pandas", "dapo_verl", "__future__", *sys.stdlib_module_names}
    for source in DATA_PACKAGE.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            for name in names:
                assert name.split(".")[0] in allowed, f"{source.name} imports {name}"
                own = name.startswith(("dapo_verl.data", "dapo_verl.files"))
                assert not name.startswith("dapo_verl.") or own, f"{source.name}: {name}"


def test_prepare_data_needs_an_input(tmp_path):
    with pytest.raises(ValueError, match="Nothing to prepare"):
        prepare_data(out_dir=tmp_path)


# --- failures leave earlier outputs alone ---------------------------------------------------------------------------


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture
def prepared_out(dapo_file, byted_file, tmp_path) -> Path:
    out = tmp_path / "out"
    assert cli.main(["prepare-data", "--dapo-math", str(dapo_file), "--aime", str(byted_file), "--out", str(out)]) == 0
    return out


def test_a_failing_run_replaces_no_earlier_output(prepared_out, byted_file, tmp_path, capsys):
    before = _outputs(prepared_out)
    rows = dapo_rows()
    rows[3] = {**rows[3], "reward_model": {"ground_truth": "", "style": "rule"}}
    bad = write_dapo_math(tmp_path / "bad" / "dapo-math-17k.parquet", rows)
    assert (
        cli.main(["prepare-data", "--dapo-math", str(bad), "--aime", str(byted_file), "--out", str(prepared_out)]) == 2
    )
    assert "ground_truth" in capsys.readouterr().err
    assert _outputs(prepared_out) == before


def test_a_write_that_fails_halfway_replaces_no_earlier_output(
    prepared_out, dapo_file, byted_file, monkeypatch, capsys
):
    import errno
    import os

    before = _outputs(prepared_out)
    real = pq.write_table
    written = []

    def full_disk(table, where, *args, **kwargs):
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
        written.append(where)
        return real(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    assert (
        cli.main(
            [
                "prepare-data",
                "--dapo-math",
                str(dapo_file),
                "--aime",
                str(byted_file),
                "--out",
                str(prepared_out),
                "--conflicts",
                "drop",
            ]
        )
        == 2
    )
    assert "No space left on device" in capsys.readouterr().err
    assert _outputs(prepared_out) == before  # nor any temporary file left behind


def test_out_that_would_overwrite_an_input_is_refused(tmp_path, capsys):
    data = tmp_path / "data"
    aime = write_aime_h4(data / "aime-2024.parquet")
    original = aime.read_bytes()
    assert cli.main(["prepare-data", "--aime", str(aime), "--out", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"would overwrite the input {aime}" in err and "--out" in err
    assert aime.read_bytes() == original


def test_non_utf8_text_names_the_file_row_and_column(tmp_path, capsys):
    import numpy as np

    path = write_aime_h4(tmp_path / "aime.parquet")
    table = pq.read_table(path)
    texts = [s.encode() for s in table.column("problem").to_pylist()]
    texts[7] = b"Find \xff\xfe x."
    offsets = np.cumsum([0] + [len(t) for t in texts]).astype(np.int32)
    raw = pa.Array.from_buffers(
        pa.string(), len(texts), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(texts))]
    )
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("problem"), "problem", raw), bad)
    assert cli.main(["prepare-data", "--aime", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{bad}: row 7" in err and "UTF-8" in err and "0xff" in err


_MESSAGE = [{"content": "What is 1+1?", "role": "user"}]
_RULE = {"ground_truth": "2", "style": "rule"}


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        ({"problem": ["x"], "answer": [["1", "2"]], "id": [1]}, "column 'answer' has type list<element: string>"),
        ({"problem": ["x"], "answer": ["1"], "id": [[1]]}, "column 'id' has type list<element: int64>"),
        (
            {"prompt": [_MESSAGE], "reward_model": [{"ground_truth": ["1"], "style": "rule"}]},
            "column 'reward_model.ground_truth' has type list<element: string>",
        ),
        (
            {"prompt": [[{"content": ["a"], "role": "user"}]], "reward_model": [_RULE]},
            "column 'prompt[].content' has type list<element: string>",
        ),
        (
            {"prompt": [_MESSAGE], "reward_model": [_RULE], "extra_info": [{"index": [1, 2]}]},
            "column 'extra_info.index' has type list<element: int64>",
        ),
        ({"prompt": [_MESSAGE], "reward_model": [_RULE], "ability": [{"a": 1}]}, "column 'ability' has type struct"),
    ],
)
def test_a_column_of_lists_or_structs_where_one_value_is_read_is_refused_naming_it(tmp_path, capsys, columns, named):
    # found by probing: an answer column of lists raised pyarrow's ArrowNotImplementedError with a traceback
    path = tmp_path / "nested.parquet"
    pq.write_table(pa.table(columns), path)
    for flag in ("--dapo-math", "--aime"):
        assert cli.main(["prepare-data", flag, str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert named in err and "expected one value per row" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_null_prompt_is_reported_as_null_and_a_link_loop_as_a_link(tmp_path, capsys):
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"prompt": [_MESSAGE, None], "reward_model": [_RULE, _RULE]}), path)
    with pytest.raises(ValueError, match=r"row 1: 'prompt' is null, expected exactly one"):
        _train(path)
    loop = tmp_path / "loop.parquet"
    loop.symlink_to(loop)  # found by probing: Path.resolve raised RuntimeError("Symlink loop") with a traceback
    assert cli.main(["prepare-data", "--aime", str(loop), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link to" in err and "leads back to itself" in err and "Traceback" not in err
