"""Data preparation for the cluster recipes: DAPO-Math-17k and AIME 2024 in verl's RL parquet schema.

Works only from local copies of the datasets; nothing is downloaded. Imports pandas/pyarrow and the standard
library, never verl, ray or torch-dependent code. Entry point: ``dapo-verl prepare-data`` (see
:mod:`dapo_verl.data.prepare`); the pieces are the source reader (:mod:`.sources`), the deduplication
(:mod:`.dedup`) and the output schema and its checker (:mod:`.schema`).
"""

from dapo_verl.data.dedup import ConflictPolicy, DedupKey, DedupStats, Problem, deduplicate
from dapo_verl.data.prepare import (
    AIME_FILE,
    MAX_AIME_REPEAT,
    REPORT_FILE,
    TRAIN_FILE,
    PreparedData,
    PrepareOptions,
    prepare_aime,
    prepare_data,
    prepare_train,
    repeat_rows,
    repeated_aime_file,
    summary_lines,
)
from dapo_verl.data.schema import (
    DAPO_PROMPT_PREFIX,
    DAPO_PROMPT_SUFFIX,
    OUTPUT_SCHEMA,
    check_verl_schema,
    dapo_prompt,
    is_math_dapo_data_source,
    normalize_text,
    split_dapo_prompt,
)
from dapo_verl.data.sources import SourceLayout, SourceRow, SourceTable, open_source

__all__ = [
    "AIME_FILE",
    "DAPO_PROMPT_PREFIX",
    "DAPO_PROMPT_SUFFIX",
    "MAX_AIME_REPEAT",
    "OUTPUT_SCHEMA",
    "REPORT_FILE",
    "TRAIN_FILE",
    "ConflictPolicy",
    "DedupKey",
    "DedupStats",
    "PrepareOptions",
    "PreparedData",
    "Problem",
    "SourceLayout",
    "SourceRow",
    "SourceTable",
    "check_verl_schema",
    "dapo_prompt",
    "deduplicate",
    "is_math_dapo_data_source",
    "normalize_text",
    "open_source",
    "prepare_aime",
    "prepare_data",
    "prepare_train",
    "repeat_rows",
    "repeated_aime_file",
    "split_dapo_prompt",
    "summary_lines",
]
