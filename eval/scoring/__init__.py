"""Scoring a decoder against vanilla decoding on a prompt set (tau, speedup, acceptance by position)."""
