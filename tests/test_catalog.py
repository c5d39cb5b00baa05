"""Exact parameter counts against published totals (each catalog entry cites its source)."""

import json
import math

import pytest

from trainplan.specs import catalog

# (model, published total, published active or None, source). Tolerance 0.5% unless the
# published figure is a rounded-down model-card number (see ROUNDED_DOWN).
PUBLISHED = [
    ("gpt2", 124_439_808, None, "HF model card / transformers count"),
    ("gpt2-medium", 354_823_168, None, "HF model card"),
    ("gpt2-large", 774_030_080, None, "HF model card"),
    ("gpt2-xl", 1.558e9, None, "GPT-2 XL 1.558B (HF model card: 1.5B, 1,557,611,200 counted)"),
    ("gpt3-175b", 175.0e9, None, "Brown et al. 2020 Table 2.1"),
    ("megatron-22b", 22e9, None, "Korthikanti et al. 2023 Table 3"),
    ("megatron-175b", 175e9, None, "Korthikanti et al. 2023 Table 3"),
    ("megatron-530b", 530e9, None, "Korthikanti et al. 2023 Table 3 (MT-NLG)"),
    ("megatron-1t", 1008.0e9, None, "Narayanan et al. 2021 Table 1 (1008.0B)"),
    ("llama-2-7b", 6.74e9, None, "Touvron et al. 2023 / HF card: 6.74B"),
    ("llama-2-13b", 13.0e9, None, "HF card: 13B (13,015,864,320)"),
    ("llama-2-70b", 69.0e9, None, "HF card: 69B (68,976,648,192)"),
    ("llama-3-8b", 8.03e9, None, "Meta Llama 3 card: 8.03B"),
    ("llama-3-70b", 70.6e9, None, "Meta Llama 3 card: 70.6B"),
    ("llama-3.1-8b", 8.03e9, None, "Meta Llama 3.1 card: 8.03B"),
    ("llama-3.1-70b", 70.6e9, None, "Meta Llama 3.1 card: 70.6B"),
    ("llama-3.1-405b", 405.9e9, None, "Meta Llama 3.1 card: 405.9B"),
    ("mistral-7b", 7.24e9, None, "Mistral 7B card: 7.24B"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, "Jiang et al. 2024 (arXiv 2401.04088): 46.7B total, 12.9B active"),
    ("mixtral-8x22b", 141e9, 39e9, "Mistral AI: 141B total, 39B active"),
    ("qwen2.5-0.5b", 0.49e9, None, "Qwen2.5 card: 0.49B"),
    ("qwen2.5-7b", 7.61e9, None, "Qwen2.5 card: 7.61B"),
    ("qwen2.5-14b", 14.7e9, None, "Qwen2.5 card: 14.7B"),
    ("qwen2.5-72b", 72.7e9, None, "Qwen2.5 card: 72.7B"),
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, "Qwen1.5-MoE card: 14.3B total, 2.7B activated"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "Qwen3 card: 30.5B total, 3.3B activated"),
    ("deepseek-v3", 671e9, 37e9, "DeepSeek-V3 report: 671B total, 37B activated"),
    ("gpt-neox-20b", 20_554_567_680, None, "Black et al. 2022"),
    ("phi-2", 2_779_683_840, None, "phi-2 card: 2.7B (2,779,683,840 counted by transformers)"),
    ("phi-3-mini-4k", 3.8e9, None, "Phi-3-mini card: 3.8B"),
    ("phi-3-medium-4k", 14e9, None, "Phi-3-medium card: 14B"),
    ("phi-4", 14.7e9, None, "Abdin et al. 2024: 14.7B"),
    ("phi-3.5-moe", 41.9e9, 6.6e9, "Phi-3.5-MoE card: 41.9B total, 6.6B active"),
    ("deepseek-v2-lite", 15.7e9, None, "DeepSeek-V2 report App. B: 15.7B total"),
    ("falcon-7b", 6_921_720_704, None, "tiiuae/falcon-7b, counted by transformers"),
    ("falcon-40b", 41.8e9, None, "Falcon-40B: 41.8B"),
    ("granite-3-8b", 8.1e9, None, "Granite 3.0 8B card: 8.1B"),
    ("granite-3-3b-a800m", 3.3e9, None, "Granite 3.0 3B-A800M card: 3.3B total"),
    ("glm-4-9b", 9.4e9, None, "GLM-4-9B card: 9.4B"),
    ("gpt-j-6b", 6_053_381_344, None, "GPT-J 6B card: 6,053,381,344"),
    # families defined by their norms, masks and soft-capping (specs/hf_families_norms.py)
    ("gemma-2-9b", 9.24e9, None, "Gemma 2 report (arXiv 2408.00118): 9.24B (9,241,705,984 counted)"),
    ("gemma-2-27b", 27.2e9, None, "Gemma 2 report: 27.2B"),
    ("olmo-2-7b", 7.3e9, None, "OLMo 2 card: 7.3B"),
    ("olmo-2-13b", 13.7e9, None, "OLMo 2 card: 13.7B"),
    ("olmoe-1b-7b", 6.9e9, None, "OLMoE (arXiv 2409.02060): 6.9B total (its 1.3B active is 1.28B rounded)"),
    ("gpt-oss-20b", 20.91e9, None, "gpt-oss card (arXiv 2508.10925) Table 1: 20.91B"),
    ("gpt-oss-120b", 116.83e9, None, "gpt-oss card Table 1: 116.83B"),
    ("qwen3-8b", 8.2e9, None, "Qwen3 card: 8.2B"),
    ("qwen3-32b", 32.8e9, None, "Qwen3 card: 32.8B"),
    ("command-r", 35e9, None, "c4ai-command-r-v01 card: 35B"),
]

# Model-card figures truncated to the digits shown (e.g. 494,032,768 published as "0.49B",
# DeepSeek-V3's 37.55B activated published as "37B"): the exact count must truncate to the
# published figure, and stay within 2%.
ROUNDED_DOWN = {("qwen2.5-0.5b", "total"): 2, ("qwen3-30b-a3b", "active"): 2,
                ("deepseek-v3", "active"): 2, ("phi-3-mini-4k", "total"): 2, ("phi-3.5-moe", "active"): 2,
                ("granite-3-8b", "total"): 2}


def _truncates_to(count: float, published: float, digits: int) -> bool:
    scale = 10 ** (math.floor(math.log10(published)) - digits + 1)
    return math.floor(count / scale) * scale == pytest.approx(published)


@pytest.mark.parametrize("name,total,active,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_published(name, total, active, source):
    spec = catalog.model(name)
    assert spec.source, "every catalog entry cites a source"
    for kind, count, published in (("total", spec.params, total), ("active", spec.active_params, active)):
        if published is None:
            continue
        digits = ROUNDED_DOWN.get((name, kind))
        if digits:
            assert _truncates_to(count, published, digits), (name, kind, count, source)
            assert count == pytest.approx(published, rel=0.02)
        else:
            assert count == pytest.approx(published, rel=0.005), (name, kind, count, source)


def test_catalog_size_and_sources():
    models = catalog.models()
    assert len(models) >= 20
    assert all(m.source for m in models)
    gpus = catalog.gpus()
    assert len(gpus) >= 20
    assert all(g.source for g in gpus)


def test_exact_counts_of_well_known_models():
    # Exact integers from the models' published checkpoints (transformers' num_parameters()).
    assert catalog.model("gpt2-xl").params == 1_557_611_200
    assert catalog.model("llama-2-7b").params == 6_738_415_616
    assert catalog.model("llama-3-8b").params == 8_030_261_248
    assert catalog.model("mixtral-8x7b").params == 46_702_792_704


@pytest.mark.parametrize("name,mem,bf16,hbm", [
    ("H100-SXM", 80, 989, 3.35),  # NVIDIA H100 SXM datasheet (989.4 TF bf16 dense, 3.35 TB/s)
    ("A100-80GB-SXM", 80, 312, 2.039),  # NVIDIA A100 datasheet
    ("H200-SXM", 141, 989, 4.8),
    ("H100-SXM-96GB", 96, 989, 2.4),  # torchtitan's Grand Teton H100s: 96GB HBM2e, 2.4 TB/s (SXM peak kept)
    ("B200", 180, 2250, 8.0),
    ("MI300X", 192, 1307, 5.3),
])
def test_accelerator_figures(name, mem, bf16, hbm):
    g = catalog.gpu(name)
    assert g.memory_gib == mem
    assert g.peak("bf16") == pytest.approx(bf16 * 1e12)
    assert g.hbm_tbs == pytest.approx(hbm)


def test_gpu_aliases_and_unknown():
    from trainplan.errors import PlanError

    assert catalog.gpu("h100").name == "H100-SXM"
    with pytest.raises(PlanError) as e:
        catalog.gpu("h1000")
    assert e.value.field == "gpu" and "h100" in str(e.value).lower()


def test_catalog_index_is_rebuilt_when_a_catalog_file_changes(tmp_path, monkeypatch):
    """The parsed catalog is kept in the user's cache directory and read back while no catalog
    file changed; an edited file (new size or modification time) rebuilds it."""
    import shutil

    from trainplan.specs import index

    root = tmp_path / "catalog"
    shutil.copytree(index.CATALOG_DIR, root)
    monkeypatch.setenv("TRAINPLAN_CACHE_DIR", str(tmp_path / "cache"))
    files = index.catalog_files.__wrapped__(root)
    assert files["models/gpt2.toml"]["layers"] == 12 and len(list((tmp_path / "cache").glob("catalog-*.json"))) == 1
    again = index.catalog_files.__wrapped__(root)  # read back from the index: the same data
    assert again == files
    gpt2 = root / "models" / "gpt2.toml"
    gpt2.write_text(gpt2.read_text().replace("layers = 12", "layers = 120"))
    assert index.catalog_files.__wrapped__(root)["models/gpt2.toml"]["layers"] == 120


def test_catalog_works_where_no_index_can_be_written(tmp_path, monkeypatch):
    """A cache directory that cannot be created (here: a file in its way) leaves the catalog
    parsed directly, as a read-only install needs; nothing is written beside the package."""
    from trainplan.specs import index

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("TRAINPLAN_CACHE_DIR", str(blocker / "cache"))
    files = index.catalog_files.__wrapped__(index.CATALOG_DIR)
    assert files["hardware/h100-sxm.toml"]["name"] == "H100-SXM"
    assert not list(index.CATALOG_DIR.rglob("*.json"))


def test_catalog_listings_are_the_specs_own_figures_and_follow_the_catalog(tmp_path, monkeypatch):
    """`trainplan models` / `gpus` read rows kept beside the index: the same figures the
    validated specs give (GPT-2's 124,439,808 parameters, the count of Hugging Face's gpt2
    checkpoint with its tied head), read back unchanged, and rebuilt when a catalog file changes."""
    import shutil

    from trainplan.specs import index

    root = tmp_path / "catalog"
    shutil.copytree(index.CATALOG_DIR, root)
    monkeypatch.setenv("TRAINPLAN_CACHE_DIR", str(tmp_path / "cache"))
    models = [{"name": m.name, "params": m.params, "active_params": m.active_params, "kv_heads": m.n_kv_heads}
              for m in catalog.models()]

    def listing(name="gpt2"):
        rows = index.cached_listing("models", lambda: [
            {"name": m.name, "params": m.params, "active_params": m.active_params, "kv_heads": m.n_kv_heads}
            for m in catalog.models()], root)
        return rows, next(r for r in rows if r["name"] == name)

    rows, gpt2 = listing()
    assert rows == models and gpt2["params"] == 124_439_808
    assert len(list((tmp_path / "cache").glob("listing-models-*.json"))) == 1
    built = []
    again = index.cached_listing("models", lambda: built.append(1) or [], root)  # read back, not rebuilt
    assert again == rows and not built
    gpt2_file = root / "models" / "gpt2.toml"
    gpt2_file.write_text(gpt2_file.read_text() + "\n# edited\n")
    assert index.cached_listing("models", lambda: built.append(1) or [], root) == [] and built


def test_catalog_listing_rows_match_the_specs():
    """The rows the listing commands print are the specs' figures and fields, every entry once,
    in the specs' order; an accelerator's row is its model_dump() (tuples as JSON lists)."""
    assert catalog.model_rows() == [
        {"name": m.name, "family": m.family, "params": m.params, "active_params": m.active_params,
         "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads, "vocab": m.vocab,
         "experts": m.experts, "source": m.source} for m in catalog.models()]
    assert catalog.gpu_rows() == [json.loads(json.dumps(g.model_dump())) for g in catalog.gpus()]
    h100 = next(r for r in catalog.gpu_rows() if r["name"] == "H100-SXM")
    assert h100["memory_gib"] == 80 and h100["peak_tflops"]["bf16"] == 989


def test_a_broken_catalog_entry_fails_the_listing_every_time(tmp_path, monkeypatch):
    """A catalog file that does not validate is named by the listing, and no listing is kept
    (so the next run names it again rather than printing stale rows)."""
    import shutil

    from trainplan.errors import PlanError
    from trainplan.specs import index

    root = tmp_path / "catalog"
    shutil.copytree(index.CATALOG_DIR, root)
    monkeypatch.setenv("TRAINPLAN_CACHE_DIR", str(tmp_path / "cache"))
    bad = root / "hardware" / "h100-sxm.toml"
    bad.write_text(bad.read_text().replace("memory_gib = 80", "memory_gib = -80"))
    data = index.catalog_files.__wrapped__(root)
    from trainplan.specs.hardware import GPUSpec

    def build():
        rows = []
        for rel, entry in data.items():
            if rel.startswith("hardware/"):
                try:
                    rows.append(GPUSpec(**entry).model_dump())
                except ValueError as exc:
                    raise PlanError(rel, "invalid") from exc
        return rows

    for _ in range(2):
        with pytest.raises(PlanError) as e:
            index.cached_listing("hardware", build, root)
        assert e.value.field == "hardware/h100-sxm.toml"
    assert not list((tmp_path / "cache").glob("listing-hardware-*.json"))


# What a catalog entry may state beyond its config.json: its name, source and published sizes,
# the family's name as the catalog spells it, and the activation kernel (a config.json's
# hidden_act is read as the separate kernel transformers runs; a catalog entry states the fused
# default unless it says otherwise).
NOT_FROM_CONFIG = {"name", "source", "published_params", "published_active_params", "family", "activation",
                   "kv_heads"}


def test_published_configs_import_as_their_catalog_entries():
    """Every published config.json kept as test data (tests/data/hf) imports to the architecture
    its catalog entry states, field by field: sliding windows, rotary scaling and bases, norms,
    routers and shapes alike (K/V heads compared as counts)."""
    from pathlib import Path

    from trainplan.specs import hf

    paths = sorted((Path(__file__).parent / "data" / "hf").glob("*.json"))
    assert len(paths) >= 15
    for path in paths:
        mine, theirs = hf.from_file(path), catalog.model(path.stem)
        catalogued = theirs.model_dump()
        differ = {k: (v, catalogued[k]) for k, v in mine.model_dump().items()
                  if k not in NOT_FROM_CONFIG and v != catalogued[k]}
        assert differ == {} and mine.n_kv_heads == theirs.n_kv_heads, path.stem
    assert catalog.model("phi-3-mini-4k").sliding_window == 2047 and catalog.model("mistral-7b").sliding_window == 4096
