"""Resolve a model argument (local folder or Hugging Face Hub id) to a local checkpoint folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tts_engine.models.qwen3_tts.config import CheckpointError

log = logging.getLogger(__name__)


def resolve_model(model: str | Path) -> Path:
    """A local folder is used as is; anything else is a Hub id downloaded (or found in the cache).

    The download shows huggingface_hub's progress bars. With HF_HUB_OFFLINE=1 a populated cache works
    and a missing one raises an error that says so.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = str(model)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise CheckpointError(f"model {text!r}: not a folder, and not a Hub id of the form 'owner/name'")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    log.info("resolving %s from the Hugging Face Hub%s", text, " (offline cache)" if offline else "")
    try:
        return Path(snapshot_download(repo_id=text, local_files_only=offline))
    except RepositoryNotFoundError as exc:
        raise CheckpointError(f"model {text!r}: no such repository on the Hugging Face Hub") from exc
    except LocalEntryNotFoundError as exc:
        raise CheckpointError(
            f"model {text!r}: not in the local cache and the Hub is unreachable or offline "
            "(HF_HUB_OFFLINE=1); download it once with network access or pass a local folder") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise CheckpointError(f"model {text!r}: download failed: {exc}") from exc
