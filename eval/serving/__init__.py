"""vLLM's side: the serve check, side-by-side engines, vLLM's counters, baselines and the K sweep."""
