"""Where the exercises are, what they are, and their checks.

An exercises folder holds ``manifest.json`` (``{"exercises": [{"id", "notebook", "answer", "points",
"title", "lesson"}, ...]}``: an exercise's id comes from here, never from a notebook's metadata), the
notebooks, and ``checks/<id>.py`` (``-`` in an id becomes ``_``) with ``cases()``, optionally
``hidden_cases()``, ``run(answer, case)``, ``HINTS``, ``TOLERANCE`` and ``POINTS``.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import runpy
from pathlib import Path

from .case import Case

__all__ = ["find_exercises", "load_manifest", "load_checks", "checks_path", "entry", "Checks",
           "ExerciseError", "UnknownExerciseError"]

_REPO_EXERCISES = Path(__file__).resolve().parent.parent.parent / "exercises"


class ExerciseError(ValueError):
    """An exercises folder, manifest or checks file that is not right (the message says where)."""


class UnknownExerciseError(KeyError):
    """An exercise id the manifest does not have; the message says which ids are close."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _is_exercises(d: Path) -> bool:
    return (d / "manifest.json").is_file()


def find_exercises(start=None) -> Path:
    """The exercises folder: ``$FLOWLAB_EXERCISES`` if set; else the nearest folder upwards from
    ``start`` (default: the current directory) that holds ``manifest.json`` itself or in an
    ``exercises/`` subfolder; else the ``exercises/`` folder beside the installed flowlab package.
    Raises ExerciseError naming where it looked."""
    env = os.environ.get("FLOWLAB_EXERCISES")
    if env:
        d = Path(env).expanduser().resolve()
        if not _is_exercises(d):
            raise ExerciseError(f"FLOWLAB_EXERCISES={env} has no manifest.json")
        return d
    here = Path(start if start is not None else os.getcwd()).resolve()
    for d in (here, *here.parents):
        if _is_exercises(d) and ((d / "checks").is_dir() or d.name == "exercises"):
            return d
        if _is_exercises(d / "exercises"):
            return d / "exercises"
    if _is_exercises(_REPO_EXERCISES):
        return _REPO_EXERCISES
    raise ExerciseError(f"no exercises folder (a manifest.json) in {here} or above it, nor at {_REPO_EXERCISES}; "
                        f"set FLOWLAB_EXERCISES to the folder that holds manifest.json")


def _identifier_path(name) -> bool:
    return isinstance(name, str) and bool(name) and all(part.isidentifier() for part in name.split("."))


def load_manifest(directory=None) -> dict:
    """``{id: entry}`` from ``directory/manifest.json`` (default :func:`find_exercises`), each entry a
    dict with ``id``, ``notebook``, ``answer``, ``points`` (None if the manifest has none), ``title`` and
    ``lesson``, in the manifest's order. Raises ExerciseError for a duplicated id (naming both
    entries), a missing notebook, an answer that is not a Python name, or a malformed file."""
    d = Path(directory) if directory is not None else find_exercises()
    path = d / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExerciseError(f"{path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ExerciseError(f"{path} is not valid JSON: {e}") from None
    items = data.get("exercises") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ExerciseError(f'{path} must be {{"exercises": [...]}}')
    out: dict = {}
    where: dict = {}
    for i, item in enumerate(items):
        label = f"{path}: exercise #{i + 1}"
        if not isinstance(item, dict):
            raise ExerciseError(f"{label} is not an object")
        ex_id = item.get("id")
        if not isinstance(ex_id, str) or not ex_id or ex_id.strip() != ex_id:
            raise ExerciseError(f"{label} has no id (a non-empty string)")
        label = f"{path}: exercise #{i + 1} ({ex_id!r}, notebook {item.get('notebook')!r})"
        if ex_id in out:
            raise ExerciseError(f"{path}: the id {ex_id!r} is used twice: by {where[ex_id]} and by exercise "
                                f"#{i + 1} (notebook {item.get('notebook')!r}); each exercise needs its own id")
        notebook = item.get("notebook")
        if not isinstance(notebook, str) or not notebook:
            raise ExerciseError(f"{label} names no notebook")
        if not (d / notebook).is_file():
            raise ExerciseError(f"{label}: the notebook {d / notebook} does not exist")
        answer = item.get("answer")
        if not _identifier_path(answer):
            raise ExerciseError(f"{label}: answer {answer!r} is not a Python name (the name the student's "
                                f"notebook defines)")
        points = item.get("points")
        if points is not None and (isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0):
            raise ExerciseError(f"{label}: points must be a number >= 0, got {points!r}")
        out[ex_id] = {**item, "id": ex_id, "notebook": notebook, "answer": answer, "points": points,
                      "title": item.get("title") or ex_id, "lesson": item.get("lesson")}
        where[ex_id] = f"exercise #{i + 1} (notebook {notebook!r})"
    return out


def entry(manifest: dict, ex_id: str) -> dict:
    """``manifest[ex_id]``, or UnknownExerciseError with "did you mean" and the ids there are."""
    if ex_id in manifest:
        return manifest[ex_id]
    close = difflib.get_close_matches(str(ex_id), list(manifest), n=3, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}{' (or ' + ', '.join(map(repr, close[1:])) + ')' if close[1:] else ''}?" \
        if close else ""
    known = ", ".join(map(repr, manifest)) or "none"
    raise UnknownExerciseError(f"no exercise {ex_id!r} in the manifest{hint} (exercises: {known})")


def checks_path(directory, ex_id: str) -> Path:
    """The checks file of ``ex_id``: ``directory/checks/<ex_id with - as _>.py``."""
    return Path(directory) / "checks" / (ex_id.replace("-", "_") + ".py")


def _default_run(answer, case):
    return answer(*case.args, **case.kwargs) if callable(answer) else answer


class Checks:
    """An exercise's checks file, loaded: ``cases()`` and ``hidden_cases()`` (lists of :class:`Case`,
    hidden ones marked ``hidden=True``), ``run(answer, case)``, ``HINTS``, ``TOLERANCE``, ``POINTS``."""

    def __init__(self, ex_id: str, path: Path, namespace: dict):
        self.id, self.path, self.namespace = ex_id, path, namespace
        self.HINTS = list(namespace.get("HINTS") or [])
        self.TOLERANCE = dict(namespace.get("TOLERANCE") or {})
        self.POINTS = namespace.get("POINTS")
        run = namespace.get("run")
        self.run = run if callable(run) else _default_run
        self.has_hidden = callable(namespace.get("hidden_cases"))
        # a released checks file has no hidden block; ``HIDDEN_COUNT = n`` (written by the release) says
        # how many cases the grader keeps back
        count = namespace.get("HIDDEN_COUNT")
        self.hidden_count = count if type(count) is int and count >= 0 else None

    def _collect(self, fn_name: str, hidden: bool) -> list:
        fn = self.namespace.get(fn_name)
        if fn is None:
            return []
        out = []
        for case in fn():
            if not isinstance(case, Case):
                raise ExerciseError(f"{self.path}: {fn_name}() yielded {type(case).__name__}, not a Case")
            if case.hidden != hidden:
                case = dataclasses.replace(case, hidden=hidden)
            out.append(case)
        return out

    def cases(self) -> list:
        return self._collect("cases", False)

    def hidden_cases(self) -> list:
        return self._collect("hidden_cases", True)

    def __getattr__(self, name):
        """Any other global of the checks file (``TIME_LIMIT``...)."""
        try:
            return self.__dict__["namespace"][name]
        except KeyError:
            raise AttributeError(f"the checks of {self.__dict__.get('id')!r} define no {name}") from None

    def n_hidden(self) -> int:
        """How many hidden cases the grader runs: counted here, or the release's ``HIDDEN_COUNT``."""
        return len(self.hidden_cases()) if self.has_hidden else (self.hidden_count or 0)

    def all_cases(self) -> list:
        """Visible then hidden cases; raises ExerciseError if two share a name."""
        cases = self.cases() + self.hidden_cases()
        seen = set()
        for c in cases:
            if c.name in seen:
                raise ExerciseError(f"{self.path}: two cases are named {c.name!r}; each case needs its own name")
            seen.add(c.name)
        return cases

    def __repr__(self):
        return f"<Checks {self.id!r} from {self.path}>"


def load_checks(directory, ex_id: str) -> Checks:
    """Run ``directory/checks/<id>.py`` (with runpy, in a namespace of its own) and return its
    :class:`Checks`. Raises ExerciseError if the file is missing or defines no ``cases()``."""
    path = checks_path(directory, ex_id)
    if not path.is_file():
        raise ExerciseError(f"exercise {ex_id!r} has no checks file: {path} does not exist")
    namespace = runpy.run_path(str(path), run_name=f"flowlab_checks_{ex_id.replace('-', '_')}")
    if not callable(namespace.get("cases")) and not callable(namespace.get("hidden_cases")):
        raise ExerciseError(f"{path} defines no cases() (a generator of flowlab.grading.Case)")
    return Checks(ex_id, path, namespace)
