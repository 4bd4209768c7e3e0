"""Push an exported folder to the Hugging Face Hub. The token comes from HF_TOKEN or the cached login and is
never printed; `check_hub_access` runs before anything is exported, so a missing token or an unreachable Hub
costs one line, not a traceback after the folders are written."""

from __future__ import annotations

from pathlib import Path

from headstart.models.export.publish import damage


class HubError(ValueError):
    """The Hub cannot take the push (no token, rejected token, no network); the message names the fix."""


def check_hub_access(repo_id: str) -> None:
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"--push {repo_id}: not a Hub repo id ({e}). Fix: --push <user or org>/<name>") from e
    if get_token() is None:
        raise HubError("--push needs a Hugging Face token. Fix: HF_TOKEN=<a write token> or `hf auth login`")
    try:
        HfApi().whoami()
    except Exception as e:  # noqa: BLE001 - offline mode, no network, DNS, proxy, 401: the same answer to the user
        raise HubError(
            f"--push {repo_id}: the Hub did not accept the token or cannot be reached ({type(e).__name__}). "
            "Fix: check the network and token, or export without --push and push the folders later"
        ) from e


def push_folder(folder: Path, repo_id: str, private: bool) -> None:
    """Upload with huggingface_hub, after checking the folder against its SHA256SUMS."""
    from huggingface_hub import HfApi

    if why := damage(folder):
        raise HubError(
            f"{folder} was not pushed: {why}. Fix: export it again (./launch.sh export ... --push)"
        )
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="headstart export")
    except Exception as e:  # noqa: BLE001 - network / permission errors mid-push
        raise HubError(
            f"pushing {folder} to {repo_id} failed ({type(e).__name__}: {str(e)[:200]}); the folder is written. "
            "Fix: check the token's write access and the network, then push again"
        ) from e
    print(f"pushed {folder} to https://huggingface.co/{repo_id}")
