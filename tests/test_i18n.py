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


def _values(block: str) -> dict[str, str]:
    return dict(re.findall(r'\b(\w+): "([^"]*)"', block))


def test_both_languages_have_every_text():
    blocks = {lang: _values(block.split("\n};")[0]) for lang, block in _language_blocks().items()}
    assert set(blocks["en"]) == set(blocks["zh"])
    assert len(blocks["en"]) > 250


def test_the_chinese_texts_keep_one_term_per_concept_and_full_width_punctuation():
    """The glossary's term for each concept is the one the Chinese texts use (never a synonym it
    lists), and their punctuation beside Chinese is full-width (：，（） not : , ( ))."""
    text = (SRC / "web" / "static" / "i18n.js").read_text()
    glossary = re.findall(r'^  (\w+): \["([^"]+)", \[([^\]]*)\]\],$', text[text.index("const GLOSSARY"):], re.M)
    assert {"token", "micro_batch", "global_batch", "billion"} <= {c for c, _, _ in glossary}
    zh = _values(_language_blocks()["zh"].split("\n};")[0])
    values = "\n".join(zh.values())
    for concept, term, rejected in glossary:
        assert term in values, f"{concept}: {term} unused"
        for synonym in re.findall(r'"([^"]+)"', rejected):
            hits = [k for k, v in zh.items() if synonym.lower() in re.sub(r"\{\w+\}", "", v).lower()]
            assert not hits, f"{concept}: {synonym!r} instead of {term!r} in {hits}"
    cjk = r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"
    for key, value in zh.items():
        plain = re.sub(r"--[\w-]+|\{\w+\}", "", value)
        assert not re.search(rf"{cjk}\s?[:;,()?!]|[:;,(?!]\s?{cjk}", plain), f"{key}: {value}"
