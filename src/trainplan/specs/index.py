"""The catalog's TOML files, parsed once: an index in the user's cache directory, rebuilt when
any catalog file changes (its name, size or modification time), so that a command reads one
JSON file instead of parsing some 55 TOML files. Beside it, the catalog's listings (`trainplan
models` / `gpus`: every entry validated, with its parameter counts), rebuilt when a catalog file
or the code that derives them changes, so that listing the catalog needs neither pydantic nor
numpy.

The index lives under $TRAINPLAN_CACHE_DIR, else $XDG_CACHE_HOME/trainplan, else
~/.cache/trainplan; never beside the package (an installed package may be read-only). Where
it cannot be read or written the catalog is parsed every time, as before; a file that fails
to parse is reported as always and no index is written.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from functools import cache
from pathlib import Path

from ..files import read_toml_file

CATALOG_DIR = Path(__file__).parent / "catalog"
FORMAT = 1  # bump when the index's layout changes


def cache_dir() -> Path:
    explicit = os.environ.get("TRAINPLAN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trainplan"


def _signature(root: Path) -> list[list]:
    """(relative path, size, mtime_ns) of every catalog TOML file, sorted."""
    out = []
    for folder in (root, root / "models", root / "hardware"):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(".toml") and entry.is_file():
                st = entry.stat()
                out.append([os.path.relpath(entry.path, root), st.st_size, st.st_mtime_ns])
    return sorted(out)


def _index_path(root: Path, name: str = "catalog") -> Path:
    tag = f"{zlib.crc32(f'{root.resolve()}|{sys.version_info[:2]}|{FORMAT}'.encode()):08x}"  # (no hashlib to load)
    return cache_dir() / f"{name}-{tag}.json"


def _read_index(path: Path, signature: list[list]) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            stored = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("signature") != signature or not isinstance(stored.get("files"), dict):
        return None
    return stored["files"]


def _write_index(path: Path, signature: list[list], files: dict) -> None:
    """Write the index whole (a temporary file renamed over it) or not at all."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"signature": signature, "files": files}, fh, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


@cache
def catalog_files(root: Path = CATALOG_DIR) -> dict[str, dict]:
    """Every catalog TOML file under `root` parsed: {relative path ("models/gpt2.toml"): data}."""
    signature = _signature(root)
    path = _index_path(root)
    files = _read_index(path, signature)
    if files is not None:
        return files
    files = {}
    for rel, _, _ in signature:
        kind = rel.split(os.sep)[0] if os.sep in rel else rel.removesuffix(".toml")
        files[rel.replace(os.sep, "/")] = read_toml_file(root / rel, kind)
    _write_index(path, signature, files)
    return files


def catalog_file(rel: str) -> dict:
    """One catalog file's data by its relative path ("conventions.toml", "models/gpt2.toml")."""
    return catalog_files()[rel]


# The modules whose code a listing's figures come from (the specs' fields, defaults and checks,
# the parameter counts): a listing is rebuilt when one of them changes, as when a catalog file does.
LISTING_CODE = ("specs/model.py", "specs/hardware.py", "specs/catalog.py", "specs/index.py", "limits.py", "units.py")


def _code_signature() -> list[list]:
    package = Path(__file__).resolve().parents[1]
    out = []
    for rel in LISTING_CODE:
        try:
            st = os.stat(package / rel)
        except OSError:
            continue
        out.append([rel, st.st_size, st.st_mtime_ns])
    return out


def cached_listing(kind: str, build, root: Path = CATALOG_DIR) -> list[dict]:
    """The listing of `kind` ("models", "hardware"): `build()` (a list of JSON-able rows) run once
    and kept beside the index while neither the catalog nor the code that derives the rows
    changes. A `build` that raises (a catalog file that does not validate) raises every time,
    and nothing is kept."""
    signature = [kind, _signature(root), _code_signature()]
    path = _index_path(root, f"listing-{kind}")
    rows = _read_index(path, signature)
    if rows is not None and isinstance(rows.get("rows"), list):
        return rows["rows"]
    rows = json.loads(json.dumps(build()))  # as read back: lists for tuples, whatever the run
    _write_index(path, signature, {"rows": rows})
    return rows
