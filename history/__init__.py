"""The append-only, hash-chained record log and its queries. No git, no vllm."""

from .log import Entry, HistoryError, HistoryLog, VerifyReport, verify

__all__ = ["Entry", "HistoryError", "HistoryLog", "VerifyReport", "verify"]
