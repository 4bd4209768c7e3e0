"""A prompt that runs past the backbone's position limit is decoded with a warning that says so;
one that fits gets none."""

from __future__ import annotations

import logging

from conftest import tiny_backbone

from headstart.eval.engine.decoder import Decoder


def test_prompt_past_the_position_limit_warns(caplog):
    backbone = tiny_backbone(max_position_embeddings=48)
    decoder = Decoder(backbone, "vanilla", max_cache_len=256)
    with caplog.at_level(logging.WARNING, logger="headstart.eval"):
        decoder.generate(list(range(3, 43)), max_new_tokens=4)  # 44 <= 48
        assert not caplog.records
        out = decoder.generate(list(range(3, 43)), max_new_tokens=16)  # 56 > 48
    assert len(out.tokens) == 16  # still decoded: a warning, not an error
    (record,) = caplog.records
    assert "prompt of 40 tokens + max_new_tokens=16 passes the backbone's position limit" in record.message
    assert "max_position_embeddings=48" in record.message
