"""Every input of the CLI and its input files holds under abuse: bad files (binary, not UTF-8,
too large, too deep, a directory, the wrong JSON / TOML type), non-finite or absurd numbers and
malformed flags give exit status 2 and one line `error: <field>: <rule>`, never a traceback; a
plan that runs prints strict JSON (no NaN or Infinity); a catalog name is never a file."""

import json
import math
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trainplan import cli
from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.files import MAX_INPUT_BYTES, MAX_NESTING, looks_like_path
from trainplan.plan import Plan, make_plan
from trainplan.specs import catalog, hf

RUNNER = CliRunner()
HF_CASES = ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "deepseek-v3", "gpt2-xl", "gpt-neox-20b"]
GPT2_PARAMS = 124_439_808  # catalog gpt2 (test_catalog: the HF model card's count)


def _reject_constant(name):
    raise AssertionError(f"non-finite {name} in JSON output")


def run(*args):
    """Invoke the CLI; a traceback (any exception but SystemExit) fails the test."""
    res = RUNNER.invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"traceback for {args}") from res.exception
    return res


def refused(res, field: str | None = None) -> str:
    """The run exited 2 with exactly one line `error: <field>: <rule>` on stderr; returns it."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    name, _, rule = lines[0].removeprefix("error: ").partition(": ")
    assert name and rule and " " not in name, lines[0]
    if field is not None:
        assert name == field, lines[0]
    return lines[0]


def finite_json(res):
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout, parse_constant=_reject_constant)


def check(res):
    """Exit 0 with strict JSON, or exit 2 with one line naming the field."""
    assert res.exit_code in (0, 2), (res.exit_code, res.output)
    if res.exit_code == 2:
        event(f"refused: {refused(res).removeprefix('error: ').partition(':')[0]}")
    else:
        event("ran")
        if res.stdout.lstrip().startswith(("{", "[")):
            finite_json(res)


def hf_config(name, data_dir) -> dict:
    return json.loads((data_dir / "hf" / f"{name}.json").read_text())


# ---- the cases the probes found, one by one ------------------------------------------------------
@pytest.mark.parametrize("content,words", [
    (b"\x00\xff\xfe\x80binary", "is not UTF-8 text (byte 0xff at offset 1)"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
    (b"", "is not valid JSON"),
    (b"[1, 2]", None),
    (b"42", None),
    (b"[" * 100_000 + b"]" * 100_000, f"more than {MAX_NESTING} deep"),
    (b'{"model_type": "llama", "hidden_size": NaN}', "NaN is not a JSON number"),
])
def test_bad_config_json_files_are_refused_in_one_line(tmp_path, content, words):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    line = refused(run("plan", "--model", path), None)
    if words:
        assert words in line and line.startswith("error: model: ")
    else:
        assert line == "error: hf_config: must be a JSON object (the contents of config.json)"


def test_files_too_large_or_not_files_are_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_INPUT_BYTES + 1))
    assert "larger than 4 MiB" in refused(run("plan", "--model", big), "model")
    assert "larger than 4 MiB" in refused(run("plan", "--model", "/dev/zero"), "model")  # endless
    assert "is a directory" in refused(run("plan", "--model", f"{tmp_path}/"), "model")
    assert "is a directory" in refused(run("plan", "--gpu-profile", tmp_path), "gpu_profile")
    assert "No such file" in refused(run("plan", "--model", tmp_path / "none.toml"), "model")


@pytest.mark.parametrize("key,value,field,words", [
    ("model_type", [], "hf_config.model_type", "must be a string"),
    ("num_key_value_heads", 0, "hf_config.num_key_value_heads", "from 1 to 100,000 (got 0)"),  # was MHA
    ("num_key_value_heads", 7, "hf_config.num_key_value_heads", "must divide num_attention_heads (32)"),
    ("tie_word_embeddings", "no", "hf_config.tie_word_embeddings", "must be true or false"),  # was tied
    ("hidden_size", 4096.0, "hf_config.hidden_size", "must be an integer"),
    ("num_hidden_layers", True, "hf_config.num_hidden_layers", "must be an integer"),
    ("vocab_size", -1, "hf_config.vocab_size", "from 1 to 100,000,000"),
    ("rope_theta", 1e300, "hf_config.rope_theta", "must be a number in (0, 1e+12]"),
    ("hidden_size", 4097, "hf_config.num_attention_heads", "must divide hidden_size (4097)"),
])
def test_config_keys_are_checked_by_name(data_dir, key, value, field, words):
    cfg = {**hf_config("llama-3-8b", data_dir), key: value}
    with pytest.raises(PlanError) as e:
        hf.from_dict(cfg)
    assert e.value.field == field and words in e.value.rule


def test_a_null_key_is_the_default_as_in_transformers(data_dir):
    """num_key_value_heads: null is LlamaConfig's None: as many KV heads as attention heads."""
    cfg = {**hf_config("llama-3-8b", data_dir), "num_key_value_heads": None}
    assert hf.from_dict(cfg).n_kv_heads == 32


def test_an_absurd_model_blames_the_key_that_makes_it(data_dir):
    """kv_lora_rank 1e15 once gave 2.4e21 parameters and an error about gpu_mtbf_hours. Out of range
    it is refused by its range; in range but making the model larger than 1e14 parameters, it is
    named: DeepSeek-V3 with kv_lora_rank 1,000,000 (the catalog's largest: 512) has 61 layers x
    kv_b 1e6 x 128 x 256 = 2.0e12 parameters there, within the limit; 80 layers of 1e6-wide
    hidden and 1e7-wide MLPs are not: 80 x (3 x 1e6 x 1e7 MLP + 4 x 1e12 attention) plus
    2 x 128,256 x 1e6 embeddings = 2.72e15, blamed on the MLP width, the furthest above the
    catalog's largest (102,400)."""
    cfg = {**hf_config("deepseek-v3", data_dir), "kv_lora_rank": 10 ** 15}
    with pytest.raises(PlanError) as e:
        hf.from_dict(cfg)
    assert e.value.field == "hf_config.kv_lora_rank"
    assert hf.from_dict({**cfg, "kv_lora_rank": 10 ** 6}).params < catalog.MAX_PARAMS
    big = {**hf_config("llama-3-8b", data_dir), "num_hidden_layers": 80, "hidden_size": 10 ** 6,
           "num_attention_heads": 1000, "num_key_value_heads": 1000, "intermediate_size": 10 ** 7}
    with pytest.raises(PlanError) as e:
        hf.from_dict(big)
    assert e.value.field == "hf_config.intermediate_size" and "2.72e+15 parameters" in e.value.rule
    layers = {**hf_config("deepseek-v3", data_dir), "num_hidden_layers": 4096, "n_routed_experts": 100_000}
    with pytest.raises(PlanError) as e:  # 4,096 layers (32 x the catalog's deepest) of 100,000 experts (390 x)
        hf.from_dict(layers)
    assert e.value.field == "hf_config.n_routed_experts" and "catalog's largest experts is 256" in e.value.rule
    with pytest.raises(PlanError) as e:
        hf.from_dict({**layers, "num_hidden_layers": 100_000})
    assert e.value.field == "hf_config.num_hidden_layers" and "at most 4,096 layers" in e.value.rule


def test_a_spec_toml_keeps_to_the_same_limits(tmp_path):
    head = 'name = "x"\nsource = "test"\nlayers = 2\nhidden = 64\nheads = 4\nffn = 128\nvocab = 100\n'
    spec = tmp_path / "spec.toml"
    spec.write_text(head + "published_params = inf\n")
    assert "published_params must be a finite number" in refused(run("plan", "--model", spec), "model")
    spec.write_text(head + "kv_lora_rank = 1000000000000\nqk_rope_head_dim = 64\nqk_nope_head_dim = 64\n"
                    "v_head_dim = 64\n")
    refused(run("plan", "--model", spec), "model.kv_lora_rank")
    spec.write_text(head.replace("layers = 2", "layers = true"))  # pydantic alone reads it as 1
    assert "is not a flag" in refused(run("plan", "--model", spec), "model.layers")
    spec.write_text(head.replace("hidden = 64", "hidden = 64.0"))
    assert "must be an integer" in refused(run("plan", "--model", spec), "model.hidden")


@pytest.mark.parametrize("text,words", [
    ("efficiency = 5\n", "efficiency must be a table"),
    ("[efficiency]\ngemm = 1e-300\n", "efficiency.gemm must be a number in [1e-06, 1.5]"),
    ("[efficiency]\ngemm = 5.0\n", "efficiency.gemm must be a number in [1e-06, 1.5]"),
    ("[efficiency]\ngemm = true\n", "efficiency.gemm must be a number"),
    ("[efficiency]\ngemm = nan\n", "gemm must be a finite number"),
    ("gpu = 7\n[efficiency]\ngemm = 0.8\n", "gpu must be an accelerator's name"),
    ("[efficiency]\ngemm = 0.8\n[gemm_curve]\nn = [1, 2]\nfraction = [0.5, 1e-300]\n", "gemm_curve.fraction"),
])
def test_bad_profiles_are_refused(tmp_path, text, words):
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert words in refused(run("plan", "--gpu-profile", path), "gpu_profile")


def test_every_command_reads_its_files_up_front(tmp_path):
    """A broken profile was ignored by export and validate, and a broken model file gave a
    comparison of accelerators with one error row each and exit status 0."""
    profile = tmp_path / "p.toml"
    profile.write_text("efficiency = 5\n")
    model = tmp_path / "config.json"
    model.write_bytes(b"\xff")
    for args in (["export"], ["validate", "--gpus", "1"], ["search", "--gpus", "8"]):
        refused(run(*args, "--model", "gpt2", "--gpu-profile", profile), "gpu_profile")
    refused(run("search", "--compare-gpus", "H100-SXM,A100-80GB-SXM", "--model", model), "model")


def test_a_profile_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(b"[efficiency]\ngemm = 0.8 # \xe9t\xe9\n")
    assert "not UTF-8" in refused(run("plan", "--gpu-profile", path), "gpu_profile")


@pytest.mark.parametrize("args,field,words", [
    (["plan", "--grad-clip", "inf", "--json"], "grad_clip", "finite"),  # once printed `Infinity`
    (["export", "--to", "deepspeed", "--grad-clip", "inf"], "grad_clip", "finite"),
    (["plan", "--tokens", "nan"], "tokens", "finite"),  # once blamed on the upper bound
    (["plan", "--tokens", "1e-300"], "tokens", "greater than or equal to 1"),  # once a plan of 1e-300 tokens
    (["validate", "--device", "bogus"], "device", "auto, cpu or cuda"),  # once torch's RuntimeError
    (["search", "--min-gpus", "--tokens", "1e9", "--days", "inf"], "days", "(0, 36500]"),
    (["search", "--min-gpus", "--tokens", "1e9", "--days", "nan"], "days", "(0, 36500]"),
    (["search", "--max-tp", "-5"], "max_tp", "from 1 to"),  # once: "none of the layouts fits"
    (["search", "--export", "bogus"], "export", "megatron, deepspeed, torchtitan"),
    (["validate", "--layers", "-1"], "layers", "from 1 to 1,024"),
    (["serve", "--port", "-1"], "port", "0 to 65535"),
    (["plan", "--gpus", "abc"], "--gpus", "valid integer"),
    (["plan", "--recompute", "some"], "--recompute", "'some' is not one of"),
    (["bench", "compare", "99999999999999999999"], "run", "positive integers"),
])
def test_bad_flags_are_refused_in_one_line(args, field, words):
    assert words in refused(run(*args), field)


FLOAT_FIELDS = [name for name, f in Plan.model_fields.items() if "float" in str(f.annotation)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_float_of_a_plan_is_finite(value):
    assert len(FLOAT_FIELDS) >= 18  # grad_clip, dropout, tokens, price, the links, the data pipeline...
    for name in FLOAT_FIELDS:
        with pytest.raises(PlanError) as e:
            make_plan(**{name: value})
        assert e.value.field == name and "finite" in e.value.rule


def test_lora_targets_are_names_each_once():
    with pytest.raises(PlanError, match="lora_targets: names q more than once"):
        make_plan(finetune="lora", lora_targets="q,v,q")
    with pytest.raises(PlanError, match="lora_targets: must be comma-separated names"):
        make_plan(finetune="lora", lora_targets=5)  # from the web's JSON: once a TypeError


def test_recompute_modules_and_fp8_cache_name_each_once():
    with pytest.raises(PlanError, match="recompute_modules: name at least one"):
        make_plan(recompute="selective", recompute_modules="")  # once: selective recomputation of nothing
    with pytest.raises(PlanError, match="fp8_cache: names attn_out more than once"):
        make_plan(precision="fp8", fp8_cache="attn_out,attn_out")


def test_bench_tokens_are_bounded_before_any_allocation():
    line = refused(run("bench", "gemm", "--quick", "--device", "cpu", "--no-save", "--model", "gpt2",
                       "--tokens", "999999999999"), "tokens")
    assert "up to 1,048,576" in line


def test_an_unknown_option_is_one_line():
    assert refused(run("plan", "--gpuss"), "--gpuss").startswith("error: --gpuss: no such option; did you mean --gpus")
    assert "requires an argument" in refused(run("plan", "--gpus"), "--gpus")
    assert "No such command 'bogus'" in refused(run("bogus"), "command")
    assert "unexpected extra argument" in refused(run("plan", "extra"), "arguments")


def test_export_to_a_directory_or_nowhere_is_refused(tmp_path):
    assert "is a directory" in refused(run("export", "-o", tmp_path), "output")
    assert "does not exist" in refused(run("export", "-o", tmp_path / "no" / "x.sh"), "output")
    out = tmp_path / "ds.json"
    res = run("export", "--to", "deepspeed", "--gpus", "8", "-o", out)
    assert res.exit_code == 0 and json.loads(out.read_text())["gradient_clipping"] == 1.0
    assert not (tmp_path / "ds.json.tmp").exists()


def test_validate_without_transformers_says_what_to_install(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    line = refused(run("validate", "--model", "gpt2", "--gpus", "1", "--precision", "fp32",
                       "--framework", "torch", "--impl", "transformers"), "impl")
    assert "pip install 'trainplan[hf]'" in line


def test_bench_compare_on_a_foreign_or_corrupt_database(tmp_path):
    import sqlite3

    foreign = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE runs (x)")
    con.execute("INSERT INTO runs VALUES (1)")
    con.commit()
    con.close()
    refused(run("bench", "compare", "--db", foreign), "db")
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    refused(run("bench", "compare", "--db", corrupt), "db")
    refused(run("bench", "compare", "--db", tmp_path), "db")


def test_deepspeed_export_is_strict_json():
    """A plan's grad_clip is finite (Plan refuses inf); were one to slip past, the DeepSpeed JSON
    names it instead of writing `Infinity`."""
    from trainplan.export.deepspeed import deepspeed_config
    from trainplan.plan import resolve

    layout = resolve(make_plan(model="gpt2", gpus=8))
    layout.plan.grad_clip = float("inf")  # past validation, as no input can
    with pytest.raises(PlanError) as e:
        deepspeed_config(layout)
    assert e.value.field == "gradient_clipping"


def test_json_output_is_strict(capsys):
    """A non-finite figure is an error naming it (exit status 2), never `Infinity` in the JSON."""
    with pytest.raises(SystemExit) as exc:
        cli._echo_json({"time": {"stages": [1.0, float("inf")]}})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: time.stages[1]: is not a finite number")


# ---- names and paths ------------------------------------------------------------------------------
def test_a_file_never_shadows_a_catalog_name(tmp_path, monkeypatch, data_dir):
    """A file called gpt2 in the working directory once replaced the catalog's GPT-2 (95K
    parameters): a name is a path only with a / or a .json / .toml ending."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").write_text('{"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, '
                                   '"vocab_size": 10, "n_positions": 16}')
    assert finite_json(run("plan", "--model", "gpt2", "--gpus", "1", "--json"))["model"]["params"] == GPT2_PARAMS
    # the file, asked for by path: 10 x 8 embedding + 16 x 8 positions + one GPT-2 block of width 8
    # (12 x 8^2 + 13 x 8 = 872) + final LayerNorm 16 = 1,096 parameters
    small = finite_json(run("plan", "--model", "./gpt2", "--gpus", "1", "--json", "--seq-len", "16"))
    assert small["model"]["params"] == 10 * 8 + 16 * 8 + 12 * 64 + 13 * 8 + 16
    (tmp_path / "mine").write_text("{}")
    assert "give its path: ./mine" in refused(run("plan", "--model", "mine"), "model")
    assert looks_like_path("configs/x") and looks_like_path("x.JSON") and looks_like_path("a.toml")
    assert not looks_like_path("gpt2") and not looks_like_path("llama-3-8b")


# ---- fuzz corpus ----------------------------------------------------------------------------------
NUMBERS = st.one_of(
    st.integers(-10, 10), st.integers(-2 ** 70, 2 ** 70),
    st.sampled_from(["nan", "inf", "-inf", "1e-300", "1e308", "1e999", "-0", "0.5", "", "abc", "1_000", "0x10"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
PLAN_FLAGS = ["--gpus", "--tp", "--pp", "--dp", "--cp", "--ep", "--zero", "--mbs", "--gbs", "--seq-len",
              "--vpp", "--grad-clip", "--dropout", "--lora-rank", "--tokens", "--price", "--pue",
              "--grid-kg-per-kwh", "--gpu-mtbf-hours", "--checkpoint-gbs", "--scale-up-gbs", "--nic-gbps",
              "--data-workers", "--tokenize-rate", "--storage-gbs", "--data-bytes-per-token", "--h2d-gbs",
              "--host-gbs", "--overhead-gib", "--fragmentation", "--recompute-layers", "--gpus-per-node",
              "--dp-shard", "--qlora-bits", "--lora-dropout", "--pp-group"]
TEXT_FLAGS = st.sampled_from(["--model", "--gpu", "--stage-layers", "--lora-targets", "--recompute",
                              "--precision", "--framework", "--schedule", "--finetune", "--recompute-modules",
                              "--fp8-cache", "--bogus"])
TEXT = st.one_of(st.sampled_from(["gpt2", "llama-3-8b", "./gpt2", "x.json", "/", "", "H100-SXM", "8,4", "full",
                                  "megatron", "a\nb", "\x00", "layernorm,moe_act", "attn_out,attn_out"]),
                 st.text(max_size=12))
SEARCH_FLAGS = ["--days", "--max-tp", "--top"]


@st.composite
def cli_args(draw):
    command = draw(st.sampled_from(["plan", "plan", "plan", "search", "export"]))
    args = [command, "--model", "gpt2", "--gpus", "1"]
    numeric = PLAN_FLAGS + (SEARCH_FLAGS if command == "search" else [])
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            args += [draw(st.sampled_from(numeric)), str(draw(NUMBERS))]
        else:
            args += [draw(TEXT_FLAGS), draw(TEXT)]
    if command == "search" and "--min-gpus" not in args and draw(st.booleans()):
        args += ["--min-gpus", "--tokens", "1e9"]
    return args + (["--json"] if command != "export" else [])


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(cli_args())
def test_fuzz_cli_flags(args):
    check(run(*args))


def _bad_value():
    return st.one_of(st.none(), st.booleans(), st.integers(-5, 10), st.integers(-2 ** 64, 2 ** 64),
                     st.sampled_from([0, 1, 2, 7, 64, 4096, 10 ** 6, 10 ** 9, 10 ** 15]),
                     st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.5, 4096.0, 1e300]),
                     st.text(max_size=6), st.lists(st.integers(0, 3), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def hf_mutations(draw):
    name = draw(st.sampled_from(HF_CASES))
    keys = sorted(set(hf.FIELD_RANGES) | set(hf.FLAGS) | set(hf.STRINGS) | {"rope_theta", "mlp_only_layers"})
    changes = draw(st.dictionaries(st.sampled_from(keys), _bad_value(), min_size=1, max_size=3))
    drop = draw(st.lists(st.sampled_from(keys), max_size=2))
    return name, changes, drop


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(hf_mutations(), st.sampled_from([["--gpus", "1"], ["--gpus", "8", "--tp", "2"], ["--gpus", "16", "--pp", "2"]]))
def test_fuzz_hf_configs(tmp_path_factory, data_dir, mutation, layout):
    name, changes, drop = mutation
    cfg = {k: v for k, v in {**hf_config(name, data_dir), **changes}.items() if k not in drop}
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(cfg))
    check(run("plan", "--model", path, "--seq-len", "1024", "--json", *layout))


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


MEASURED = st.floats(0.05, 1.0)
BAD_VALUE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, 0, 2]),
                      st.integers(-3, 3), st.booleans(), st.text(max_size=4), st.lists(st.floats(-1, 2), max_size=3))
PROFILE_VALUE = st.one_of(MEASURED, MEASURED, MEASURED, MEASURED, BAD_VALUE)  # mostly a measurement
GOOD_X = st.lists(st.integers(1, 1 << 16), min_size=2, max_size=4, unique=True).map(sorted)
CURVE_X = st.one_of(GOOD_X, GOOD_X, GOOD_X, st.lists(st.integers(-2, 1 << 31), max_size=4))


@st.composite
def profiles(draw):
    """A profile TOML: half of them a measurement (each value within range), half with bad values."""
    good = draw(st.booleans())
    value, xs_of = (MEASURED, GOOD_X) if good else (PROFILE_VALUE, CURVE_X)
    lines = []
    if draw(st.integers(0, 3)) == 0:
        gpus = ["H100-SXM", "H200-SXM"] + ([] if good else ["A100-80GB-SXM", "nope", 3])
        lines.append(f"gpu = {_toml(draw(st.sampled_from(gpus)))}")
    if not good and draw(st.integers(0, 9)) == 0:
        lines.append(f"efficiency = {_toml(draw(PROFILE_VALUE))}")
    else:
        lines.append("[efficiency]")
        for key in draw(st.lists(st.sampled_from(["gemm", "flash", "hbm", "nvlink", "nic"]), min_size=1,
                                 max_size=4, unique=True)) + ([] if good else ["other"]):
            lines.append(f"{key} = {_toml(draw(value))}")
    for table, x in (("gemm_curve", "n"), ("flash_curve", "seq"), ("gemm_k_curve", "k")):
        if draw(st.integers(0, 3)) == 0:
            xs = draw(xs_of)
            frac = draw(st.lists(value, min_size=len(xs), max_size=len(xs)))
            lines += [f"[{table}]", f"{x} = {_toml(xs)}", f"fraction = {_toml(frac)}"]
    if draw(st.integers(0, 3)) == 0:
        shape = {"mainloop": value, "k0": st.floats(0, 1000) if good else st.one_of(st.floats(0, 1000), value),
                 "overhead_us": st.floats(0, 100) if good else st.one_of(st.floats(0, 100), value)}
        lines += ["[gemm_shape]"] + [f"{k} = {_toml(draw(v))}" for k, v in shape.items()]
    return "\n".join(lines) + "\n"


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(profiles())
def test_fuzz_profiles(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("profile") / "p.toml"
    path.write_text(text)
    check(run("plan", "--model", "gpt2", "--gpus", "8", "--gpu-profile", path, "--json"))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)), st.sampled_from(
    ["config.json", "spec.toml", "profile.toml"]))
def test_fuzz_raw_file_contents(tmp_path_factory, content, kind):
    path = tmp_path_factory.mktemp("raw") / kind
    path.write_bytes(content)
    flag = "--gpu-profile" if kind == "profile.toml" else "--model"
    check(run("plan", flag, path, "--json"))
