"""Package stage: the artifact folder, its manifest (against the schema), reproducible bytes,
safety of where it writes, and `--check` staleness."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import jsonschema
import pytest

from cmc.artifacts import SCHEMA_VERSION, BuiltKernels
from cmc.build import build
from cmc.driver import check_stale
from cmc.errors import ArtifactError
from cmc.package import package, render_files

from .handmade import LAYOUT, MASK, TABLE, VARIANTS, emitted

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schema" / "manifest.schema.json").read_text())
EXPECTED = {
    "manifest.json",
    "demo.cu",
    "demo.h",
    "demo.sm_80.bf16_d64.cubin",
    "demo.sm_90a.bf16_d64.cubin",
    "demo.sm_80.fp16_d128.cubin",
    "demo.sm_90a.fp16_d128.cubin",
    "demo.sm_100a.fp16_d128.cubin",
}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CMC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def built() -> BuiltKernels:
    return build(emitted(), cache=False, jobs=2)


def validate(manifest: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(manifest)


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_writes_the_artifact_folder(built, tmp_path):
    dest = package(built, tmp_path / "out", "masks/demo.mask")
    assert dest == (tmp_path / "out" / "demo").resolve()
    assert {p.name for p in dest.iterdir()} == EXPECTED
    m = json.loads((dest / "manifest.json").read_text())
    validate(m)
    assert m["mask"] == {
        "name": "demo",
        "doc": "hand-made test mask",
        "file": "demo.mask",  # base name only: reproducible across directories
        "source": MASK.source,
        "sha256": hashlib.sha256(MASK.source.encode()).hexdigest(),
    }
    assert m["constants"] == {"W": 4, "A_FIRST": 1}
    assert m["params"] == [
        {"name": "n_targets", "kind": "batch", "range": {"lo": [0, -2**31], "hi": [0, 2**31 - 1]}},
        {"name": "docs", "kind": "segments"},
        {"name": "window", "kind": "scalar", "range": {"lo": [0, -2**31], "hi": [0, 2**31 - 1]}},
    ]
    d = m["descriptor"]
    assert (d["struct"], d["size"], d["align"]) == ("cmc_demo_desc", LAYOUT.size, 8)
    assert [(f["name"], f["offset"]) for f in d["fields"]] == [
        (f.name, f.offset) for f in LAYOUT.fields
    ]
    assert (dest / "demo.cu").read_text() == built.source.text
    assert m["source"]["sha256"] == hashlib.sha256((dest / "demo.cu").read_bytes()).hexdigest()
    assert m["header"]["sha256"] == hashlib.sha256((dest / "demo.h").read_bytes()).hexdigest()
    for k, c in zip(m["kernels"], built.cubins, strict=True):
        assert (dest / k["file"]).read_bytes() == c.data
        assert k["sha256"] == c.sha256
        assert (k["registers"], k["shared_static"], k["local_bytes"]) == (
            c.resources.registers,
            c.resources.shared_static,
            c.resources.local_bytes,
        )
        assert k["options"] == list(c.options)
        assert k["block"] == [k["threads"], 1, 1]
        if k["kernel"] == "sm90":
            units = f"ceil_div(ceil_div(max_len, {k['block_m']}), 2) * heads_q * batch"
            assert k["grid"] == [f"min({units}, max_ctas)", "1", "1"]
        else:
            assert k["grid"] == [f"ceil_div(max_len, {k['block_m']})", "heads_q", "batch"]


def test_interval_table_is_readable(built):
    m = json.loads(render_files(built, "demo.mask")["manifest.json"])
    t = m["interval_table"]
    assert t["exact"] is False and t["max_intervals_per_row"] == 5
    assert [(x["guard"], x["lo"], x["hi"]) for x in t["terms"]] == [
        ("true", "0", "q + 1"),
        ("q >= len - n_targets", "max(0, q - window)", "len - n_targets"),
        ("true", "q + off[t]", "q + off[t] + 2"),
    ]
    assert t["terms"][1]["residual"] == "k % 2 == 1"
    assert t["terms"][2]["family"] == {"index": "t", "start": -1, "stop": 2,
                                       "tables": {"off": [-3, 0, 3]}}
    assert t["residuals"] == [{"reason": "k % 2 depends on k alone", "where": "k % 2 == 1"}]


def test_json_is_stable_text(built):
    text = render_files(built, "demo.mask")["manifest.json"].decode()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True,
                              ensure_ascii=False) + "\n"
    assert "build_seconds" not in text


def test_builds_are_byte_identical_across_directories(built, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = package(built, tmp_path / "one", "demo.mask")
    # a second, independent build (through the cache this time) from another cwd
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = build(emitted(), jobs=1)
    b = package(again, tmp_path / "two" / "deeper", str(tmp_path / "x" / "demo.mask"))
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        data = (a / n).read_bytes()
        assert data == (b / n).read_bytes(), n
        assert str(tmp_path).encode() not in data
        assert str(ROOT).encode() not in data


def test_unsafe_mask_names_are_refused(built, tmp_path):
    for bad in ("../evil", "a/b", "", "x" * 100, "has space"):
        table = dataclasses.replace(TABLE, mask=dataclasses.replace(MASK, name=bad))
        evil = dataclasses.replace(built, source=dataclasses.replace(built.source, table=table))
        with pytest.raises(ArtifactError):
            package(evil, tmp_path / "out", "demo.mask")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_refuses_a_folder_that_leads_outside_out(built, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "demo").symlink_to(outside)
    with pytest.raises(ArtifactError, match="not a folder|outside"):
        package(built, out, "demo.mask")
    assert list(outside.iterdir()) == []
    (out / "demo").unlink()
    (out / "demo").write_text("a file")
    with pytest.raises(ArtifactError, match="not a folder"):
        package(built, out, "demo.mask")


def test_links_inside_the_folder_are_replaced_not_followed(built, tmp_path):
    dest = package(built, tmp_path / "out", "demo.mask")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (dest / "demo.h").unlink()
    (dest / "demo.h").symlink_to(victim)
    package(built, tmp_path / "out", "demo.mask")
    assert victim.read_text() == "keep me"
    assert not (dest / "demo.h").is_symlink()


def test_source_file_must_match_the_mask(built, tmp_path):
    wrong = dataclasses.replace(built, source=dataclasses.replace(built.source, filename="x.cu"))
    with pytest.raises(ArtifactError, match="should be demo.cu"):
        package(wrong, tmp_path, "demo.mask")


def test_repackaging_removes_what_the_build_no_longer_makes(built, tmp_path):
    dest = package(built, tmp_path, "demo.mask")
    (dest / "notes.txt").write_text("mine")
    fewer = BuiltKernels(built.source, tuple(c for c in built.cubins if c.arch == "sm_90a"))
    package(fewer, tmp_path, "demo.mask")
    assert {p.name for p in dest.iterdir()} == {
        "manifest.json", "demo.cu", "demo.h", "notes.txt",
        "demo.sm_90a.bf16_d64.cubin", "demo.sm_90a.fp16_d128.cubin",
    }
    m = json.loads((dest / "manifest.json").read_text())
    validate(m)
    assert [k["arch"] for k in m["kernels"]] == ["sm_90a", "sm_90a"]
    assert "SM_80" not in (dest / "demo.h").read_text()


def test_check_stale(built, tmp_path):
    out = tmp_path / "out"
    calls = []

    def rebuild(path, options):
        calls.append((path, options))
        return built

    assert len(check_stale(["demo.mask"], out, "opts", rebuild)) == len(EXPECTED)  # missing
    dest = package(built, out, "demo.mask")
    assert check_stale(["demo.mask"], out, "opts", rebuild) == []
    assert calls[-1] == (Path("demo.mask"), "opts")
    cubin = dest / "demo.sm_90a.bf16_d64.cubin"
    data = bytearray(cubin.read_bytes())
    data[100] ^= 1
    cubin.write_bytes(bytes(data))
    (dest / "demo.h").unlink()
    (dest / "demo.sm_86.bf16_d64.cubin").write_bytes(b"left over")
    (dest / "README").write_text("not ours")
    stale = check_stale(["demo.mask"], out, "opts", rebuild)
    assert sorted(Path(s).name for s in stale) == [
        "demo.h", "demo.sm_86.bf16_d64.cubin", "demo.sm_90a.bf16_d64.cubin",
    ]
    assert all(os.path.isabs(s) for s in stale)


def test_check_stale_default_rebuild_uses_the_pipeline(monkeypatch, tmp_path):
    """The default rebuild goes through the driver's stages (front, tile, emit, build) with the
    options."""
    import cmc.build
    import cmc.driver
    import cmc.emit
    from cmc.driver import Options

    seen = {}
    real_run = cmc.driver._RUN

    def lower(p, opts, out_dir):
        seen["front"] = (p.path, dict(opts.defines))
        return dataclasses.replace(p, table=TABLE)

    monkeypatch.setattr(cmc.driver, "_RUN", {**real_run, "parse": lambda p, o, d: p,
                                             "check": lambda p, o, d: p, "lower": lower})
    monkeypatch.setattr(cmc.emit, "emit", lambda t, **kw: emitted())

    def fake_build(source, archs, jobs, cache, reg_split):
        seen["build"] = (archs, jobs, cache, reg_split)
        return build(source, archs=["sm_80"], cache=False)

    monkeypatch.setattr(cmc.build, "build", fake_build)
    opts = Options(archs=("sm_80",), defines=(("W", 3),), jobs=2, backward=False)
    stale = check_stale([tmp_path / "demo.mask"], tmp_path / "out", opts)
    assert seen["front"] == (tmp_path / "demo.mask", {"W": 3})
    assert seen["build"] == (("sm_80",), 2, True, "auto")
    assert len(stale) == 5  # nothing written yet: manifest, .cu, .h, two sm_80 cubins


def test_schema_rejects_what_it_should(built):
    m = json.loads(render_files(built, "demo.mask")["manifest.json"])
    validate(m)
    for mutate in (
        lambda x: x.pop("kernels"),
        lambda x: x["kernels"][0].update(arch="sm_75"),
        lambda x: x["kernels"][0].update(sha256="abc"),
        lambda x: x["kernels"][0].update(file="../x.cubin"),
        lambda x: x["mask"].update(name="not an identifier"),
        lambda x: x["descriptor"]["fields"][0].update(ctype="double"),
        lambda x: x.update(extra=1),
        lambda x: x.update(schema_version=SCHEMA_VERSION + 1),
        lambda x: x["kernels"][0].update(tensor_maps=[{"tensor": "o", "box": [64, 1, 128],
                                                       "swizzle": "128B"}]),
        lambda x: x["kernels"][0].pop("tensor_maps"),
    ):
        bad = json.loads(json.dumps(m))
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)


def test_variant_constants_reach_the_manifest(built):
    m = json.loads(render_files(built, "demo.mask")["manifest.json"])
    by_file = {k["file"]: k for k in m["kernels"]}
    for v in VARIANTS:
        for a in v.archs:
            k = by_file[f"demo.{a}.{v.dtype}_d{v.head_dim}.cubin"]
            assert (k["symbol"], k["threads"], k["block_m"], k["block_n"], k["dynamic_smem"],
                    k["kernel"], k["dtype"], k["head_dim"]) == (
                v.symbol, v.threads, v.block_m, v.block_n, v.smem_bytes, v.kernel, v.dtype,
                v.head_dim)


# ------------------------------------------------------------------------------ backward


@pytest.fixture(scope="module")
def bwd_built() -> BuiltKernels:
    from .handmade import BWD_VARIANTS

    return build(emitted(VARIANTS + BWD_VARIANTS), archs=["sm_80"], cache=False, jobs=2)


def test_backward_manifest_section_and_entries(bwd_built):
    from cmc.render import table_dict

    m = json.loads(render_files(bwd_built, "demo.mask")["manifest.json"])
    validate(m)
    b = m["backward"]
    assert b["args"]["struct"] == "cmc_bwd_args" and b["args"]["size"] == 120
    assert [f["name"] for f in b["args"]["fields"]][-2:] == ["total_tokens", "flags"]
    assert b["sequence"] == {"atomic": ["pre", "kv", "post"], "deterministic": ["pre", "kv", "dq"]}
    assert b["workspace"]["dq_accum"] == {"dtype": "float32", "shape": ["T", "heads_q", "head_dim"],
                                          "bytes": "4 * T * heads_q * head_dim", "layout": "token"}
    assert b["workspace"]["dsum"] == {"dtype": "float32", "shape": ["2", "heads_q", "T"], "bytes": "8 * T * heads_q"}
    assert b["transposed_table"] == table_dict(bwd_built.source.transposed)
    roles = {k["role"]: k for k in m["kernels"]}
    assert set(roles) == {"fwd", "pre", "kv", "dq", "post"}
    for r in ("pre", "kv", "dq", "post"):
        k = roles[r]
        assert (k["pass"], k["params"], k["kernel"]) == ("backward", ["desc", "bwd_args"],
                                                          f"bwd_{r}")
        assert k["file"] == f"demo.sm_80.bwd_{r}_bf16_d64.cubin"
    assert roles["kv"]["grid"] == ["ceil_div(max_len, 64)", "heads_kv", "batch"]
    assert (roles["fwd"]["pass"], roles["fwd"]["params"]) == ("forward", ["desc"])


def test_forward_only_manifest_has_null_backward(built):
    m = json.loads(render_files(built, "demo.mask")["manifest.json"])
    validate(m)
    assert m["backward"] is None and {k["pass"] for k in m["kernels"]} == {"forward"}


def test_schema_rejects_a_bad_backward(bwd_built):
    m = json.loads(render_files(bwd_built, "demo.mask")["manifest.json"])
    for bad in (lambda x: x["backward"].pop("workspace"),
                lambda x: x["backward"]["sequence"]["atomic"].append("fwd2"),
                lambda x: x["kernels"][0].update(params=["desc", "bwd"]),
                lambda x: x["kernels"][0].pop("role")):
        mm = json.loads(json.dumps(m))
        bad(mm)
        with pytest.raises(jsonschema.ValidationError):
            validate(mm)
