"""Turn local copies of DAPO-Math-17k and AIME 2024 into verl parquet files: ``dapo-verl prepare-data``.

Writes into one output folder:

* ``train.parquet``: DAPO-Math-17k deduplicated (:mod:`dapo_verl.data.dedup`), ``data_source="math_dapo"``;
* ``aime-2024.parquet``: the unique AIME problems (30 for AIME 2024), for avg@32 with
  ``actor_rollout_ref.rollout.val_kwargs.n=32``; verl then reports ``val-core/<data_source>/acc/mean@32`` (and
  ``best@32``/``maj@32``), since verl >= 0.6 groups validation samples by a per-row uid;
* optionally ``aime-2024-x<N>.parquet``: the same problems repeated N times, for verl's ``val_kwargs.n=1``
  convention (BytedTsinghua-SIA/AIME-2024 style); the key is then ``.../acc/mean@1``, numerically avg@N;
* ``prepare_data.json``: one entry per output file in the folder -- rows, the input it was made from, options,
  deduplication counts and when it was written. A later run into the same folder replaces the entries of the
  files it rewrites and keeps the others, so no earlier run's counts or provenance are lost.

Nothing in the output folder changes until everything has been read, converted and checked: the files are
first written beside their targets under temporary names (``.<name>.<random>.tmp``), each is read back and
checked by :func:`~dapo_verl.data.schema.check_verl_schema`, and only then are they renamed into place, so a
failure at any point (a bad row, a full disk) leaves an earlier run's outputs as they were. An output that
would replace one of the inputs (``--out`` set to the input's folder) is refused before anything is read.

Departures from the sources: ``extra_info.index`` becomes the row's position (int64) and the source
identifier moves to ``extra_info.source_id``; the AIME ``data_source`` defaults to ``aime-2024`` so the
validation metrics are named after the benchmark (verl scores any ``aime*`` name with ``math_dapo``, exactly
like ``math_dapo``); integer AIME answers lose leading zeros (``"033"`` -> ``"33"``) because ``math_dapo``
compares normalised strings.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_verl.data.dedup import ConflictPolicy, DedupKey, DedupStats, Problem, deduplicate
from dapo_verl.data.schema import (
    MATH_DAPO_DATA_SOURCES,
    OUTPUT_SCHEMA,
    check_verl_schema,
    is_math_dapo_data_source,
)
from dapo_verl.data.sources import open_source
from dapo_verl.files import apply_umask

__all__ = [
    "AIME_2024_PROBLEMS",
    "AIME_FILE",
    "MAX_AIME_REPEAT",
    "REPORT_FILE",
    "TRAIN_FILE",
    "PrepareOptions",
    "PreparedData",
    "prepare_aime",
    "prepare_data",
    "prepare_train",
    "repeat_rows",
    "repeated_aime_file",
    "summary_lines",
]

logger = logging.getLogger(__name__)

TRAIN_FILE = "train.parquet"
AIME_FILE = "aime-2024.parquet"
REPORT_FILE = "prepare_data.json"
MANIFEST_FORMAT = "dapo_verl.prepare_data/2"
"""``prepare_data.json``'s format: one entry per output file (rows, input, options, dedup counts, time)."""
AIME_2024_PROBLEMS = 30
MAX_AIME_REPEAT = 1024
"""Largest ``aime_repeat``: 30 x 1024 = 30,720 rows, each generated at every evaluation; avg@1024 already has 1/32 of
avg@1's sampling error (the paper reports avg@32), and each repeat adds a full copy of the set to memory and disk."""
_DEFAULT_ABILITY = "MATH"
_DEFAULT_STYLE = "rule-lighteval/MATH_v2"
_INTEGER = re.compile(r"[+-]?\d+")


def repeated_aime_file(repeat: int) -> str:
    """File name of the AIME set repeated ``repeat`` times, e.g. ``aime-2024-x32.parquet``."""
    return f"aime-2024-x{repeat}.parquet"


def _choice(name: str, value: str, enum: type[DedupKey] | type[ConflictPolicy]) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not one of {[m.value for m in enum]}. Pick one of those (--{name.replace('_', '-')})."
        ) from None


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    """Choices of ``dapo-verl prepare-data``; the single home of their defaults."""

    dedup_key: DedupKey = DedupKey.PROMPT
    """Rows with the same key are one training problem: prompt (normalised problem text), uuid (extra_info.index) or
    prompt_answer.
    """

    conflicts: ConflictPolicy = ConflictPolicy.KEEP
    """Problem texts seen with more than one ground truth: keep them (first occurrence wins under dedup_key=prompt) or
    drop all their rows. Keep follows the source data; both counts are reported.
    """

    train_data_source: str = "math_dapo"
    """data_source of the training rows; as in DAPO-Math-17k, scored by verl's math_dapo."""

    aime_data_source: str = "aime-2024"
    """data_source of the validation rows; any name starting with aime is scored by math_dapo and names the metrics."""

    aime_repeat: int = 0
    """Also write the AIME problems repeated this many times (e.g. 32, for val_kwargs.n=1), at most MAX_AIME_REPEAT
    (1024); 0 writes no such file."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dedup_key", _choice("dedup_key", self.dedup_key, DedupKey))
        object.__setattr__(self, "conflicts", _choice("conflicts", self.conflicts, ConflictPolicy))
        for name in ("train_data_source", "aime_data_source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not is_math_dapo_data_source(value):
                raise ValueError(
                    f"{name}={value!r} is not scored by math_dapo in verl's default_compute_score, so "
                    f"rewards would fail with NotImplementedError. Use one of "
                    f"{list(MATH_DAPO_DATA_SOURCES)} or a name starting with 'aime'."
                )
        if isinstance(self.aime_repeat, bool) or not isinstance(self.aime_repeat, int) or self.aime_repeat < 0:
            raise ValueError(
                f"aime_repeat={self.aime_repeat!r} must be an integer >= 0 (0 writes no repeated file). "
                "Use 32 for the avg@32 file of BytedTsinghua-SIA/AIME-2024."
            )
        if self.aime_repeat > MAX_AIME_REPEAT:
            raise ValueError(
                f"aime_repeat={self.aime_repeat:,} is above {MAX_AIME_REPEAT}: the file would hold every "
                f"AIME problem {self.aime_repeat:,} times (30 x {self.aime_repeat:,} = "
                f"{AIME_2024_PROBLEMS * self.aime_repeat:,} rows, built in memory) and validation would "
                f"generate a response for each row at every evaluation, while avg@{MAX_AIME_REPEAT} "
                f"already has 1/32 of avg@1's sampling error. Use --aime-repeat 32 (the paper's "
                f"avg@32) or at most {MAX_AIME_REPEAT}."
            )


def _to_table(problems: list[Problem], *, data_source: str, split: str) -> pa.Table:
    rows = [
        {
            "data_source": data_source,
            "prompt": [{"content": p.prompt, "role": "user"}],
            "ability": p.ability or _DEFAULT_ABILITY,
            "reward_model": {"ground_truth": p.ground_truth, "style": p.style or _DEFAULT_STYLE},
            "extra_info": {"index": index, "source_id": p.source_id, "raw_problem": p.raw_problem, "split": split},
        }
        for index, p in enumerate(problems)
    ]
    return pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA)


def prepare_train(path: str | os.PathLike[str], options: PrepareOptions) -> tuple[pa.Table, DedupStats]:
    """Read DAPO-Math-17k (or a file in the same layout, or a problem/answer table) and deduplicate it.

    Returns:
        The verl table (``OUTPUT_SCHEMA``, ``split="train"``) and the counts.

    Raises:
        FileNotFoundError, ValueError, TypeError: for bad input, see :func:`~dapo_verl.data.sources.open_source`.
    """
    source = open_source(path, "DAPO-Math-17k (--dapo-math)")
    logger.info("reading %d rows from %s", source.num_rows, source.path)
    problems, stats = deduplicate(
        source.rows(), key=options.dedup_key, conflicts=options.conflicts, dataset=f"{source.path} (DAPO-Math-17k)"
    )
    return _to_table(problems, data_source=options.train_data_source, split="train"), stats


def prepare_aime(path: str | os.PathLike[str], options: PrepareOptions) -> tuple[pa.Table, DedupStats]:
    """Read an AIME parquet (BytedTsinghua-SIA/AIME-2024, HuggingFaceH4/aime_2024 or Maxwell-Jia/AIME_2024).

    Keeps one row per problem text (first occurrence), in the DAPO prompt template. A count other than 30
    is logged as a warning (another year or a subset is allowed).

    Returns:
        The verl table (``split="test"``, ``data_source=options.aime_data_source``) and the counts.

    Raises:
        ValueError: when one problem text carries two different answers (a corrupt validation set), or for
            bad input as in :func:`~dapo_verl.data.sources.open_source`.
    """
    source = open_source(path, "AIME 2024 (--aime)")
    dataset = f"{source.path} (AIME)"
    rows = (
        r._replace(ground_truth=str(int(r.ground_truth))) if _INTEGER.fullmatch(r.ground_truth.strip()) else r
        for r in source.rows()
    )
    problems, stats = deduplicate(rows, key=DedupKey.PROMPT, conflicts=ConflictPolicy.KEEP, dataset=dataset)
    if stats.conflicting_prompts:
        raise ValueError(
            f"{dataset}: {stats.conflicting_prompts} problem(s) appear with different answers; a "
            "validation set must have one answer per problem. Fix the file (see the warnings above)."
        )
    if stats.rows_out != AIME_2024_PROBLEMS:
        logger.warning("%s: %d unique problems, AIME 2024 has %d", dataset, stats.rows_out, AIME_2024_PROBLEMS)
    return _to_table(problems, data_source=options.aime_data_source, split="test"), stats


def repeat_rows(table: pa.Table, repeat: int) -> pa.Table:
    """``table`` concatenated ``repeat`` times (all rows, then all rows again, ...), keeping ``extra_info.index``."""
    if repeat < 1:
        raise ValueError(f"repeat={repeat} must be >= 1.")
    return pa.concat_tables([table] * repeat)


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_data` wrote."""

    files: dict[str, Path]
    """``train``, ``aime``, ``aime_repeated`` (when written) and ``report`` -> path."""
    train: DedupStats | None
    aime: DedupStats | None
    options: PrepareOptions
    rows: dict[str, int] = field(default_factory=dict)
    """Rows in each written parquet file, keyed like ``files``."""


def prepare_data(
    *,
    out_dir: str | os.PathLike[str],
    dapo_math: str | os.PathLike[str] | None = None,
    aime: str | os.PathLike[str] | None = None,
    options: PrepareOptions | None = None,
) -> PreparedData:
    """Convert the given local files and write them, checked by :func:`check_verl_schema`, into ``out_dir``.

    Args:
        out_dir: Output folder (created if needed; existing files of the same name are replaced, all at the end
            and only when every output was written and checked).
        dapo_math: DAPO-Math-17k parquet, or None to skip the training file.
        aime: AIME parquet, or None to skip the validation file(s).
        options: Dedup key, conflict policy, data sources and AIME repeat; defaults from :class:`PrepareOptions`.

    Returns:
        The written files, their row counts and the deduplication counts.

    Raises:
        ValueError: if neither input is given, an output would replace an input, or for bad input (see
            :func:`prepare_train`, :func:`prepare_aime`); nothing in ``out_dir`` has changed then.
        OSError: if the outputs cannot be written (nothing in ``out_dir`` has changed then either).
    """
    options = options or PrepareOptions()
    if dapo_math is None and aime is None:
        raise ValueError("Nothing to prepare: pass --dapo-math PATH and/or --aime PATH (local parquet files).")
    out = Path(out_dir).expanduser()
    files = _output_files(out, dapo_math=dapo_math, aime=aime, options=options)
    tables: dict[str, pa.Table] = {}
    train_stats = aime_stats = None
    if dapo_math is not None:
        tables["train"], train_stats = prepare_train(dapo_math, options)
    if aime is not None:
        tables["aime"], aime_stats = prepare_aime(aime, options)
        if options.aime_repeat:
            tables["aime_repeated"] = repeat_rows(tables["aime"], options.aime_repeat)
    for name, table in tables.items():  # in memory, before anything is written
        try:
            check_verl_schema(table)
        except ValueError as err:
            raise ValueError(
                f"{files[name].name} would not be a valid verl dataset, so nothing was written: {err}"
            ) from None
    inputs = {"train": dapo_math, "aime": aime, "aime_repeated": aime}
    return _write_outputs(tables, files, train_stats, aime_stats, options, inputs)


def _output_files(
    out: Path, *, dapo_math: str | os.PathLike[str] | None, aime: str | os.PathLike[str] | None, options: PrepareOptions
) -> dict[str, Path]:
    """The files :func:`prepare_data` writes, keyed like ``PreparedData.files``.

    Raises:
        ValueError: if one of them is one of the inputs.
    """
    files = {}
    if dapo_math is not None:
        files["train"] = out / TRAIN_FILE
    if aime is not None:
        files["aime"] = out / AIME_FILE
        if options.aime_repeat:
            files["aime_repeated"] = out / repeated_aime_file(options.aime_repeat)
    files["report"] = out / REPORT_FILE
    inputs = {
        flag: Path(path).expanduser()
        for flag, path in (("--dapo-math", dapo_math), ("--aime", aime))
        if path is not None
    }
    for flag, source in inputs.items():
        for target in files.values():
            if os.path.realpath(target) == os.path.realpath(source):  # never raises, even on a link loop
                raise ValueError(
                    f"--out {out} would overwrite the input {source} ({flag}) with its {target.name}. "
                    f"Pass another --out, or move the input elsewhere."
                )
    return files


def _write_outputs(
    tables: dict[str, pa.Table],
    files: dict[str, Path],
    train_stats: DedupStats | None,
    aime_stats: DedupStats | None,
    options: PrepareOptions,
    inputs: dict[str, Any],
) -> PreparedData:
    """Write every output under a temporary name, check it, then rename them all into place."""
    out = files["report"].parent
    out.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_entries(files["report"])  # read before anything is written: a bad manifest stops the run
    staged: dict[Path, Path] = {}
    try:
        rows = {}
        for name, table in tables.items():
            with _named(files[name]):
                staged[files[name]] = _stage(files[name])
                pq.write_table(table, staged[files[name]])
            rows[name] = check_verl_schema(staged[files[name]])
        prepared = PreparedData(files, train_stats, aime_stats, options, rows)
        with _named(files["report"]):
            staged[files["report"]] = _stage(files["report"])
            staged[files["report"]].write_text(json.dumps(_manifest(prepared, inputs, earlier), indent=2) + "\n")
        for target, tmp in staged.items():
            apply_umask(tmp)
            os.replace(tmp, target)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return prepared


@contextmanager
def _named(target: Path) -> Iterator[None]:
    """A failed write of ``target``'s temporary file as an OSError naming ``target`` (pyarrow names no file)."""
    try:
        yield
    except OSError as err:
        if err.errno is None:
            raise
        raise OSError(err.errno, os.strerror(err.errno), str(target)) from None


def _stage(target: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(tmp)


def _manifest(prepared: PreparedData, inputs: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """``prepare_data.json``: one entry per output file in the folder, this run's replacing those it rewrote.

    Each entry holds the file's rows, the input it was made from, the options, the deduplication counts and when
    it was written; an earlier run's entry stays as long as its file is there and this run did not rewrite it.
    """
    written = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    outputs = {name: entry for name, entry in earlier.items() if (prepared.files["report"].parent / name).exists()}
    for name, rows in prepared.rows.items():
        stats = prepared.train if name == "train" else prepared.aime
        outputs[prepared.files[name].name] = {
            "rows": rows,
            "input": str(Path(inputs[name]).expanduser()),
            "options": asdict(prepared.options),
            "dedup": stats.as_dict() if stats else None,
            "written": written,
        }
    return {"format": MANIFEST_FORMAT, "outputs": dict(sorted(outputs.items()))}


def _earlier_entries(path: Path) -> dict[str, Any]:
    """The per-file entries of an existing ``prepare_data.json`` (an older flat manifest converted); {} if none.

    Raises:
        ValueError: if the file exists but cannot be read as a manifest; nothing has been written then.
    """
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == MANIFEST_FORMAT:
            return dict(data["outputs"])
        rows, options = data["rows"], data["options"]  # the flat manifest written before per-file entries
        return {
            Path(file).name: {
                "rows": rows.get(name),
                "input": None,
                "options": options,
                "dedup": data.get("train" if name == "train" else "aime"),
                "written": None,
            }
            for name, file in data["files"].items()
            if name != "report"
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f"{path} is not a prepare-data manifest ({' '.join(str(err).split())[:120]}); rewriting it "
            f"would lose what it records about the files beside it. Move it aside, or pass another "
            f"--out."
        ) from None


def _stats_lines(title: str, stats: DedupStats) -> list[str]:
    ids = "n/a (no identifier column)" if stats.unique_source_ids is None else f"{stats.unique_source_ids:,}"
    dropped = f" ({stats.conflicts}; {stats.conflict_rows_dropped:,} row(s) dropped)"
    policy = dropped if stats.conflicting_prompts else ""
    copies = f"{stats.copies_min:,}" + (f"-{stats.copies_max:,}" if stats.copies_max != stats.copies_min else "")
    return [
        f"{title}: {stats.rows_in:,} rows read",
        f"    unique by prompt text {stats.unique_prompts:,} | by prompt+answer {stats.unique_prompt_answers:,} | "
        f"by extra_info.index {ids}",
        f"    conflicting answers: {stats.conflicting_prompts:,} prompt(s){policy}",
        f"    kept {stats.rows_out:,} rows (dedup key {stats.dedup_key}; {copies} source rows each; "
        f"{stats.prompts_built:,} prompt(s) built from raw problems)",
    ]


def summary_lines(prepared: PreparedData) -> list[str]:
    """Human-readable counts and file locations, for the CLI."""
    lines: list[str] = []
    if prepared.train:
        lines += _stats_lines("DAPO-Math-17k", prepared.train)
    if prepared.aime:
        lines += _stats_lines("AIME", prepared.aime)
        if prepared.aime.rows_out != AIME_2024_PROBLEMS:
            lines.append(f"    note: AIME 2024 has {AIME_2024_PROBLEMS} problems, this file {prepared.aime.rows_out}")
        source = prepared.options.aime_data_source
        lines.append(f"    metric with actor_rollout_ref.rollout.val_kwargs.n=32: val-core/{source}/acc/mean@32")
    lines.append("Wrote:")
    lines += [
        f"    {path}  ({prepared.rows[name]:,} rows)" if name in prepared.rows else f"    {path}"
        for name, path in prepared.files.items()
    ]
    return lines
