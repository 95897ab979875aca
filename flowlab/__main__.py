"""The ``flowlab`` command. ``flowlab info`` says what this installation can do."""
from __future__ import annotations

import argparse
import platform
import sys


def _info(args) -> int:
    import numpy as np

    import flowlab as fl
    from flowlab.core.backends import cupy_backend

    blas = fl.config.blas_info()
    print(f"flowlab      {fl.__version__}")
    print(f"python       {platform.python_implementation()} {platform.python_version()}")
    print(f"numpy        {np.__version__}")
    for lib in blas:
        print(f"BLAS         {lib.get('internal_api')} {lib.get('version')}, {lib['num_threads']} thread(s)")
    gpu = "available" if cupy_backend.available() else f"not available: {cupy_backend.why_unavailable()}"
    print(f"GPU (CuPy)   {gpu}")
    print(f"ops          {len(fl.core.list_ops())} in the op table")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="flowlab", description="Learn and try out distributed deep learning.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("info", help="what this installation has: versions, BLAS threads, GPU").set_defaults(run=_info)
    args = parser.parse_args(argv)
    if args.version:
        import flowlab
        print(flowlab.__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
