"""The append-only, hash-chained record log and its queries. No git, no vllm."""

from .log import Entry, HeadStore, HistoryError, HistoryLog, VerifyReport, verify

__all__ = ["Entry", "HeadStore", "HistoryError", "HistoryLog", "VerifyReport", "verify"]
