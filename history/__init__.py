"""The append-only, hash-chained record log, its typed records and its queries. No git, no vllm."""

from .log import Entry, HeadStore, HistoryChanged, HistoryError, HistoryLog, VerifyReport, verify

__all__ = ["Entry", "HeadStore", "HistoryChanged", "HistoryError", "HistoryLog", "VerifyReport", "verify"]
