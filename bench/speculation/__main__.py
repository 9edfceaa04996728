"""``python -m bench.speculation SUBCOMMAND``: see the package's docstring."""

from __future__ import annotations

import argparse

import bench.speculation
from bench.speculation import host, numerics, servers, trace


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.speculation", description=bench.speculation.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(required=True, metavar="SUBCOMMAND")
    for module in (servers, host, numerics, trace):
        module.add(sub)
    a = ap.parse_args()
    a.run(a)


if __name__ == "__main__":
    main()
