"""The ecosystem's habits: `from trainplan import plan, search` (the CLI's JSON as a dict),
`trainplan --version`, and `--model org/name` from the local Hugging Face cache (offline)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainplan
from trainplan import plan, search
from trainplan.cli import app
from trainplan.errors import PlanError

RUNNER = CliRunner()


def test_plan_is_the_cli_json():
    args = dict(model="llama-3-8b", gpus=8, zero=3, mbs=2, gbs=64, seq_len=4096)
    res = RUNNER.invoke(app, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--zero", "3", "--mbs", "2",
                              "--gbs", "64", "--seq-len", "4096", "--json"])
    assert res.exit_code == 0, res.output
    assert json.dumps(plan(**args), sort_keys=True) == json.dumps(json.loads(res.stdout), sort_keys=True)
    # the catalog's exact count (test_catalog: the model card's 8,030,261,248)
    assert plan(**args)["model"]["params"] == 8_030_261_248


def test_plan_refuses_bad_input_by_name():
    with pytest.raises(PlanError) as err:
        plan(model="llama-3-8b", tp=3)
    assert err.value.field == "tp"
    with pytest.raises(PlanError) as err:
        plan(model="llama-3-8b", frobnicate=1)
    assert err.value.field == "frobnicate"


def test_search_keeps_given_layout_fixed():
    data = search(model="llama-3-8b", gpus=8, tp=2, top=3)
    assert data["best"] and all(b["parallel"]["tp"] == 2 for b in data["best"])


def test_modules_stay_modules():
    import trainplan.plan as plan_module
    import trainplan.search as search_module

    assert callable(plan_module) and plan_module.make_plan  # the module, callable as the API function
    assert search_module.LAYOUT_DIMENSIONS[0] == "tp"


def test_version():
    """`trainplan --version` prints the package's version, the one pyproject.toml declares."""
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    res = RUNNER.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout == f"trainplan {declared}\n" == f"trainplan {trainplan.__version__}\n"


def _cache(root, repo_id, data_dir, commit="0123abcd"):
    folder = root / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    (folder / "blobs").mkdir()
    shutil.copy(data_dir / "hf/llama-3-8b.json", folder / "blobs" / "5b1f6a0c")
    # huggingface_hub links each snapshot file to its blob
    (snap / "config.json").symlink_to(Path("..", "..", "blobs", "5b1f6a0c"))
    return snap / "config.json"


def test_model_id_from_the_hub_cache(tmp_path, monkeypatch, data_dir):
    """meta-llama/Meta-Llama-3-8B's config.json in the cache's snapshot layout ($HF_HUB_CACHE, or
    $HF_HOME/hub): the same model as the catalog's llama-3-8b, named by its id."""
    _cache(tmp_path / "hub", "meta-llama/Meta-Llama-3-8B", data_dir)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    got = plan(model="meta-llama/Meta-Llama-3-8B", gpus=8)
    assert got["model"]["name"] == "meta-llama/Meta-Llama-3-8B"
    assert got["model"]["params"] == plan(model="llama-3-8b", gpus=8)["model"]["params"] == 8_030_261_248
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    res = RUNNER.invoke(app, ["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpus", "8", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["model"]["params"] == 8_030_261_248


def test_model_id_missing_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    res = RUNNER.invoke(app, ["plan", "--model", "meta-llama/Llama-3.1-8B"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: model: meta-llama/Llama-3.1-8B is not in the catalog")
    assert "hf download meta-llama/Llama-3.1-8B config.json" in res.stderr
    assert str(tmp_path / "models--meta-llama--Llama-3.1-8B") in res.stderr


def test_docs_examples_run_as_shown(capsys, monkeypatch):
    """docs/python-api.md: each Python example prints what the page shows (its words and
    layout; the figures are the model's of the day)."""
    import re
    from pathlib import Path

    root = Path(__file__).parents[1]
    monkeypatch.chdir(root)
    page = (root / "docs/python-api.md").read_text()
    block = r"((?:(?!```).)*)```"
    examples = re.findall(r"```python\n" + block + r"\n\n```text\n" + block, page, re.S)
    assert len(examples) == 4

    def shape(text):
        return re.sub(r"-?\d[\d,.]*(e[-+]?\d+)?", "#", text).strip()

    for code, shown in examples:
        exec(compile(code, "python-api.md", "exec"), {})
        assert shape(capsys.readouterr().out) == shape(shown)
