"""The vLLM step-cost benchmark's engines and its table (the timing itself runs in vLLM's environment)."""

from headstart.eval.bench.vllm_steps import parser, specs, table


def test_the_hybrid_is_served_as_the_serve_check_serves_it():
    args = parser().parse_args(
        [
            "--backbone",
            "b",
            "--drafter",
            "d",
            "--method",
            "eagle3",
            "--hybrid",
            '{"min_match": 1}',
            "--served",
            "8",
        ]
    )
    engines = specs(args)
    assert list(engines) == ["plain", "ngram", "drafter", "hybrid"]
    assert engines["drafter"]["speculative_config"] == {
        "method": "eagle3",
        "model": "d",
        "num_speculative_tokens": 2,
    }
    hybrid = engines["hybrid"]
    assert hybrid["speculative_config"]["num_speculative_tokens"] == 8
    assert hybrid["speculative_config"]["use_local_argmax_reduction"] is True
    assert hybrid["additional_config"] == {"headstart_lookup": {"min_match": 1}}
    medusa = specs(
        parser().parse_args(["--backbone", "b", "--drafter", "d", "--method", "medusa", "--hybrid", "{}"])
    )
    assert "use_local_argmax_reduction" not in medusa["hybrid"]["speculative_config"]
    assert list(specs(parser().parse_args(["--backbone", "b"]))) == ["plain", "ngram"]


def test_the_table_gives_milliseconds_per_step():
    row = {
        "method": "hybrid", "tokens": 100, "seconds": 2.0, "steps": 50,
        "ms_per_step": {"execute_model": 30.0, "propose": 4.0}, "calls_per_step": {"propose": 1.0, "_greedy_sample": 0.5},
    }  # fmt: skip
    text = table([row])
    assert "| hybrid | 50.0 | 2.00 | 40.0 | 30.00 | 0.00 | 0.00 | 0.00 | 4.00 | 0.00 | 1.00 | 0.50 |" in text
