"""The vLLM step-cost benchmark's engines and its table (the timing itself runs in vLLM's environment)."""

import json

from headstart.eval.bench.vllm_steps import parser, specs, table


def engines(folder, method: str, hybrid: str = '{"min_match": 1}') -> dict:
    argv = [
        "--backbone",
        "b",
        "--drafter",
        str(folder),
        "--method",
        method,
        "--hybrid",
        hybrid,
        "--served",
        "8",
    ]
    return specs(parser().parse_args(argv))


def test_the_hybrid_is_served_as_the_serve_check_serves_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "truncated_vocab_size": 4}))
    eagle = engines(tmp_path, "eagle3")
    assert list(eagle) == ["plain", "ngram", "drafter", "hybrid"]
    alone = {"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 2}
    assert eagle["drafter"]["speculative_config"] == alone
    hybrid = eagle["hybrid"]
    assert hybrid["speculative_config"] == alone | {
        "num_speculative_tokens": 8,
        "use_local_argmax_reduction": True,
    }
    assert hybrid["additional_config"] == {"headstart_lookup": {"min_match": 1}}
    medusa = engines(tmp_path, "medusa")
    assert "use_local_argmax_reduction" not in medusa["hybrid"]["speculative_config"]
    # a truncated Medusa folder loads as the serve check loads it (models/export/medusa.py vllm_engine_args)
    assert medusa["drafter"]["model_loader_extra_config"] == {"enable_weights_track": False}
    assert medusa["hybrid"]["model_loader_extra_config"] == {"enable_weights_track": False}
    assert list(specs(parser().parse_args(["--backbone", "b"]))) == ["plain", "ngram"]


def test_the_table_gives_milliseconds_per_step():
    row = {
        "method": "hybrid", "tokens": 100, "seconds": 2.0, "steps": 50,
        "ms_per_step": {"execute_model": 30.0, "propose": 4.0}, "calls_per_step": {"propose": 1.0, "_greedy_sample": 0.5},
    }  # fmt: skip
    text = table([row])
    assert "| hybrid | 50.0 | 2.00 | 40.0 | 30.00 | 0.00 | 0.00 | 0.00 | 4.00 | 0.00 | 1.00 | 0.50 |" in text
