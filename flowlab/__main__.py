"""The ``flowlab`` command. ``flowlab info`` says what this installation can do; ``flowlab worker``
runs one task of a cluster from a shell; ``flowlab run -np N script.py`` runs a script on N local
ranks (as ``horovodrun`` does); ``flowlab grade SUBMISSIONS/`` grades a folder of submissions and
``flowlab exercises release`` writes the student version of an exercises folder."""
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


def _worker(args) -> int:
    """One task of a cluster, in this process, until interrupted or sent ``shutdown``."""
    import json
    import os

    from flowlab.cluster.server import key_from_env, read_key_file
    from flowlab.cluster.spec import ClusterSpec, config_from_env
    from flowlab.cluster.worker import serve_task

    job, index = args.job, args.task
    if args.cluster:
        with open(args.cluster) as f:
            raw = json.load(f)
        spec = ClusterSpec(raw.get("cluster", raw) if isinstance(raw, dict) else raw)
    else:
        try:
            cfg = config_from_env()
        except ValueError as e:
            print(f"flowlab worker: {e}", file=sys.stderr)
            return 2
        if cfg is None:
            print("flowlab worker: give --cluster SPEC.json, or set FLOWLAB_CONFIG "
                  '(e.g. {"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}})',
                  file=sys.stderr)
            return 2
        spec = cfg.spec
        job = job or cfg.job
        index = cfg.index if index is None else index
    job = job or "worker"
    index = 0 if index is None else index
    try:
        spec.task_address(job, index)
    except ValueError as e:
        print(f"flowlab worker: {e}", file=sys.stderr)
        return 2
    key = read_key_file(args.key_file) if args.key_file else key_from_env()
    if key is None or len(key) < 16:
        print("flowlab worker: no cluster key. Every task and client of a cluster shares one secret key "
              "of at least 16 bytes: set FLOWLAB_CLUSTER_KEY to its hex form, or FLOWLAB_CLUSTER_KEY_FILE / "
              "--key-file to a file holding it (make one with: python -c \"import secrets; "
              "print(secrets.token_hex(32))\" > cluster.key; chmod 600 cluster.key)", file=sys.stderr)
        return 2
    if args.bind and args.bind not in ("127.0.0.1", "localhost", "::1"):
        print(f"flowlab worker: WARNING: listening on {args.bind}, so other machines can reach this task; "
              f"only the cluster key protects it (keep it secret, and use a trusted network)",
              file=sys.stderr, flush=True)
    os.environ.pop("FLOWLAB_CLUSTER_KEY", None)   # user code run by this task need not see it
    import warnings
    warnings.filterwarnings("ignore", message=".*reachable from other machines.*")
    return serve_task(spec, job, index, key, bind=args.bind)


def _run(args) -> int:
    """``script`` on ``args.np`` local ranks, their output prefixed by rank."""
    from flowlab.cluster.collectives.launch import launch

    if args.np < 1:
        print(f"flowlab run: -np must be at least 1 (got {args.np})", file=sys.stderr)
        return 2
    return launch(args.np, args.script, args.args)


def _grade(args) -> int:
    """Grade every submission in ``args.submissions``; the summary table on stdout."""
    from flowlab.grading.grader import grade
    from flowlab.grading.manifest import ExerciseError, find_exercises

    for name, value in (("--cell-timeout", args.cell_timeout), ("--notebook-timeout", args.notebook_timeout),
                        ("-j", args.jobs)):
        if value is not None and value <= 0:
            print(f"flowlab grade: {name} must be positive (got {value:g})", file=sys.stderr)
            return 2
    try:
        source = args.source or find_exercises()
        grades = grade(args.submissions, source, args.out, jobs=args.jobs, cell_timeout=args.cell_timeout,
                       notebook_timeout=args.notebook_timeout, case_timeout=args.case_timeout, echo=False)
    except ExerciseError as e:
        print(f"flowlab grade: {e}", file=sys.stderr)
        return 2
    print(grades.summary)
    print(f"\nreports in {grades.out}: grades.csv, grades.json, <student>/results.json (Gradescope)")
    return 0


def _exercises_release(args) -> int:
    """Write the student version of an exercises folder."""
    from flowlab.grading.manifest import ExerciseError, find_exercises
    from flowlab.grading.release import ReleaseError, release

    try:
        source = args.source or find_exercises()
        written = release(source, args.out)
    except (ReleaseError, ExerciseError) as e:
        print(f"flowlab exercises release: {e}", file=sys.stderr)
        return 2
    print(f"released {len(written)} files from {source} into {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="flowlab", description="Learn and try out distributed deep learning.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("info", help="what this installation has: versions, BLAS threads, GPU").set_defaults(run=_info)
    worker = commands.add_parser(
        "worker", help="run one task of a cluster (from a spec file or FLOWLAB_CONFIG)",
        description="Run one task of a cluster in this process. The cluster key comes from "
                    "FLOWLAB_CLUSTER_KEY (hex), FLOWLAB_CLUSTER_KEY_FILE or --key-file. The task listens on "
                    "127.0.0.1 at its port from the spec unless --bind names another address.")
    worker.add_argument("--cluster", metavar="SPEC.json",
                        help='cluster spec: {"worker": ["host:port", ...], "ps": [...]} (or FLOWLAB_CONFIG\'s shape)')
    worker.add_argument("--job", default=None, help="job name (default: worker, or FLOWLAB_CONFIG's task type)")
    worker.add_argument("--task", type=int, default=None, help="task index in the job (default 0)")
    worker.add_argument("--bind", default=None, metavar="ADDRESS",
                        help="address to listen on (default 127.0.0.1; another one prints a warning)")
    worker.add_argument("--key-file", default=None, metavar="PATH", help="file holding the cluster key (hex)")
    worker.set_defaults(run=_worker)
    run = commands.add_parser(
        "run", help="run a script on N local ranks (like horovodrun)",
        description="Start N processes of SCRIPT on this machine, joined as one group: inside, "
                    "fl.cluster.rank()/world_size(), the collectives and flowlab.horovod work. Output is "
                    "prefixed by rank; if a rank fails, the others are ended and its status is returned.")
    run.add_argument("-np", "--np", type=int, required=True, metavar="N", help="number of ranks")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.set_defaults(run=_run)
    grade = commands.add_parser(
        "grade", help="grade a folder of submissions (fresh kernel each, fail closed)",
        description="Grade SUBMISSIONS (a folder of student folders or notebooks, or one notebook) with the "
                    "instructor's checks: each notebook in a fresh kernel, a deadline per cell that escalates "
                    "(interrupt, then kill, then a fresh kernel that replays what had run), every case checked "
                    "outside the student's process. Writes grades.csv, grades.json and a Gradescope "
                    "results.json per student.")
    grade.add_argument("submissions", metavar="SUBMISSIONS", help="folder of submissions, or one notebook")
    grade.add_argument("--source", default=None, metavar="DIR",
                       help="the instructor's exercises folder (default: the nearest exercises/ with a manifest)")
    grade.add_argument("--out", default="grades", metavar="DIR", help="where the reports go (default grades/)")
    grade.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                       help="submissions graded at once (default: the number of cores)")
    grade.add_argument("--cell-timeout", type=float, default=30, metavar="S",
                       help="seconds a student's cell may run before it is interrupted (default 30)")
    grade.add_argument("--notebook-timeout", type=float, default=600, metavar="S",
                       help="seconds all of a notebook's cells may take (default 600)")
    grade.add_argument("--case-timeout", type=float, default=None, metavar="S",
                       help="seconds one check case may take (default: the checks file's TIME_LIMIT, or 10)")
    grade.set_defaults(run=_grade)
    exercises = commands.add_parser("exercises", help="instructor's tools for an exercises folder")
    ex_commands = exercises.add_subparsers(dest="exercises_command", metavar="ACTION", required=True)
    rel = ex_commands.add_parser(
        "release", help="write the student version (solutions and hidden tests removed)",
        description="Copy an exercises folder for students: solution blocks replaced by '# YOUR CODE HERE', "
                    "outputs, execution counts and metadata cleared, hidden-test blocks removed from checks.")
    rel.add_argument("--source", default=None, metavar="DIR",
                     help="the instructor's exercises folder (default: the nearest exercises/ with a manifest)")
    rel.add_argument("--out", default="release", metavar="DIR",
                     help="where the student version goes (default release/)")
    rel.set_defaults(run=_exercises_release)
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
