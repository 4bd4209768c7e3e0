"""Push an exported folder to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path


def push_folder(folder: Path, repo_id: str, private: bool) -> None:
    """Upload with huggingface_hub; the token comes from HF_TOKEN or the cached login and is never printed."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="headstart export")
    print(f"pushed {folder} to https://huggingface.co/{repo_id}")
