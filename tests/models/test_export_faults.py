"""Where an export may write (models/export/publish.py): never into a run's own state, never over a folder
that is not an earlier export, and each layout published whole (an export that fails midway leaves the
previous one untouched). Each refusal: exit code 2, one line naming the folder and the fix, nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.medusa import MedusaConfig
from headstart.train import export as export_cli

TINY = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0})


def make_run(root: Path, backbone) -> Path:
    """A run folder as training leaves it: checkpoints/step_2/{drafter, trainer_state.json}, drafter/."""
    cfg = MedusaConfig(num_heads=2)
    heads = build_drafter("medusa", cfg, backbone)
    step = root / "checkpoints" / "step_00000002"
    save_drafter(step / "drafter", heads, "medusa", cfg, TINY, backbone, extra={"step": 2})
    (step / "trainer_state.json").write_text('{"step": 2, "files": {}}')
    save_drafter(root / "drafter", heads, "medusa", cfg, TINY, backbone, extra={"step": 2})
    (root / "config.json").write_text("{}")
    return root


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused(argv: list[str], capsys, *needles: str) -> str:
    with pytest.raises(SystemExit) as e:
        export_cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "where",
    ["drafter", "checkpoints/step_00000002/drafter", "checkpoints/step_00000002", "checkpoints", ".",
     "drafter/sub", "eval"],
)  # fmt: skip
def test_export_into_a_runs_own_state_is_refused_and_writes_nothing(backbone, tmp_path, capsys, where):
    run = make_run(tmp_path / "run", backbone)
    before = digest(run)
    out = run / where
    refused(
        ["--checkpoint", str(run), "--out", str(out), "--layout", "medusa"], capsys, f"--out {out}", "Fix:"
    )
    assert digest(run) == before  # the trained drafter and checkpoints untouched, nothing added
    assert not list(tmp_path.rglob("*.tmp*"))


def test_export_into_another_drafter_folder_is_refused(backbone, tmp_path, capsys):
    run, other = make_run(tmp_path / "run", backbone), make_run(tmp_path / "other", backbone)
    before = digest(other)
    refused(["--checkpoint", str(run), "--out", str(other / "drafter")], capsys, "drafter folder")
    assert digest(other) == before


def test_reexport_replaces_each_layout_whole_and_a_failed_one_leaves_the_previous(
    backbone, tmp_path, capsys, monkeypatch
):
    run = make_run(tmp_path / "run", backbone)
    out = tmp_path / "exp"
    export_cli.main(["--checkpoint", str(run), "--out", str(out)])
    first = digest(out)
    assert set(first) >= {"medusa/README.md", "vllm/config.json", "vllm/model.safetensors"}
    (out / "vllm" / "stale.txt").write_text("from an older export")  # not in the new one: must go
    export_cli.main(["--checkpoint", str(run), "--out", str(out)])
    assert not (out / "vllm" / "stale.txt").exists()
    assert set(digest(out)) == set(first)
    # a failure after the weights of the second layout were written (SIGTERM, a full disk): nothing published
    import headstart.models.export.card as card

    real, calls = card.save_card, []

    def dies_on_second(c, folder):
        calls.append(folder)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(c, folder)

    monkeypatch.setattr(card, "save_card", dies_on_second)
    before = digest(out)
    line = refused(["--checkpoint", str(run), "--out", str(out)], capsys, "disk full at", "Fix:")
    assert f"{out}.tmp" in line  # the folder being written
    assert digest(out) == before  # the previous export, every layout as it was
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name or ".old" in p.name] == []


def test_export_never_replaces_a_folder_that_is_not_an_earlier_export(backbone, tmp_path, capsys):
    run = make_run(tmp_path / "run", backbone)
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    line = refused(["--checkpoint", str(run), "--out", str(home), "--layout", "vllm"], capsys, "notes.txt")
    assert "new or empty" in line and (home / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


def test_out_an_existing_file_is_one_line(backbone, tmp_path, capsys):
    run = make_run(tmp_path / "run", backbone)
    (tmp_path / "a_file").write_text("x")
    refused(["--checkpoint", str(run), "--out", str(tmp_path / "a_file")], capsys, "is a file", "Fix:")
    refused(["--checkpoint", str(run), "--out", str(tmp_path / "a_file" / "x")], capsys, "a_file", "Fix:")
    assert (tmp_path / "a_file").read_text() == "x"
