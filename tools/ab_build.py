"""Artifacts of another commit for a kernel A/B (`bench.py --ab BASE NEW`), built on the CPU.

    python tools/ab_build.py REV DEST --patterns clear clear_text [--runtime] [--this-suite]
    python tools/ab_build.py REV DEST --samples [NAME ...] [--compare DIR]

exports the tree at REV (git archive) to a scratch folder and runs that tree's own
`benchmarks/bench.py --compile DEST --patterns ...` with its `cmc` first on the path; with
--runtime, DEST then holds only what the runtime loads (`--runtime-copy`, small enough to
carry). --samples compiles that tree's samples (all, or these names) for --arch instead
(`cmc compile ... --no-cache`), and --compare DIR then compares every cubin with the same
path under DIR (a build of the working tree, say): a change meant to leave the shipped
kernels alone is checked against its base's own build. The editable install's import finder
would otherwise resolve `cmc` (and its templates) to this checkout whatever PYTHONPATH says,
which is how an earlier A/B measured one build against itself, and how a byte-identity check
once compared a change with itself (kernel notes, "After run 51"); the child process is
checked for that before it compiles. --this-suite builds this checkout's benchmark masks
(benchmarks/masks.py and benchmarks/generality/*.mask copied over the tree's) with REV's
compiler: a mask added to the suite with the change it measures has a base to A/B against.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if "editable" not in getattr(f, "__name__", type(f).__name__).lower()]
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/benchmarks"]
import importlib.util
import cmc
if not cmc.__file__.startswith(tree):
    raise SystemExit(f"cmc resolves to {cmc.__file__}, not the tree at {tree}")
spec = importlib.util.find_spec("cmc.templates")  # None: cmc reads the tree's templates/
where = list(spec.submodule_search_locations or []) if spec else []
if spec is not None and not all(w.startswith(tree) for w in where):
    raise SystemExit(f"cmc.templates resolves to {where}, not the tree at {tree}")
if sys.argv[2:3] == ["cmc"]:
    from cmc.cli import cli
    sys.argv = ["cmc", *sys.argv[3:]]
    cli()
else:
    import bench
    sys.argv = ["bench.py", *sys.argv[2:]]
    bench.main()
"""


def compare(built: Path, other: Path) -> list[str]:
    """The cubins under built that differ from, or are missing under, other (by relative
    path; other may hold more, e.g. every sample where built has a few)."""
    bad = []
    for p in sorted(built.rglob("*.cubin")):
        q = other / p.relative_to(built)
        if not q.is_file():
            bad.append(f"{p.relative_to(built)}: not under {other}")
        elif p.read_bytes() != q.read_bytes():
            bad.append(f"{p.relative_to(built)}: differs")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit to build (any git revision)")
    ap.add_argument("dest", type=Path, help="artifact folder to write")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--patterns", nargs="+", help="bench.py case names")
    what.add_argument("--samples", nargs="*", metavar="NAME",
                      help="the tree's samples (all when no name is given), by cmc compile")
    ap.add_argument("--runtime", action="store_true",
                    help="keep only what the runtime loads (bench.py --runtime-copy)")
    ap.add_argument("--this-suite", action="store_true",
                    help="with --patterns: this checkout's benchmarks/masks.py and generality "
                         "masks, built by REV's compiler")
    ap.add_argument("--arch", default="sm_90a", help="with --samples (default sm_90a)")
    ap.add_argument("--compare", type=Path, metavar="DIR",
                    help="with --samples: compare every cubin with the same path under DIR "
                         "(exit 1 on any difference)")
    args = ap.parse_args()
    if args.samples is None and args.compare:
        ap.error("--compare goes with --samples")
    if args.samples is not None and args.this_suite:
        ap.error("--this-suite goes with --patterns")
    if args.samples is not None and args.runtime:
        ap.error("--runtime goes with --patterns (--samples keeps every artifact file)")
    dest = args.dest.resolve()
    with tempfile.TemporaryDirectory(prefix="cmc-ab-") as d:
        tree = Path(d) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        if args.this_suite:
            bench = ROOT / "benchmarks"
            for src in [bench / "masks.py", *sorted((bench / "generality").glob("*.mask"))]:
                dst = tree / src.relative_to(ROOT)
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
        if args.samples is not None:
            masks = ([str(tree / "samples" / f"{n}.mask") for n in args.samples] if args.samples
                     else sorted(str(p) for p in (tree / "samples").glob("*.mask")))
            subprocess.run([sys.executable, "-c", CHILD, str(tree), "cmc", "compile", *masks, "-o",
                            str(dest), "--arch", args.arch, "--no-cache", "-j", "2"], check=True)
            n = len(list(dest.rglob("*.cubin")))
            if args.compare:
                bad = compare(dest, args.compare.resolve())
                print("\n".join(bad) if bad else f"{args.rev}: {n} cubins, all equal to "
                      f"{args.compare}'s")
                raise SystemExit(1 if bad else 0)
            print(f"{args.rev}: {n} cubins of the samples in {dest}")
            return
        built = Path(d) / "built" if args.runtime else dest
        subprocess.run([sys.executable, "-c", CHILD, str(tree), "--compile", str(built),
                        "--patterns", *args.patterns], check=True)
        if args.runtime:
            subprocess.run([sys.executable, "-c", CHILD, str(tree), "--runtime-copy",
                            str(built), str(dest)], check=True)
    print(f"{args.rev}: artifacts of {' '.join(args.patterns)} in {dest}")


if __name__ == "__main__":
    main()
