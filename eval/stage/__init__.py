"""The eval stage: its typed config, the prompt files, and the Evaluator that ties the rest together."""
