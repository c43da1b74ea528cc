"""Measuring: trials in child processes, interleaved pairs, statistics, sequential decisions.

Never imports agentsearch.
"""
