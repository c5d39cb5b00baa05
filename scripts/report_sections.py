"""One generated section of docs/validation.md, written in place: the scripts that measure a
part of the matrix (pipeline_report.py, sp_cp_report.py, ep_zero2_report.py,
mla_lora_report.py) each own the text between their BEGIN and END markers."""

from __future__ import annotations

from pathlib import Path

VALIDATION_MD = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
# a section not yet in the file goes before the closing notes
BEFORE = "\n## What the memory model assumes"


def write_section(begin: str, end: str, lines: list[str], path: Path = VALIDATION_MD) -> Path:
    """Replace the text from `begin` to `end` with `lines` (which start with `begin` and end
    with `end`), or insert them before the closing notes the first time."""
    text = path.read_text()
    section = "".join(lines)
    if begin in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.replace(BEFORE, "\n" + section + BEFORE, 1)
    path.write_text(text)
    return path
