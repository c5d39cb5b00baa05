"""Plans from the configurations users already have: a Megatron-LM launch script or arguments
file, a DeepSpeed JSON, a torchtitan job (0.3's `--module/--config` command line, or an older
TOML job file).

Each reader returns an `Imported`: the plan options the file sets (named as `trainplan plan`'s
options), what it read but does not change a plan (learning rate, data, logging), and what it
did not understand. A setting that would change the model and is not understood is refused
(PlanError), never dropped.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import PlanError
from ..files import read_text_file

FORMATS = ("megatron", "deepspeed", "torchtitan")


@lru_cache(maxsize=1)
def defaults() -> dict:
    """The frameworks' defaults and names the readers rely on (catalog/imports.toml, each table
    citing its source)."""
    from ..specs.catalog import CATALOG_DIR

    with open(CATALOG_DIR / "imports.toml", "rb") as fh:
        return tomllib.load(fh)


@dataclass
class Imported:
    """What a configuration file says about a run."""

    format: str
    options: dict  # plan options, as `trainplan plan` names them
    ignored: list[str] = field(default_factory=list)  # read, and not part of a plan (lr, data, logging)
    unknown: list[str] = field(default_factory=list)  # not understood: listed to the user
    notes: list[str] = field(default_factory=list)  # how something was read (a default, a guess)

    def messages(self) -> list[str]:
        """The lines to show on stderr."""
        lines = [f"{self.format}: {n}" for n in self.notes]
        if self.unknown:
            lines.append(f"{self.format}: not understood, not planned: {', '.join(self.unknown)}")
        if self.ignored:
            lines.append(f"{self.format}: read, not part of a plan: {', '.join(self.ignored)}")
        return lines


def detect(path: Path, text: str) -> str:
    """A file's format: JSON is DeepSpeed's, TOML torchtitan's, a script with `--module` and
    `--config` torchtitan 0.3's command line, any other script or arguments file Megatron-LM's."""
    stripped = text.lstrip()
    if path.suffix == ".json" or stripped.startswith("{"):
        return "deepspeed"
    if path.suffix == ".toml":
        return "torchtitan"
    if (("--module" in text and "--config" in text) or ("MODULE=" in text and "CONFIG=" in text)
            or "torchtitan.train" in text):
        return "torchtitan"
    return "megatron"


def read_config(path: str | Path, model_given: bool = False) -> Imported:
    """Read a configuration file into plan options. `model_given`: the caller names the model
    (--model / --hf-config), which then overrides the file's."""
    path = Path(path)
    return read_text(read_text_file(path, "from"), path, model_given)


def read_text(text: str, name: str | Path = "config", model_given: bool = False, trusted: bool = True) -> Imported:
    """Read a configuration's text (`name`: its file name, whose suffix may tell the format).
    Untrusted text (a web request) has a torchtitan command name torchtitan's own configs only."""
    path = Path(name)
    kind = detect(path, text)
    if kind == "deepspeed":
        from .deepspeed import read_deepspeed

        return read_deepspeed(text, path, model_given)
    if kind == "torchtitan":
        from .torchtitan import read_torchtitan

        return read_torchtitan(text, path, trusted)
    from .megatron import read_megatron

    return read_megatron(text, path, model_given)


def merge(imported: Imported, given: dict) -> dict:
    """The plan options: the file's, with those given alongside it on top (`given`: only the
    options the user set), then what the file leaves to the GPU count (torchtitan's derived
    data-parallel degree and global batch, DeepSpeed's accumulation) worked out."""
    given = {k: v for k, v in given.items() if v is not None}
    for k, v in given.items():
        if k in imported.options and imported.options[k] != v:
            imported.notes.append(f"--{k.replace('_', '-')} {v} given alongside: replaces the file's {imported.options[k]}")
    out = {**imported.options, **given}
    if "hf_config" in out and ("model" in given or "hf_config" in given):
        if "hf_config" not in given:
            out.pop("hf_config")  # a model named alongside replaces the one the file describes
    if imported.format == "torchtitan":
        from .torchtitan import finish

        finish(out, imported.notes)
    ranks = out.get("dp") or (out.get("gpus") or 0) // (out.get("tp", 1) * out.get("pp", 1) * out.get("cp", 1))
    per_step = out.pop("_micro_from", None)
    if per_step and "mbs" not in given:
        if not ranks or out["gbs"] % (per_step * ranks):
            raise PlanError("gpus", f"the DeepSpeed configuration leaves the micro-batch to train_batch_size "
                            f"{out['gbs']} / (gradient_accumulation_steps {per_step} x the data-parallel ranks): give "
                            "--gpus (or --mbs) so that it divides")
        out["mbs"] = out["gbs"] // (per_step * ranks)
    steps = out.pop("_accumulation", None)
    if steps and "gbs" not in given:
        if not ranks:
            raise PlanError("gpus", "the DeepSpeed configuration sets gradient_accumulation_steps without "
                            "train_batch_size: give --gpus (or --gbs) to plan its global batch")
        out["gbs"] = out.get("mbs", 1) * steps * ranks
    return out


def bad(field_: str, rule: str) -> PlanError:
    return PlanError(f"from.{field_}" if field_ else "from", rule)
