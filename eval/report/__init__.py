"""Writing results: report.{json,md}, plots, the comparison beside training-free baselines."""
