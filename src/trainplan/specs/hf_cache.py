"""Hugging Face model ids (`meta-llama/Llama-3.1-8B`) resolved to a config.json in the local
Hugging Face cache, offline.

The cache is where huggingface_hub keeps it (huggingface_hub/constants.py): $HF_HUB_CACHE,
else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. A model
lives in `models--<org>--<name>/snapshots/<commit>/config.json`, the commit of its `main`
branch named by `refs/main` (file_download.py's layout). Nothing is downloaded: a model not
there is refused with the command that fetches the one file needed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import PlanError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def is_repo_id(name: str) -> bool:
    """An `org/name` that is not a file path (no ./, no extension .json/.toml, not an existing path)."""
    return bool(REPO_ID.match(name)) and not name.lower().endswith((".json", ".toml")) and not Path(name).exists()


def cache_dir() -> Path:
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def config_path(repo_id: str, revision: str = "main") -> Path:
    """The cached config.json of a model id, or a PlanError saying how to get it."""
    cache = cache_dir()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshots = folder / "snapshots"
    candidates: list[Path] = []
    ref = folder / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip()
        candidates.append(snapshots / commit / "config.json")
    except (OSError, UnicodeDecodeError):
        pass
    try:  # no ref (a snapshot copied by hand): the most recent snapshot holding config.json
        found = sorted((p / "config.json" for p in snapshots.iterdir() if (p / "config.json").is_file()),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        candidates += found
    except OSError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise PlanError("model", f"{repo_id} is not in the catalog and its config.json is not in the local Hugging Face "
                    f"cache ({folder}/snapshots/<commit>/config.json): fetch it with `hf download {repo_id} "
                    f"config.json` (huggingface_hub's CLI; it puts it there), or give the path of a config.json")
