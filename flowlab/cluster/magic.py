"""``%%px``: run a notebook cell on every worker of a cluster, as ipyparallel's ``%%px`` does.

    %load_ext flowlab                  # or: %load_ext flowlab.cluster.magic
    cluster = fl.cluster.LocalCluster(workers=2)

    %%px
    print("I am worker", rank, "of", world_size)    # fl, np, rank, world_size, size are at hand

Each worker runs the cell in a namespace of its own that lives as long as the worker (names
defined by one ``%%px`` cell are there for the next). It starts with ``fl`` (flowlab), ``np``
(numpy), ``rank`` (this worker's index), and ``world_size`` and ``size`` (how many workers), so
a cell can use them without importing anything. Each worker sends back what it printed; the output
appears under the cell, rank by rank, each part headed ``[worker N]``. If the cell's last line
is an expression, its value is shown too. If the cell raised on any worker, every worker's output
is still shown, then the error is raised here naming the workers where it failed.

The cluster: ``--cluster NAME`` (a LocalCluster held by the notebook variable NAME), ``-t TARGET``
(the cluster with that target), else the most recently started cluster that is still open.
Importing this module does not import IPython; :func:`load_ipython_extension` does.
"""
from __future__ import annotations

import ast
import io
import shlex
import sys
import traceback

__all__ = ["load_ipython_extension", "px", "run_cell", "px_namespace", "PxError"]

_namespace: dict = {"__name__": "__px__"}    # on a worker: what its %%px cells defined


def px_namespace() -> dict:
    """On a worker: the names its ``%%px`` cells defined (for a function sent with ``cluster.run``)."""
    if not _namespace.get("__px_ready__"):
        _prepare(_namespace)
    return _namespace


def _prepare(ns) -> None:
    """What a ``%%px`` cell finds without importing: ``fl``, ``np``, ``rank``, ``world_size``, ``size``."""
    import numpy

    import flowlab
    from .server import rank, world_size
    n = world_size()
    ns.update(fl=flowlab, np=numpy, rank=rank(), world_size=n, size=n, __px_ready__=True)


class PxError(RuntimeError):
    """A ``%%px`` cell raised on one or more workers."""


def run_cell(source: str) -> dict:
    """Run a cell's source here (on a worker): its printed output, and its error if it raised."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    error = None
    try:
        namespace = px_namespace()
        tree = ast.parse(source, filename="<%%px cell>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<%%px cell>", "exec"), namespace)   # noqa: S102 - the user's own cell
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<%%px cell>", "eval"), namespace)  # noqa: S307
            if value is not None:
                print(repr(value))
    except BaseException as e:   # noqa: B036 - shown under the worker's label, raised on the client
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None   # from the cell's frame on
        error = "".join(traceback.format_exception(type(e), e, tb)).rstrip()
        error_line = f"{type(e).__name__}: {e}"
    finally:
        sys.stdout, sys.stderr = old
    result = {"stdout": out.getvalue(), "stderr": err.getvalue()}
    if error is not None:
        result["error"], result["error_line"] = error, error_line
    return result


def _find_cluster(options, user_ns):
    from .local import cluster_for_target, latest_cluster

    if options.get("cluster"):
        name = options["cluster"]
        cluster = user_ns.get(name)
        if cluster is None or not hasattr(cluster, "run"):
            raise PxError(f"%%px --cluster {name}: no LocalCluster is held by a variable named {name!r}")
    elif options.get("target"):
        cluster = cluster_for_target(options["target"])
        if cluster is None:
            raise PxError(f"%%px -t {options['target']}: no open LocalCluster of this kernel has that target")
    else:
        cluster = latest_cluster()
        if cluster is None:
            raise PxError("%%px needs a running cluster: start one with cluster = fl.cluster.LocalCluster(workers=2)")
    if cluster.closed:
        raise PxError("%%px: that cluster is closed; start a new one")
    return cluster


def _options(line: str) -> dict:
    words, options = shlex.split(line), {}
    while words:
        word = words.pop(0)
        if word in ("--cluster", "-c", "-t", "--target") and words:
            options["cluster" if word in ("--cluster", "-c") else "target"] = words.pop(0)
        else:
            raise PxError(f"%%px: unknown option {word!r} (use --cluster NAME or -t TARGET)")
    return options


def px(line: str, cell: str, user_ns=None, out=None):
    """The ``%%px`` cell magic: run ``cell`` on every worker, print each rank's output under a label."""
    cluster = _find_cluster(_options(line), user_ns or {})
    results = cluster.run(run_cell, cell)
    out = out or sys.stdout
    failed = []
    for rank, r in enumerate(results):
        print(f"[worker {rank}]", file=out)
        if r["stdout"]:
            out.write(r["stdout"] if r["stdout"].endswith("\n") else r["stdout"] + "\n")
        if r["stderr"]:
            sys.stderr.write(f"[worker {rank}] " + r["stderr"].rstrip("\n").replace("\n", f"\n[worker {rank}] ") + "\n")
        if "error" in r:
            out.write(r["error"] + "\n")
            failed.append(f"[worker {rank}] {r['error_line']}")
    out.flush()
    if failed:
        raise PxError("the cell raised on " + ("; ".join(failed)))


def load_ipython_extension(ipython) -> None:
    """Register ``%%px`` with IPython (``%load_ext flowlab`` or ``%load_ext flowlab.cluster.magic``)."""
    def _px(line, cell):
        try:
            px(line, cell, ipython.user_ns)
        except PxError as e:
            from IPython.core.error import UsageError
            if str(e).startswith("%%px"):
                raise UsageError(str(e)) from None
            raise
    _px.__doc__ = px.__doc__
    ipython.register_magic_function(_px, magic_kind="cell", magic_name="px")
