"""Decoding settings chosen from measured cost: the tuner and its speed model."""
