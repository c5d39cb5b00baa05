"""The explorer's texts: every structured warning a plan can raise has its wording in both of
the page's languages (English and Simplified Chinese), with the same parameters."""

import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "trainplan"


def _language_blocks() -> dict[str, str]:
    text = (SRC / "web" / "static" / "i18n.js").read_text()
    zh = text.index("\n  zh: {")
    return {"en": text[text.index("\n  en: {"):zh], "zh": text[zh:]}


def test_every_plan_warning_is_worded_in_both_languages():
    codes = {m for path in SRC.rglob("*.py") for m in re.findall(r'\bwarn\("([a-z0-9_]+)"', path.read_text())}
    assert {"cudnn_unpublished", "megatron_cudnn", "sp_needs_tp"} <= codes
    blocks = _language_blocks()
    for code in sorted(codes):
        params = []
        for lang, block in blocks.items():
            found = re.search(rf'\bwarn_{code}: "([^"]*)"', block)
            assert found, f"warn_{code} has no {lang} text"
            params.append(sorted(re.findall(r"\{(\w+)\}", found.group(1))))
        assert params[0] == params[1], f"warn_{code}: en and zh name different parameters"
