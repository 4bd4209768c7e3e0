"""Benchmarks and analyses (entry scripts): decoding, training steps, regeneration, draft vocabulary, sim vs measured, DistillSpec tau. Nothing imports them."""
