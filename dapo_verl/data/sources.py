"""Read local copies of the DAPO training and AIME validation parquet files, row by row, with clear input errors.

Two source layouts are accepted (``SourceLayout``):

* ``verl``: the layout of BytedTsinghua-SIA/DAPO-Math-17k and BytedTsinghua-SIA/AIME-2024 -- ``prompt`` as a
  list of one ``{content, role="user"}`` message (or a plain string, as in open-r1/DAPO-Math-17k-Processed),
  ``reward_model.ground_truth``, and optionally ``extra_info.index`` (a UUID in DAPO-Math-17k, 0-29 in
  AIME-2024), ``ability`` and ``reward_model.style``. Extra columns such as ``__index_level_0__`` are ignored.
* ``problem_answer``: plain problem/answer tables -- ``problem``/``answer``/``id`` (HuggingFaceH4/aime_2024)
  or ``Problem``/``Answer``/``ID`` (Maxwell-Jia/AIME_2024). Integer answers become strings.

An answer column of floats is read as whole numbers (``33.0`` -> ``"33"``) and plain decimals (``0.5``); a float with
no exact decimal form (``1e+30``, ``1e-05``, inf, NaN) and a boolean answer are errors naming the row: math_dapo
compares the answer's text, and that text is not what the problem's author wrote.

Files are streamed in record batches, so the 1.79M-row DAPO-Math-17k file never sits in memory as Python
objects at once. Nothing is downloaded.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["SourceLayout", "SourceRow", "SourceTable", "open_source"]

_BATCH_ROWS = 65_536
_PLAIN_COLUMNS = (("problem", "answer", "id"), ("Problem", "Answer", "ID"))
_VERL_EXPECTED = {
    "prompt": "list<struct{content: string, role: string}> holding one user message (or a string)",
    "reward_model": "struct{ground_truth: string, style: string}",
}


class SourceLayout(StrEnum):
    """The column layout of an input file (see the module docstring)."""

    VERL = "verl"
    PROBLEM_ANSWER = "problem_answer"


class SourceRow(NamedTuple):
    """One input row: the text exactly as stored and what travels with it."""

    row: int
    """Row number in the file (0-based)."""
    text: str
    """The user message content, or the raw problem for ``problem_answer`` files."""
    ground_truth: str
    source_id: str | None
    """``extra_info.index`` / ``id`` / ``ID`` as a string; None when the file has no identifier."""
    ability: str | None
    style: str | None


def _fail(path: Path, dataset: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{path}: {what} ({dataset}). {fix}")


def _open_parquet(path: str | os.PathLike[str], dataset: str) -> tuple[Path, pq.ParquetFile]:
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():
        raise _fail(
            path,
            dataset,
            f"is a symbolic link to {os.readlink(path)!r}, which does not exist or leads back to itself",
            "Pass the parquet file itself, or fix the link.",
        )
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no such file ({dataset}). Pass the path of a local copy; nothing is downloaded."
        )
    if not path.is_file():
        raise _fail(path, dataset, "is a directory, not a file", "Pass the .parquet file inside it.")
    if path.suffix.lower() != ".parquet":
        raise _fail(
            path,
            dataset,
            f"has extension {path.suffix or '(none)'!r}, expected '.parquet'",
            "Pass the parquet file of the dataset (e.g. data/dapo-math-17k.parquet).",
        )
    try:
        return path, pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise _fail(path, dataset, f"cannot be read as parquet: {err}", "Check that the file is complete.") from err


@dataclass(frozen=True)
class SourceTable:
    """An opened input file. Build with :func:`open_source`; iterate rows with :meth:`rows`."""

    path: Path
    dataset: str
    layout: SourceLayout
    num_rows: int
    columns: dict[str, str]
    """Role -> column name: ``text``, ``answer`` and, when present, ``id``, ``ability``."""
    _file: pq.ParquetFile

    def rows(self) -> Iterator[SourceRow]:
        """Yield every row in file order.

        Raises:
            ValueError: at the first row without exactly one user message, or without a ground truth.
        """
        start = 0
        for batch in self._file.iter_batches(batch_size=_BATCH_ROWS, columns=sorted(set(self.columns.values()))):
            if self.layout is SourceLayout.VERL:
                texts, answers, styles = self._verl_columns(batch, start)
            else:
                texts = self._strings(batch.column(self.columns["text"]), start, "text")
                answers, styles = self._answers(batch.column(self.columns["answer"]), start, "answer"), None
            ids = self._optional_strings(batch, "id", start)
            abilities = self._optional_strings(batch, "ability", start)
            for offset, text in enumerate(texts):
                yield SourceRow(
                    start + offset,
                    text,
                    answers[offset],
                    ids[offset],
                    abilities[offset],
                    styles[offset] if styles else None,
                )
            start += batch.num_rows

    def _verl_columns(self, batch: pa.RecordBatch, start: int) -> tuple[list[str], list[str], list[str | None] | None]:
        prompt = batch.column("prompt")
        if prompt.null_count:
            row = int(pc.index(pc.is_null(prompt), True).as_py())
            raise self._row_error(start + row, "'prompt' is null", "exactly one {role: 'user', content: ...} message")
        if pa.types.is_list(prompt.type):
            lengths = pc.list_value_length(prompt)
            if not pc.all(pc.equal(lengths, 1)).as_py():
                row = int(pc.index(pc.not_equal(lengths, 1), True).as_py())
                raise self._row_error(
                    start + row,
                    f"'prompt' holds {lengths[row].as_py()} messages",
                    "exactly one {role: 'user', content: ...} message",
                )
            messages = pc.list_flatten(prompt)
            roles = pc.struct_field(messages, "role")
            if not pc.all(pc.equal(pc.fill_null(roles, ""), "user")).as_py():
                row = int(pc.index(pc.not_equal(pc.fill_null(roles, ""), "user"), True).as_py())
                raise self._row_error(start + row, f"'prompt' message has role {roles[row].as_py()!r}", "role 'user'")
            prompt = pc.struct_field(messages, "content")
        reward_model = batch.column("reward_model")
        answers = self._answers(pc.struct_field(reward_model, "ground_truth"), start, "reward_model.ground_truth")
        style = None
        if reward_model.type.get_field_index("style") >= 0:
            style = self._python(pc.struct_field(reward_model, "style"), start, "reward_model.style")
        return self._strings(prompt, start, "prompt content"), answers, style

    def _strings(self, values: pa.Array, start: int, what: str) -> list[str]:
        if values.null_count:
            row = int(pc.index(pc.is_null(values), True).as_py())
            raise self._row_error(start + row, f"{what} is null", f"a non-empty {what}")
        if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
            values = pc.cast(values, pa.string())
        return self._python(values, start, what)

    def _answers(self, values: pa.Array, start: int, what: str) -> list[str]:
        """The answers as strings (see the module docstring for floats and booleans)."""
        if pa.types.is_boolean(values.type):
            self._strings(values, start, what)  # a null is reported as such first
            raise self._row_error(
                start,
                f"{what} is the boolean {values[0].as_py()}",
                "a math answer (a string or "
                "an integer); math_dapo would compare 'true' or 'false' with the response's answer",
            )
        if not pa.types.is_floating(values.type):
            return self._strings(values, start, what)
        self._strings(values, start, what)  # nulls
        return [self._float_answer(value, start + offset, what) for offset, value in enumerate(values.to_pylist())]

    def _float_answer(self, value: float, row: int, what: str) -> str:
        if math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        text = repr(value)
        if not math.isfinite(value) or "e" in text:
            raise self._row_error(
                row,
                f"{what} is the float {text}, which has no exact decimal form a model would "
                "write (math_dapo compares answers as text)",
                "the answer stored as a string",
            )
        return text

    def _python(self, values: pa.Array, start: int, what: str) -> list:
        """``values.to_pylist()``, or the row error of the first text that is not valid UTF-8."""
        try:
            return values.to_pylist()
        except UnicodeDecodeError:
            pass
        for offset, raw in enumerate(pc.cast(values, pa.binary()).to_pylist()):
            try:
                if raw is not None:
                    raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise self._row_error(
                    start + offset,
                    f"{what} is not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start})",
                    "UTF-8 text; re-encode the file",
                ) from None
        raise AssertionError("to_pylist failed to decode, yet every value decodes")  # a bug in this function

    def _optional_strings(self, batch: pa.RecordBatch, role: str, batch_start: int) -> list[str | None]:
        name = self.columns.get(role)
        if name is None:
            return [None] * batch.num_rows
        values = batch.column(name)
        if name == "extra_info":
            values = pc.struct_field(values, "index")
        if not pa.types.is_string(values.type):
            values = pc.cast(values, pa.string())
        return self._python(values, batch_start, name)

    def _row_error(self, row: int, what: str, expected: str) -> ValueError:
        return _fail(
            self.path,
            self.dataset,
            f"row {row}: {what}, expected {expected}",
            "Fix or drop that row in the input file.",
        )


def _verl_columns(path: Path, dataset: str, schema: pa.Schema) -> dict[str, str]:
    for name, expected in _VERL_EXPECTED.items():
        if name not in schema.names:
            raise _fail(
                path,
                dataset,
                f"no column {name!r}, expected {expected}; columns present: {schema.names}",
                "Pass a file in verl's RL layout (as BytedTsinghua-SIA/DAPO-Math-17k) or a plain problem/answer table.",
            )
    prompt, reward_model = schema.field("prompt").type, schema.field("reward_model").type
    message_ok = (
        pa.types.is_list(prompt)
        and pa.types.is_struct(prompt.value_type)
        and {"content", "role"} <= {f.name for f in prompt.value_type}
    )
    if not (message_ok or pa.types.is_string(prompt)):
        raise TypeError(
            f"{path}: column 'prompt' has type {prompt}, expected {_VERL_EXPECTED['prompt']} ({dataset}). "
            "Pass the original file, or convert the column."
        )
    if not (pa.types.is_struct(reward_model) and reward_model.get_field_index("ground_truth") >= 0):
        raise TypeError(
            f"{path}: column 'reward_model' has type {reward_model}, expected "
            f"{_VERL_EXPECTED['reward_model']} ({dataset}). Pass the original file."
        )
    columns = {"text": "prompt", "answer": "reward_model"}
    extra_info = schema.field("extra_info").type if "extra_info" in schema.names else None
    if extra_info is not None and pa.types.is_struct(extra_info) and extra_info.get_field_index("index") >= 0:
        columns["id"] = "extra_info"
    if "ability" in schema.names:
        columns["ability"] = "ability"
    return columns


def _check_values(path: Path, dataset: str, schema: pa.Schema, layout: SourceLayout, columns: dict[str, str]) -> None:
    """Each value read as text (the problem, the message's content, the answer, an identifier) is a single value,
    not a list, struct or map, which has no one text to train or score on.

    Raises:
        TypeError: naming the column, its type and what is expected.
    """
    fields: dict[str, pa.DataType] = {}
    if layout is SourceLayout.VERL:
        prompt, reward_model = schema.field("prompt").type, schema.field("reward_model").type
        if pa.types.is_list(prompt):
            fields["prompt[].content"] = prompt.value_type.field("content").type
        else:
            fields["prompt"] = prompt
        fields["reward_model.ground_truth"] = reward_model.field("ground_truth").type
        if "id" in columns:
            fields["extra_info.index"] = schema.field("extra_info").type.field("index").type
    else:
        fields |= {
            columns[role]: schema.field(columns[role]).type for role in ("text", "answer", "id") if role in columns
        }
    if "ability" in columns:
        fields["ability"] = schema.field("ability").type
    for name, kind in fields.items():
        if pa.types.is_nested(kind):
            raise TypeError(
                f"{path}: column {name!r} has type {kind}, expected one value per row (a string, or a "
                f"number for an answer or identifier) ({dataset}). Pass the original file, or convert "
                "the column."
            )


def open_source(path: str | os.PathLike[str], dataset: str) -> SourceTable:
    """Open a local input parquet file and work out its layout.

    Args:
        path: The parquet file (``~`` is expanded).
        dataset: What the file should be, for messages, e.g. ``"DAPO-Math-17k (--dapo-math)"``.

    Returns:
        The opened :class:`SourceTable`.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for a directory, an extension other than ``.parquet``, an unreadable file, or missing columns.
        TypeError: for a ``prompt`` or ``reward_model`` column of the wrong type, or a list, struct or map where
            one value per row is read (the problem, the answer, an identifier).
    """
    path, file = _open_parquet(path, dataset)
    schema = file.schema_arrow
    if "prompt" in schema.names:
        layout, columns = SourceLayout.VERL, _verl_columns(path, dataset, schema)
    else:
        found = next((names for names in _PLAIN_COLUMNS if {names[0], names[1]} <= set(schema.names)), None)
        if found is None:
            raise _fail(
                path,
                dataset,
                f"no column 'prompt' (verl layout) and no problem/answer column pair "
                f"{[names[:2] for names in _PLAIN_COLUMNS]}; columns present: {schema.names}",
                "Pass BytedTsinghua-SIA/DAPO-Math-17k, BytedTsinghua-SIA/AIME-2024, HuggingFaceH4/aime_2024 "
                "or Maxwell-Jia/AIME_2024 as parquet.",
            )
        layout, columns = SourceLayout.PROBLEM_ANSWER, {"text": found[0], "answer": found[1]}
        if found[2] in schema.names:
            columns["id"] = found[2]
    _check_values(path, dataset, schema, layout, columns)
    if file.metadata.num_rows == 0:
        raise _fail(path, dataset, "has 0 rows", "Pass the full dataset file.")
    return SourceTable(path, dataset, layout, file.metadata.num_rows, columns, file)
