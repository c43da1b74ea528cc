"""The append-only, hash-chained record log, its typed records and its queries. No git, no vllm."""

from .log import Entry, HeadStore, HistoryError, HistoryLog, VerifyReport, verify

__all__ = ["Entry", "HeadStore", "HistoryError", "HistoryLog", "VerifyReport", "verify"]
