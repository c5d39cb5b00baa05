"""Reading the user's input files and writing output files, defensively.

Every file trainplan reads on the user's behalf (a Hugging Face config.json, a model spec or
hardware profile TOML) goes through `read_text_file`: a size limit, strict UTF-8, no
directories; parse errors and nesting too deep for the parser become one `PlanError` naming
the option. Output files are written whole or not at all (`write_text_atomic`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import PlanError

MAX_INPUT_BYTES = 4 * 1024 * 1024  # config.json files are a few KiB; profiles a few hundred bytes
MAX_NESTING = 64  # JSON / TOML nesting; real configs nest 3 deep


_PATH_SEPS = frozenset({"/", os.sep} | ({os.altsep} if os.altsep else set()))


def looks_like_path(name: str) -> bool:
    """Whether a --model (or other catalog-or-file) argument names a file: it contains a path
    separator or ends in .json / .toml. Anything else is a catalog name, so a file that happens to
    be called like a catalog entry in the working directory never replaces it (`./gpt2` is the file)."""
    return any(s in name for s in _PATH_SEPS) or name.lower().endswith((".json", ".toml"))


def shown_path(path: str | Path) -> str:
    """A file name for a message: quoted when it holds control characters (one line, visible)."""
    return str(path) if str(path).isprintable() else repr(str(path))


def read_text_file(path: str | Path, field: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of a user's file, or a PlanError naming `field`: missing, a directory,
    unreadable, larger than `max_bytes` or not UTF-8 (a byte-order mark is allowed)."""
    path = Path(path)
    shown = shown_path(path)
    if path.is_dir():
        raise PlanError(field, f"{shown} is a directory, not a file")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise PlanError(field, f"cannot read {shown} ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL byte in the name
        raise PlanError(field, f"cannot read {str(path)!r} ({exc})") from None
    if len(data) > max_bytes:
        raise PlanError(field, f"{shown} is larger than {max_bytes // 1024 ** 2} MiB; is it the right file?")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PlanError(field, f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def nesting_depth(value) -> int:
    """How deeply lists and dicts nest in a parsed JSON / TOML value (a scalar is 0)."""
    depth, level = 0, [value]
    while depth <= MAX_NESTING and any(isinstance(v, dict | list) for v in level):
        depth += 1
        level = [c for v in level if isinstance(v, dict | list) for c in (v.values() if isinstance(v, dict) else v)]
    return depth


def _check_nesting(value, path: Path, field: str):
    if nesting_depth(value) > MAX_NESTING:
        raise PlanError(field, f"{path} nests lists or tables more than {MAX_NESTING} deep")
    return value


def non_finite_key(value, where: str = "") -> str | None:
    """The dotted key of the first NaN or infinite float in a parsed JSON / TOML value, or None."""
    stack = [(where, value)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return key or "value"
        if isinstance(v, dict):
            stack += [(f"{key}.{k}" if key else str(k), c) for k, c in v.items()]
        elif isinstance(v, list | tuple):
            stack += [(f"{key}[{i}]", c) for i, c in enumerate(v)]
    return None


def read_json_file(path: str | Path, field: str, max_bytes: int = MAX_INPUT_BYTES):
    """A user's JSON file, parsed: strict JSON (no NaN or Infinity), nested at most MAX_NESTING deep."""
    path = Path(path)
    text = read_text_file(path, field, max_bytes)

    def constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return _check_nesting(json.loads(text, parse_constant=constant), path, field)
    except json.JSONDecodeError as exc:
        raise PlanError(field, f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:
        raise PlanError(field, f"{path} is not valid JSON ({exc})") from None
    except RecursionError:
        raise PlanError(field, f"{path} nests lists or objects more than {MAX_NESTING} deep") from None


def read_toml_file(path: str | Path, field: str, max_bytes: int = MAX_INPUT_BYTES) -> dict:
    """A user's TOML file, parsed, nested at most MAX_NESTING deep."""
    import tomllib  # here: the catalog is read from its index, and most commands read no TOML

    path = Path(path)
    text = read_text_file(path, field, max_bytes)
    try:
        data = _check_nesting(tomllib.loads(text), path, field)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(field, f"{path} is not valid TOML ({exc})") from None
    except RecursionError:
        raise PlanError(field, f"{path} nests arrays or tables more than {MAX_NESTING} deep") from None
    key = non_finite_key(data)
    if key:
        raise PlanError(field, f"{path}: {key} must be a finite number (nan and inf are not numbers trainplan uses)")
    return data


def check_output_path(path: str | Path, field: str) -> Path:
    """Refuse an output path that cannot be written before any work is done: a directory, or
    one whose directory does not exist."""
    raw = str(path)
    if not raw.strip():
        raise PlanError(field, "name a file to write")
    path = Path(raw)
    if path.is_dir() or raw.endswith(("/", os.sep)):
        raise PlanError(field, f"{raw} is a directory: name a file inside it")
    parent = path.parent
    if not parent.is_dir():
        raise PlanError(field, f"directory {parent} does not exist")
    return path


def write_text_atomic(path: str | Path, text: str, field: str) -> Path:
    """Write `text` to `path` whole or not at all (a temporary file renamed over it)."""
    path = check_output_path(path, field)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise PlanError(field, f"cannot write {path} ({exc.strerror or exc})") from None
    return path
