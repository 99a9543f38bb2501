"""Write a tiny random checkpoint (weights, config.json, byte-level tokenizer) to OUT_DIR.

    python scripts/make_tiny_model.py /tmp/tiny [--family qwen3|qwen2|llama] [--layers 2] [--seed 0]
    sparrow generate --model /tmp/tiny --prompt "hello" --max-new-tokens 16 --greedy

The weights are random (sparrow.model.random_checkpoint.make_random_checkpoint), so the
text is gibberish: the checkpoint exists to run the engine, the CLI and the tests anywhere.
"""

from __future__ import annotations

import argparse
import sys

from sparrow.model.config import FAMILIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--family", choices=FAMILIES, default="qwen3")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from sparrow.errors import SparrowError
    from sparrow.model.random_checkpoint import make_random_checkpoint

    try:
        out = make_random_checkpoint(
            args.out_dir, args.family, num_layers=args.layers, seed=args.seed
        )
    except SparrowError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
