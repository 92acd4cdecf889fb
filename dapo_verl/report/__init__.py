"""Ablation reports from logged metrics: ``dapo-verl compare RUN...``, for local runs and cluster runs alike.

Reads each run's per-step metrics whatever wrote them -- verl's FileLogger JSONL (also the local backend's
``metrics.jsonl``), TensorBoard event files, or verl's console logger captured to a text file
(:mod:`.readers`) -- groups runs into arms by label (:mod:`.grouping`), summarises the key metrics of a DAPO
ablation per run and per arm (:mod:`.summary`: held-out accuracy, entropy, response length, clip fractions,
pre-filter accuracy, responses generated per trained), and writes Markdown, JSON and PNG plots
(:mod:`.build`, :mod:`.plots`).

Pure Python with numpy, pandas and matplotlib (tensorboard only to read event files, imported when used);
never imports verl, ray or transformers, so reports can be built anywhere the logs can be copied to.

Example (an ablation driver)::

    from dapo_verl.report import build_report
    report = build_report({"clip 0.2/0.28": ["runs/clip028/seed1", "runs/clip028/seed2"],
                           "clip 0.2/0.2": ["runs/clip020/seed1", "runs/clip020/seed2"]}, "runs/report")
    print(report.to_markdown())
"""

from dapo_verl.report.build import JSON_FILE, MARKDOWN_FILE, Report, build_report, load_runs, summarize, write_report
from dapo_verl.report.grouping import derive_label, group_runs
from dapo_verl.report.readers import LogFormat, NoMetricsLogError, RunLog, find_log, load_run
from dapo_verl.report.summary import (
    CLIP_METRICS,
    DEFAULT_LAST_FRAC,
    DEFAULT_METRICS,
    ArmMetric,
    RunValue,
    Spread,
    UnknownMetricError,
    select_metrics,
)

__all__ = [
    "CLIP_METRICS",
    "DEFAULT_LAST_FRAC",
    "DEFAULT_METRICS",
    "JSON_FILE",
    "MARKDOWN_FILE",
    "ArmMetric",
    "LogFormat",
    "NoMetricsLogError",
    "Report",
    "RunLog",
    "RunValue",
    "Spread",
    "UnknownMetricError",
    "build_report",
    "derive_label",
    "find_log",
    "group_runs",
    "load_run",
    "load_runs",
    "select_metrics",
    "summarize",
    "write_report",
]
