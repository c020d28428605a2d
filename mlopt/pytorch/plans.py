"""The plans of the mlopt torch.distributed backend: a plan index, its content hash, and the program of a call.

* `load_index(path)`: an `mlopt plan --model ... -o DIR` index (DIR/index.json or DIR), its collective plans (the
  MSCCL-EF XML beside each collective sidecar .json, `mlopt.sim.evaluate.classify_plans`) and a sha256 over the
  index and every file it names (`PlanIndex.digest`), which the backend compares across ranks at init.
* `PlanBook(nranks, index, explicit)`: which program runs a collective of a process group of `nranks` ranks.

Selection (`PlanBook.choose`), in this order:

1. an explicit plan for the collective (`explicit={"allreduce": "ar.xml"}`): it must be that collective over
   exactly `nranks` ranks, else the book refuses it at construction (InputError naming the file and the field:
   asking for a program by name and getting another is an error, not a fallback). A broadcast/reduce plan is
   used only for calls whose root is the program's root;
2. the index's plans of the collective over `nranks` ranks (with the call's root for broadcast/reduce), the one
   synthesised for the nearest size (`mlopt.sim.evaluate.plan_for`). Index plans over another number of ranks
   are simply not candidates (an index planned for 8 ranks says nothing about a 2-rank sub-group);
3. else mlopt's own ring program for the collective (`mlopt.native.enforcer.motif_program_xml`), reported
   once per (collective, root): `logging.warning` and a line in `PlanBook.fallbacks`.

Sizes follow nccl-tests' convention, as the collective planner's `--size`: the output per rank for allgather
and alltoall, the input per rank for reducescatter, the buffer for the others. The backend runs every program
out of place, so a plan must declare outofplace="1".
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mlopt.errors import InputError
from mlopt.formats.io import read_bytes, sha256_file
from mlopt.formats.loaders import load_any
from mlopt.formats.msccl_xml import parse_program
from mlopt.sim.evaluate import XmlPlan, classify_plans, plan_for, xml_plans
from mlopt.sim.symbolic import derive_spec

INDEX_FILE = "index.json"
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
ROOTED = frozenset({"broadcast", "reduce"})

_log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ index


@dataclass(frozen=True)
class PlanIndex:
    """A loaded plan index: its path, the XMLs of its collective plans, and the sha256 of every file."""

    path: str  # the index.json
    collectives: tuple[str, ...]  # MSCCL-EF XML paths of its collective plans
    files: tuple[tuple[str, str], ...]  # (name relative to the index's folder, sha256): the index first
    document: Mapping[str, Any] = field(default_factory=dict, compare=False)  # the index.json as read

    @property
    def folder(self) -> Path:
        return Path(self.path).parent

    @property
    def digest(self) -> str:
        return files_digest(self.files)


def index_file(path: str | os.PathLike) -> Path:
    """The index.json a path names (the file itself, or the folder holding it)."""
    path = Path(path)
    return path / INDEX_FILE if path.is_dir() else path


def load_index(path: str | os.PathLike) -> PlanIndex:
    """The index at `path` (index.json or its folder); InputError naming the file when it is not one."""
    path = index_file(path)
    loaded = load_any(str(path))
    if loaded.kind != "plan-index":
        raise InputError(str(path), "$.format", f"expected an mlopt plan index (mlopt plan --model -o DIR), "
                                                f"found a {loaded.kind}")
    folder = path.parent
    named = [folder / entry["file"] for entry in loaded.value.get("plans", [])]
    collectives = classify_plans([str(path)]).xmls
    files = [(INDEX_FILE if path.name == INDEX_FILE else path.name, sha256_file(path))]
    for file in dict.fromkeys([*named, *map(Path, collectives)]):  # ordered, each file once
        files.append((_relative(file, folder), _sha256(file, path)))
    return PlanIndex(str(path), tuple(collectives), tuple(files), loaded.value)


def _relative(file: Path, folder: Path) -> str:
    try:
        return str(file.relative_to(folder))
    except ValueError:
        return str(file)


def _sha256(file: Path, index: Path) -> str:
    try:
        return sha256_file(file)
    except OSError as exc:
        raise InputError(str(index), "$.plans", f"{file}: {exc.strerror or exc}") from None


def files_digest(files: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    """One sha256 over (name, sha256) pairs, in their order."""
    digest = hashlib.sha256()
    for name, sha in files:
        digest.update(f"{name}\t{sha}\n".encode("utf-8"))
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ selection


@dataclass(frozen=True)
class CollectivePlan:
    """An MSCCL-EF program the backend may run: `XmlPlan` (path, coll, ngpus, size_bytes) and its root."""

    xml: XmlPlan
    root: int  # broadcast/reduce: the program's root (mlopt/sim/symbolic.py); -1 for the others

    @property
    def path(self) -> str:
        return self.xml.path


def collective_plan(path: str) -> CollectivePlan:
    """The XML at `path` as a candidate; InputError naming the file when the backend cannot run it. The
    backend runs a program in either mode it declares (in place on the call's tensor, or staged in its
    in-place layout, when it declares only inplace="1")."""
    (xml,) = xml_plans([path])
    program = parse_program(read_bytes(path), path)
    if not (program.outofplace or program.inplace):
        raise InputError(path, "outofplace", "the program declares neither inplace=\"1\" nor outofplace=\"1\"")
    return CollectivePlan(xml, derive_spec(program).root if xml.coll in ROOTED else -1)


@dataclass(frozen=True)
class Choice:
    """What runs a call: a plan (its XML path) or mlopt's ring fallback (plan None)."""

    collective: str
    root: int
    plan: CollectivePlan | None

    @property
    def source(self) -> str:
        return self.plan.path if self.plan is not None else f"mlopt ring {self.collective}"


class PlanBook:
    """The programs of one process group of `nranks` ranks (the module docstring says how a call's is chosen)."""

    def __init__(self, nranks: int, index: PlanIndex | None = None, explicit: Mapping[str, str] | None = None):
        self.nranks = int(nranks)
        self.index = index
        self.explicit = {coll: self._explicit_plan(coll, path) for coll, path in (explicit or {}).items()}
        listed = [collective_plan(p) for p in (index.collectives if index else ())]
        self.others = tuple(p for p in listed if p.xml.ngpus != self.nranks)  # plans of other group sizes
        self.candidates = tuple(p for p in listed if p.xml.ngpus == self.nranks)
        self.fallbacks: list[str] = []
        self._reported: set[tuple[str, int]] = set()

    def _explicit_plan(self, collective: str, path: str | os.PathLike) -> CollectivePlan:
        if collective not in COLLECTIVES:
            raise InputError(str(path), "coll", f"plans are given per collective ({', '.join(COLLECTIVES)}); "
                                                f"{collective!r} is not one")
        plan = collective_plan(str(path))
        if plan.xml.coll != collective:
            raise InputError(str(path), "coll", f"the program is {plan.xml.coll}; it was given for {collective}")
        if plan.xml.ngpus != self.nranks:
            raise InputError(str(path), "ngpus", f"the program is for {plan.xml.ngpus} ranks; the process group "
                                                 f"has {self.nranks}")
        return plan

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        """(name, sha256) of every plan file this book may run: the index's, then the explicit plans."""
        own = tuple((f"{coll}={plan.path}", sha256_file(plan.path)) for coll, plan in sorted(self.explicit.items()))
        return (self.index.files if self.index else ()) + own

    def choose(self, collective: str, nbytes: int, root: int = 0) -> Choice:
        """The program of `collective` over this group for `nbytes` (nccl-tests' convention) from `root`."""
        if collective not in COLLECTIVES:
            raise ValueError(f"collective {collective!r} is not one of {', '.join(COLLECTIVES)}")
        root = root if collective in ROOTED else -1
        explicit = self.explicit.get(collective)
        if explicit is not None and explicit.root == root:
            return Choice(collective, root, explicit)
        fitting = [p for p in self.candidates if p.xml.coll == collective and p.root == root]
        best = plan_for([p.xml for p in fitting], collective, self.nranks, nbytes)
        if best is not None:
            return Choice(collective, root, next(p for p in fitting if p.xml is best))
        self._report(collective, root)
        return Choice(collective, root, None)

    def _report(self, collective: str, root: int) -> None:
        if (collective, root) in self._reported:
            return
        self._reported.add((collective, root))
        what = f"{collective} over {self.nranks} ranks" + (f" from root {root}" if root >= 0 else "")
        line = f"mlopt: no plan for {what} ({self._why_none(collective, root)}); running mlopt's ring program"
        self.fallbacks.append(line)
        _log.warning("%s", line)

    def _why_none(self, collective: str, root: int) -> str:
        explicit = self.explicit.get(collective)
        if explicit is not None:
            return f"{explicit.path} is for root {explicit.root}"
        if self.index is None and not self.explicit:
            return "no plan index"
        where = self.index.path if self.index else "the explicit plans"
        same = [p for p in self.candidates if p.xml.coll == collective]
        if same:
            return f"{where} has it for root(s) {sorted({p.root for p in same})}"
        sizes = sorted({p.xml.ngpus for p in self.others if p.xml.coll == collective})
        if sizes:
            return f"{where} has it for {', '.join(map(str, sizes))} ranks"
        return f"{where} has none"
