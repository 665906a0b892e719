"""Auto-tuning with MetaSchedule: tasks, measuring places, a resumable search, and the record directory
whose best records ``compile --tuning`` applies."""

from edgepack.tuning.records import (
    AppliedTuning,
    TaskSummary,
    TuningError,
    TuningMeta,
    TuningMismatchError,
    TuningSummary,
    TuningTask,
    apply_tuning,
    check_tuning,
    format_duration,
    load_tuning,
    parse_duration,
    repair_database,
    write_best_records,
)
from edgepack.tuning.tasks import extract_tasks
from edgepack.tuning.tuner import TaskProgress, TuningProgress, TuningResult, tune_model

__all__ = [
    "AppliedTuning", "TaskProgress", "TaskSummary", "TuningError", "TuningMeta", "TuningMismatchError",
    "TuningProgress", "TuningResult", "TuningSummary", "TuningTask", "apply_tuning", "check_tuning",
    "extract_tasks", "format_duration", "load_tuning", "parse_duration", "repair_database", "tune_model",
    "write_best_records",
]
