"""Regenerate the generated pages under docs/ from the code, and the outputs of docs/tutorial.ipynb from a run.

    python scripts/make_docs.py           write the pages that are out of date
    python scripts/make_docs.py --check   write nothing; exit 1 if a page is out of date
"""

import argparse
import sys

from scratch_models_docs.hook_names import write_docs
from scratch_models_docs.tutorial import write_tutorial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report pages that are out of date")
    args = parser.parse_args()
    stale = write_docs(check=args.check) + write_tutorial(check=args.check)
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
