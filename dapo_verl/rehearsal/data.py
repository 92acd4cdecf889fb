"""Rehearsal data: the first rows of the recipe's own files, or a small generated set in verl's RL schema.

Generated rows are DAPO-Math rows (``data_source="math_dapo"``, the DAPO prompt template, an integer
``ground_truth``; every prompt distinct), so verl's own rule-based scorer (``math_dapo``, through the recipe's
reward manager) checks them. Their answers are 1 or 2, the two answers the stand-in model (:mod:`.stand_in`)
can give, so its groups come out mixed or all wrong, as real groups do.

When the recipe's files exist, their first rows are copied unchanged (same columns, same types): verl's dataset
class, prompt filter, chat template and scorer then meet the real data. The stand-in cannot solve real
problems, so their groups are all wrong; the rehearsal appends generated rows to the training file so that
dynamic sampling still finds informative groups, and says so in its report.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_verl.data.schema import OUTPUT_SCHEMA, dapo_prompt

__all__ = ["RehearsalData", "generated_table", "prepare_files"]


def generated_table(num_rows: int, *, seed: int, split: str, start_index: int = 0) -> pa.Table:
    """``num_rows`` generated DAPO-Math rows whose answers are 1 or 2 (``OUTPUT_SCHEMA``).

    Example:
        >>> generated_table(2, seed=0, split="train").column("reward_model").to_pylist()[0]["style"]
        'rule-lighteval/MATH_v2'
    """
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        answer = rng.choice((1, 2))
        a = rng.randint(0, 9)
        # Numbered, so no two rows share a prompt: identical prompts would share the replica's sampling stream
        # and make a resumed run's groups depend on request order.
        problem = f"Problem {start_index + i}: what is {a + answer} - {a}?"
        rows.append(
            {
                "data_source": "math_dapo",
                "prompt": [{"content": dapo_prompt(problem), "role": "user"}],
                "ability": "MATH",
                "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
                "extra_info": {
                    "index": start_index + i,
                    "source_id": f"rehearsal-{split}-{i}",
                    "raw_problem": problem,
                    "split": split,
                },
            }
        )
    return pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA)


@dataclass(frozen=True)
class RehearsalData:
    """Where a rehearsal's data came from and where it was written.

    Attributes:
        train_file: Parquet file verl trains on.
        val_file: Parquet file verl validates on.
        real_train_rows: Rows copied from the recipe's training files (0 when generated).
        real_val_rows: Rows copied from the recipe's validation files (0 when generated).
        generated_train_rows: Generated rows in the training file.
        sources: The recipe's files that were read.
    """

    train_file: Path
    val_file: Path
    real_train_rows: int
    real_val_rows: int
    generated_train_rows: int
    sources: tuple[str, ...]


def _first_rows(files: list[str], limit: int) -> pa.Table | None:
    tables, total = [], 0
    for file in files:
        table = pq.read_table(file)
        tables.append(table.slice(0, limit - total))
        total += tables[-1].num_rows
        if total >= limit:
            break
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive")


def _existing(files: list[str] | None) -> list[str] | None:
    """The files when every one exists, else None (a recipe whose data is not on this machine)."""
    if not files:
        return None
    return files if all(Path(f).is_file() for f in files) else None


def prepare_files(
    out_dir: Path,
    *,
    train_files: list[str] | None,
    val_files: list[str] | None,
    train_rows: int,
    val_rows: int,
    seed: int,
) -> RehearsalData:
    """Write the rehearsal's ``train.parquet`` and ``val.parquet`` under ``out_dir``.

    Args:
        out_dir: Output folder.
        train_files: The recipe's ``data.train_files`` resolved to paths, or None when they cannot be resolved.
        val_files: The same for ``data.val_files``.
        train_rows: Rows of the training file: up to half from the recipe's files, the rest generated.
        val_rows: Rows of the validation file (the recipe's first rows, else generated).
        seed: Seed of the generated rows.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    train = _existing(train_files)
    val = _existing(val_files)
    real_train = _first_rows(train, train_rows // 2) if train else None
    real_val = _first_rows(val, val_rows) if val else None
    real_train_rows = real_train.num_rows if real_train is not None else 0
    generated = generated_table(train_rows - real_train_rows, seed=seed, split="train", start_index=real_train_rows)
    if real_train is not None:
        generated = pa.concat_tables([real_train, _align(generated, real_train.schema)])
    train_file, val_file = out_dir / "train.parquet", out_dir / "val.parquet"
    pq.write_table(generated, train_file)
    pq.write_table(
        real_val if real_val is not None else generated_table(val_rows, seed=seed + 1, split="test"), val_file
    )
    return RehearsalData(
        train_file,
        val_file,
        real_train_rows,
        real_val.num_rows if real_val is not None else 0,
        train_rows - real_train_rows,
        tuple((train or []) + (val or [])),
    )


def _align(generated: pa.Table, schema: pa.Schema) -> pa.Table:
    """Generated rows in the recipe's file layout: its columns in its order, each cast to its type or left null.

    A column the recipe's file lacks is dropped from the generated rows too, so verl meets the recipe's layout
    (and fails on it as it would on the cluster).
    """
    columns = {}
    for field in schema:
        columns[field.name] = pa.nulls(len(generated), field.type)
        if field.name in generated.column_names:
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                columns[field.name] = generated.column(field.name).cast(field.type)
    return pa.table(columns, schema=schema)
