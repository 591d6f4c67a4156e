"""Artifacts of another commit for a kernel A/B (`bench.py --ab BASE NEW`), built on the CPU.

    python tools/ab_build.py REV DEST --patterns clear clear_text [--runtime]

exports the tree at REV (git archive) to a scratch folder and runs that tree's own
`benchmarks/bench.py --compile DEST --patterns ...` with its `cmc` first on the path; with
--runtime, DEST then holds only what the runtime loads (`--runtime-copy`, small enough to
carry). The editable install's import finder would otherwise resolve `cmc` (and its
templates) to this checkout whatever PYTHONPATH says, which is how an earlier A/B measured
one build against itself; the child process is checked for that before it compiles.
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
import bench
sys.argv = ["bench.py", *sys.argv[2:]]
bench.main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit to build (any git revision)")
    ap.add_argument("dest", type=Path, help="artifact folder to write")
    ap.add_argument("--patterns", nargs="+", required=True, help="bench.py case names")
    ap.add_argument("--runtime", action="store_true",
                    help="keep only what the runtime loads (bench.py --runtime-copy)")
    args = ap.parse_args()
    dest = args.dest.resolve()
    with tempfile.TemporaryDirectory(prefix="cmc-ab-") as d:
        tree = Path(d) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        built = Path(d) / "built" if args.runtime else dest
        subprocess.run([sys.executable, "-c", CHILD, str(tree), "--compile", str(built),
                        "--patterns", *args.patterns], check=True)
        if args.runtime:
            subprocess.run([sys.executable, "-c", CHILD, str(tree), "--runtime-copy",
                            str(built), str(dest)], check=True)
    print(f"{args.rev}: artifacts of {' '.join(args.patterns)} in {dest}")


if __name__ == "__main__":
    main()
