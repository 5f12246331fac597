"""Record what the docs' decoder example writes (examples/decoder_text.py at its recipe): each
prompt and its continuation, with the machine and the time the run took, for the Examples
page (docs/hooks/generated.py renders docs/figures/decoder_text.json).

    python benchmarks/decoder_text.py --json docs/figures/decoder_text.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
from decoder_text import write  # noqa: E402  (examples/decoder_text.py)
from harness import machine, write_json  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--documents", type=int, default=3000)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        written = write(out, args.steps, args.documents, args.new_tokens)
    seconds = time.perf_counter() - start
    for prompt, said in written:
        print(f"{prompt}|{said}")
    if args.json:
        write_json(args.json, {"machine": machine(), "args": {
            "steps": args.steps, "documents": args.documents, "new_tokens": args.new_tokens},
            "seconds": seconds, "written": [list(w) for w in written]})


if __name__ == "__main__":
    main()
