"""What a training run prints and what it only logs. The console shows headstart's own lines and everyone's
warnings; the run's log file (`<run_dir>/<entry>.log`, Hydra's file handler) keeps everything, including
accelerate's per-file checkpoint lines and the full data statistics (`extra=FILE_ONLY`)."""

from __future__ import annotations

import logging

FILE_ONLY = {"file_only": True}  # logger.info(..., extra=FILE_ONLY): the log file, not the console


class ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "file_only", False):
            return False
        return record.levelno >= logging.WARNING or record.name.startswith("headstart")


def log_file() -> str | None:
    """The file the root logger writes to (Hydra's job log), if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None
