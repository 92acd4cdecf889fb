"""Small synthetic copies of DAPO-Math-17k and the AIME 2024 files, with the published schemas (DATA_NOTES §1-2).

The template is spelled out here, not imported, so a wrong constant in ``dapo_verl.data`` cannot hide.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
STYLE = "rule-lighteval/MATH_v2"

# (uuid, problem, answer, copies, templated). u5/u6/u7 repeat the problems of u1/u2/u3 under new UUIDs: u5 with
# the same answer, u6 with a conflicting one, u7 with extra whitespace; u8 is stored as a bare problem.
DAPO_PROBLEMS = [
    ("u0", "What is 1+1?", "2", 3, True),
    ("u1", "Compute 3*4.", "12", 3, True),
    ("u2", "Find x if x-5=0.", "5", 3, True),
    ("u3", "求 2+3 的值。", "5", 3, True),
    ("u4", "Let n = 2 - 5. What is n?", "-3", 3, True),
    ("u5", "Compute 3*4.", "12", 2, True),
    ("u6", "Find x if x-5=0.", "7", 2, True),
    ("u7", "求  2+3\n的值。 ", "5", 1, True),
    ("u8", "Evaluate 10/2.", "5", 1, False),
]
DAPO_ROWS = sum(copies for *_, copies, _ in DAPO_PROBLEMS)  # 21

_DAPO_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", pa.struct([("index", pa.string())])),
    ]
)


def dapo_rows(seed: int = 0) -> list[dict]:
    """The DAPO-Math-17k-style rows in a seeded shuffled order (each UUID repeated, as in the real file)."""
    rows = []
    for uuid, problem, answer, copies, templated in DAPO_PROBLEMS:
        content = PREFIX + problem + SUFFIX if templated else problem
        rows += [
            {
                "data_source": "math_dapo",
                "prompt": [{"content": content, "role": "user"}],
                "ability": "MATH",
                "reward_model": {"ground_truth": answer, "style": STYLE},
                "extra_info": {"index": uuid},
            }
        ] * copies
    random.Random(seed).shuffle(rows)
    return rows


def write_dapo_math(path: Path, rows: list[dict] | None = None) -> Path:
    """Write DAPO-Math-17k-style rows (default: :func:`dapo_rows`) with the published Arrow schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows if rows is not None else dapo_rows(), schema=_DAPO_SCHEMA), path)
    return path


def _write_frame(frame: pd.DataFrame, path: Path, *, preserve_index: bool) -> Path:
    """Write with plain ``string`` columns, as the published files have (pandas would write ``large_string``)."""
    table = pa.Table.from_pandas(frame, preserve_index=preserve_index)
    schema = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f for f in table.schema],
        metadata=table.schema.metadata,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.cast(schema), path)
    return path


def aime_problems() -> list[tuple[str, str]]:
    """30 (problem, answer) pairs; problems 3 and 17 share the answer 104, as two AIME 2024 problems do."""
    answers = [str(100 + 7 * i) for i in range(30)]
    answers[3] = answers[17] = "104"
    return [
        (f"AIME problem {i}: find the remainder when {i + 2}^{i + 5} is divided by 1000.", answers[i])
        for i in range(30)
    ]


def write_aime_bytedtsinghua(path: Path, repeats: int = 32) -> Path:
    """BytedTsinghua-SIA/AIME-2024 layout: 30 x ``repeats`` shuffled rows and the stray ``__index_level_0__``."""
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": PREFIX + problem + SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": STYLE},
            "extra_info": {"index": index, "raw_problem": problem, "split": None},
        }
        for index, (problem, answer) in enumerate(aime_problems())
    ] * repeats
    # Shuffling a DataFrame and writing it with its index is how the stray column comes about.
    return _write_frame(pd.DataFrame(rows).sample(frac=1.0, random_state=0), path, preserve_index=True)


def write_aime_h4(path: Path) -> Path:
    """HuggingFaceH4/aime_2024 layout: id, problem, solution, answer (string), url, year."""
    frame = pd.DataFrame(
        [
            {
                "id": 60 + i,
                "problem": problem,
                "solution": f"Worked solution ending in $\\boxed{{{answer}}}$.",
                "answer": answer,
                "url": f"https://example.invalid/{i}",
                "year": "2024",
            }
            for i, (problem, answer) in enumerate(aime_problems())
        ]
    )
    return _write_frame(frame, path, preserve_index=False)


def write_aime_maxwell(path: Path) -> Path:
    """Maxwell-Jia/AIME_2024 layout: ID, Problem, Solution, Answer (int64)."""
    frame = pd.DataFrame(
        [
            {
                "ID": f"2024-{'I' if i < 15 else 'II'}-{i % 15 + 1}",
                "Problem": problem,
                "Solution": "...",
                "Answer": int(answer),
            }
            for i, (problem, answer) in enumerate(aime_problems())
        ]
    )
    return _write_frame(frame, path, preserve_index=False)
