"""Timing on a shared machine: interleaved rounds, confidence intervals, thread policy, physical bounds."""
