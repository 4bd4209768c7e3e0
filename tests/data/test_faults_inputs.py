"""Bad inputs named in one line: a data file that is not UTF-8, a local backbone folder that does
not exist (HF answered with "Repo id must be in the form 'repo_name'")."""

from __future__ import annotations

import pytest

from headstart.data.sources import DataError, read_rows
from headstart.errors import exit_on_user_error
from headstart.models.backbone import BackboneConfig, BackboneError, load_backbone


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_non_utf8_data_file_says_so(tmp_path, suffix, capsys):
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes('{"conversations": [{"from": "human", "value": "caf\u00e9"}]}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text \(byte 0xe9 near position \d+\)\. Fix: convert"):
        read_rows(path)
    with pytest.raises(SystemExit) as e, exit_on_user_error():
        read_rows(path)
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("path", ["/no/such/model", "./missing-model", "~/nothing/here", "a/b/c"])
def test_missing_local_backbone_folder_is_named(path):
    with pytest.raises(BackboneError, match="no such folder or file") as e:
        load_backbone(BackboneConfig(name="x", path=path, dtype="float32"))
    assert "Repo id" not in str(e.value)
