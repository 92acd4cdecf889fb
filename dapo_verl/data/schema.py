"""verl's RL parquet schema for DAPO data, the DAPO prompt template, and a checker for written files.

A row that verl's ``RLHFDataset`` and the ``dapo``/``naive`` reward managers read:

* ``data_source`` (string): picks the scorer. verl's ``default_compute_score`` sends ``math_dapo``, ``math``,
  ``math_dapo_reasoning`` and every name starting with ``aime`` to ``math_dapo.compute_score``
  (+1 / -1 on the last ``Answer:`` line); any other name raises ``NotImplementedError`` at reward time.
* ``prompt`` (list of one ``{content, role="user"}`` struct): the chat messages; verl applies the model's chat
  template in the agent loop.
* ``ability`` (string, not read by verl), ``reward_model`` (struct ``{ground_truth: string, style: string}``;
  only ``ground_truth`` is read), ``extra_info`` (struct; verl reads ``index`` and passes the rest to the scorer).

The user message follows the DAPO paper's template (arXiv 2503.14476; the same text as every row of
BytedTsinghua-SIA/DAPO-Math-17k and AIME-2024): ``DAPO_PROMPT_PREFIX + problem + DAPO_PROMPT_SUFFIX``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dapo_verl.files import atomic_write

__all__ = [
    "DAPO_PROMPT_PREFIX",
    "DAPO_PROMPT_SUFFIX",
    "MATH_DAPO_DATA_SOURCES",
    "OUTPUT_SCHEMA",
    "check_verl_schema",
    "dapo_prompt",
    "is_math_dapo_data_source",
    "normalize_text",
    "split_dapo_prompt",
    "write_parquet",
]

DAPO_PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
"""The instruction that opens every DAPO user message (followed by the problem)."""

DAPO_PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
"""The reminder that closes every DAPO user message."""

MATH_DAPO_DATA_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
"""Names verl's ``default_compute_score`` routes to ``math_dapo`` (besides any name starting with ``aime``)."""

_MESSAGE = pa.struct([("content", pa.string()), ("role", pa.string())])
OUTPUT_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("source_id", pa.string()),
                    ("raw_problem", pa.string()),
                    ("split", pa.string()),
                ]
            ),
        ),
    ]
)
"""The Arrow schema of every file this package writes (the DAPO-Math-17k layout, with an integer ``index``)."""


def dapo_prompt(problem: str) -> str:
    """The DAPO user message for a raw problem.

    Example:
        >>> dapo_prompt("1+1?").endswith('1+1?\\n\\nRemember to put your answer on its own line after "Answer:".')
        True
    """
    return DAPO_PROMPT_PREFIX + problem + DAPO_PROMPT_SUFFIX


def split_dapo_prompt(text: str) -> str | None:
    """The problem inside a DAPO user message, or None when ``text`` is not in the template.

    Example:
        >>> split_dapo_prompt(dapo_prompt("Find x.")), split_dapo_prompt("Find x.")
        ('Find x.', None)
    """
    if len(text) < len(DAPO_PROMPT_PREFIX) + len(DAPO_PROMPT_SUFFIX):
        return None
    if text.startswith(DAPO_PROMPT_PREFIX) and text.endswith(DAPO_PROMPT_SUFFIX):
        return text[len(DAPO_PROMPT_PREFIX) : len(text) - len(DAPO_PROMPT_SUFFIX)]
    return None


def normalize_text(text: str) -> str:
    """The deduplication form of a text: leading/trailing whitespace removed, inner runs of whitespace made one space.

    Example:
        >>> normalize_text("  Find\\n x.  ")
        'Find x.'
    """
    return " ".join(text.split())


def is_math_dapo_data_source(name: str) -> bool:
    """Whether verl's ``default_compute_score`` scores ``name`` with ``math_dapo`` (verl 0.9.x routing rule)."""
    return name in MATH_DAPO_DATA_SOURCES or name.startswith("aime")


def write_parquet(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` atomically (:func:`dapo_verl.files.atomic_write`); returns ``path``."""
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def _fail(where: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{where}: {what}. {fix}")


def _check_types(table: pa.Table, where: str) -> None:
    fix = "Write the file with dapo_verl.data (OUTPUT_SCHEMA) or convert it to verl's RL layout."
    required = ("data_source", "prompt", "reward_model", "extra_info")
    missing = [name for name in required if name not in table.schema.names]
    if missing:
        raise _fail(
            where,
            f"missing column(s) {missing}; verl's RLHFDataset and reward managers read data_source, "
            f"prompt, reward_model.ground_truth and extra_info (present: {table.schema.names})",
            fix,
        )
    types = {name: table.schema.field(name).type for name in table.schema.names}
    expected = {
        "data_source": pa.types.is_string(types["data_source"]),
        "prompt": pa.types.is_list(types["prompt"]) and types["prompt"].value_type.equals(_MESSAGE),
        "reward_model": pa.types.is_struct(types["reward_model"])
        and types["reward_model"].get_field_index("ground_truth") >= 0
        and pa.types.is_string(types["reward_model"].field("ground_truth").type),
        "extra_info": pa.types.is_struct(types["extra_info"]) and types["extra_info"].get_field_index("index") >= 0,
    }
    for name, ok in expected.items():
        if not ok:
            expected_type = OUTPUT_SCHEMA.field(name).type
            raise _fail(where, f"column {name!r} has type {types[name]}, expected {expected_type}", fix)


def _first_bad_row(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first True (or null) in a boolean array of "bad" flags, else None."""
    filled = pc.fill_null(mask, True)
    return int(pc.index(filled, True).as_py()) if pc.any(filled).as_py() else None


def _check_values(table: pa.Table, where: str) -> None:
    fix = "Regenerate the file with `dapo-verl prepare-data`."
    lengths = pc.list_value_length(table["prompt"])
    if (row := _first_bad_row(pc.not_equal(lengths, 1))) is not None:
        raise _fail(
            where, f"row {row}: prompt holds {lengths[row].as_py()} messages, expected exactly 1 user message", fix
        )
    messages = pc.list_flatten(table["prompt"])
    checks = {
        "prompt[0].role is not 'user'": pc.not_equal(pc.struct_field(messages, "role"), "user"),
        "prompt[0].content does not ask for the answer after 'Answer:'": pc.invert(
            pc.match_substring(pc.struct_field(messages, "content"), "Answer:")
        ),
        "reward_model.ground_truth is null or empty": pc.equal(
            pc.utf8_length(pc.struct_field(table["reward_model"], "ground_truth")), 0
        ),
    }
    for what, bad in checks.items():
        if (row := _first_bad_row(bad)) is not None:
            raise _fail(where, f"row {row}: {what}", fix)
    for name in pc.unique(pc.fill_null(table["data_source"], "")).to_pylist():
        if not is_math_dapo_data_source(name):
            raise _fail(
                where,
                f"data_source {name!r} is not scored by math_dapo in verl's default_compute_score",
                f"Use one of {list(MATH_DAPO_DATA_SOURCES)} or a name starting with 'aime'.",
            )


def check_verl_schema(data: pa.Table | str | os.PathLike[str]) -> int:
    """Check that a table (or a parquet file) is a DAPO dataset verl can load and score; return its row count.

    Checks the columns verl reads and their Arrow types, one user message per prompt that asks for the
    answer after ``Answer:``, a non-empty string ground truth, and a ``data_source`` that verl routes to
    ``math_dapo``.

    Args:
        data: A ``pyarrow.Table`` or the path of a parquet file.

    Returns:
        The number of rows (at least 1).

    Raises:
        FileNotFoundError: if the path does not exist.
        ValueError: naming the column, row and expectation of the first problem found, or for an empty table.
    """
    where = "table"
    if not isinstance(data, pa.Table):
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; pass the parquet written by `dapo-verl prepare-data`.")
        where, data = str(path), pq.read_table(path)
    if data.num_rows == 0:
        raise _fail(where, "0 rows", "An empty file trains nothing; check the input data and filters.")
    _check_types(data, where)
    _check_values(data, where)
    return data.num_rows
