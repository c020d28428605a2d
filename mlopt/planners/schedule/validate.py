"""`mlopt validate schedule.plan.json [--model trace.json --topology T]`: a schedule plan checked without a search.

Alone: every motif ends its duration after it starts, sequence numbers follow start times (equal for motifs
issued together), nothing ends after the predicted iteration, and every comm-op's motifs are proven to
implement its collective (`motifs.implements`: shapes, an acyclic order, no race, the collective's
postcondition) unless that needs more than MAX_PROOF_ELEMENTS symbolic elements (then it is counted as not
proven). A plan that carries its motifs' programs (payload 1.1, `programs`) has each proven from its XML
(programs.prove: mlopt.sim.symbolic.check_program against the collective it declares) after its sha256 is
checked, and every motif must name one whose collective, ranks (count), root position and pairs are the
motif's; a program that fails is refused naming the first motif that runs it. With the trace and topology:
the problem is rebuilt and optSched, given the plan's execution options, must reproduce the predicted
iteration time.
"""

from __future__ import annotations

import math

from mlopt.errors import InputError
from mlopt.formats.io import sha256_bytes
from mlopt.formats.loaders import load_trace_any, resolve_topology
from mlopt.formats.msccl_xml import parse_program
from mlopt.formats.plan import PlanFile
from mlopt.planners.schedule.from_trace import cost_table_for
from mlopt.planners.schedule.motifs import CommOp, Motif, implements
from mlopt.planners.schedule.optsched import lower_bound_us, optsched
from mlopt.planners.schedule.planner import issued
from mlopt.planners.schedule.problem import schedule_problem
from mlopt.planners.collective.lowering import LoweringError
from mlopt.planners.schedule.programs import ProgramKey, entry_key, motif_key, motif_program, prove
from mlopt.sim import workload as wl

REQUIRED = ("algorithm", "options", "channels", "comm_ops", "predicted", "systems")
# The symbolic proof runs at the granularity of the gcd of the motifs' byte ranges: plans whose cuts are that
# fine are left unproven rather than made slow.
MAX_PROOF_ELEMENTS = 1 << 16


def _check_references(payload: dict, source: str) -> None:
    """Comm-op ids are unique (each is one collective of the unrolled workload); a motif's deps name other
    motifs of its comm-op (the payload schema has checked the types)."""
    first: dict[int, int] = {}
    for i, op in enumerate(payload["comm_ops"]):
        if op["id"] in first:
            raise InputError(source, f"$.payload.comm_ops[{i}].id",
                             f"comm-op {op['id']} is also $.payload.comm_ops[{first[op['id']]}]")
        first[op["id"]] = i
        for j, m in enumerate(op["motifs"]):
            for k, dep in enumerate(m.get("deps") or ()):
                if dep >= len(op["motifs"]) or dep == j:
                    raise InputError(source, f"$.payload.comm_ops[{i}].motifs[{j}].deps[{k}]",
                                     f"is {dep}: expected another motif of this comm-op (0..{len(op['motifs']) - 1})")


def _check_motifs(payload: dict, source: str) -> None:
    _check_references(payload, source)
    iteration = payload["predicted"]["makespan_us"]
    starts: dict[float, int] = {}
    for i, op in enumerate(payload["comm_ops"]):
        for j, m in enumerate(op["motifs"]):
            where = f"$.payload.comm_ops[{i}].motifs[{j}]"
            if not math.isclose(m["end_us"] - m["start_us"], m["duration_us"], rel_tol=1e-9, abs_tol=1e-6):
                raise InputError(source, where, f"runs {m['end_us'] - m['start_us']} us, its duration is "
                                                f"{m['duration_us']} us")
            if m["end_us"] > iteration * (1 + 1e-9) + 1e-6:
                raise InputError(source, where, f"ends at {m['end_us']} us, after the unrolled iterations ({iteration} us)")
            seen = starts.setdefault(m["seq"], m["start_us"])
            if not math.isclose(seen, m["start_us"], rel_tol=1e-12, abs_tol=1e-9):
                raise InputError(source, f"{where}.seq", f"sequence number {m['seq']} is shared by motifs issued "
                                                         f"at {seen} and {m['start_us']} us")
    ordered = sorted(starts.items())
    if any(b[1] <= a[1] for a, b in zip(ordered, ordered[1:])):
        raise InputError(source, "$.payload.comm_ops", "sequence numbers do not follow the motifs' start times")


def _prove_decompositions(payload: dict, source: str) -> tuple[int, int]:
    """(proven, too large to prove) comm-ops; InputError naming the first whose motifs do not implement it.
    Rows without the op's collective (abstract problems) are neither."""
    proven = unproven = 0
    for i, row in enumerate(payload["comm_ops"]):
        if row.get("collective") is None or any("regions" not in m for m in row["motifs"]):
            continue
        where = f"$.payload.comm_ops[{i}]"
        try:
            op = CommOp(row["collective"], int(row["nbytes"]), tuple(row["ranks"]), row.get("root"),
                        pairs=tuple(map(tuple, row["pairs"])) if row.get("pairs") is not None else None)
            motifs = [Motif(m["collective"], tuple(m["ranks"]), tuple(tuple(map(tuple, r)) for r in m["regions"]),
                            m.get("root"), deps=tuple(m.get("deps") or ()),
                            pattern=None if m.get("pattern") is None else tuple(map(tuple, m["pattern"])))
                      for m in row["motifs"]]
        except (ValueError, TypeError, KeyError) as exc:
            raise InputError(source, where, f"comm-op {row.get('name')!r}: {exc}") from None
        try:
            problems = implements(op, motifs, max_elements=MAX_PROOF_ELEMENTS)
        except ValueError:  # finer than the proof's budget
            unproven += 1
            continue
        if problems:
            raise InputError(source, f"{where}.motifs", f"comm-op {row.get('name')!r}: its motifs do not implement "
                                                        f"the {op.collective}: {problems[0]}")
        proven += 1
    return proven, unproven


def _motif_paths(payload: dict) -> dict[str, str]:
    """Program id -> the JSON path of the first motif naming it."""
    first: dict[str, str] = {}
    for i, op in enumerate(payload["comm_ops"]):
        for j, m in enumerate(op["motifs"]):
            if m.get("program") is not None:
                first.setdefault(m["program"], f"$.payload.comm_ops[{i}].motifs[{j}]")
    return first


def _proven_program_keys(payload: dict, source: str) -> dict[str, ProgramKey]:
    """Program id -> the key it is proven for; InputError naming the first motif that runs a program whose
    XML changed, does not parse, is not what its entry declares or fails its proof (the entry itself when no
    motif names it)."""
    users = _motif_paths(payload)
    keys: dict[str, ProgramKey] = {}
    for k, entry in enumerate(payload["programs"]):
        pid = entry["id"]
        where = users.get(pid, f"$.payload.programs[{k}]")
        what = f"program {pid} ($.payload.programs[{k}])"
        if pid in keys:
            raise InputError(source, f"$.payload.programs[{k}].id", f"program id {pid!r} is used twice")
        if entry.get("xml") is None:
            _check_unrunnable(entry, source, where, what)
            keys[pid] = entry_key(entry)
            continue
        if sha256_bytes(entry["xml"].encode("utf-8")) != entry["xml_sha256"]:
            raise InputError(source, where, f"runs {what}, whose XML is not the one its xml_sha256 names")
        try:
            key = entry_key(entry)
            problems = prove(parse_program(entry["xml"], f"{source}: {what}"), key)
        except (InputError, ValueError, KeyError) as exc:
            raise InputError(source, where, f"runs {what}, which cannot be read: {exc}") from None
        if problems:
            raise InputError(source, where, f"runs {what}, which is not a proven {key.describe()}: {problems[0]}")
        keys[pid] = key
    return keys


def _check_unrunnable(entry: dict, source: str, where: str, what: str) -> None:
    """A program the plan could not make (xml null) must say why, and mlopt must indeed fail to make one."""
    if not entry.get("unrunnable") or entry.get("xml_sha256") is not None:
        raise InputError(source, where, f"runs {what}, which has no XML: it needs `unrunnable` (why) and a null "
                                        f"xml_sha256")
    try:
        motif_program(entry_key(entry))
    except LoweringError:
        return
    except (ValueError, KeyError) as exc:
        raise InputError(source, where, f"runs {what}, which cannot be read: {exc}") from None
    raise InputError(source, where, f"runs {what}, which says no program fits the executor, but mlopt makes one: "
                                    f"re-plan")


def _check_programs(payload: dict, source: str) -> int:
    """Proven programs (0 when the plan carries none): each motif with a collective names a carried program
    made for what it does."""
    if payload.get("programs") is None:
        return 0
    keys = _proven_program_keys(payload, source)
    for i, op in enumerate(payload["comm_ops"]):
        for j, m in enumerate(op["motifs"]):
            if m.get("collective") is None or m.get("ranks") is None:
                continue
            where = f"$.payload.comm_ops[{i}].motifs[{j}]"
            if m.get("program") not in keys:
                raise InputError(source, f"{where}.program", f"motif {m['name']!r} names program {m.get('program')!r}, "
                                                             f"which the plan does not carry")
            try:
                want = motif_key(m)
            except (ValueError, KeyError) as exc:
                raise InputError(source, where, f"motif {m['name']!r}: {exc}") from None
            have = keys[m["program"]]
            if have != want:
                raise InputError(source, f"{where}.program", f"motif {m['name']!r} is a {want.describe()}; its "
                                                             f"program {m['program']} is a {have.describe()}")
    return len(keys)


def _replay(payload: dict, source: str, model_path: str, topology_spec: str) -> None:
    options = payload["options"]
    workload = wl.chain(wl.from_trace(load_trace_any(model_path), source=model_path), options["iterations"])
    topology = resolve_topology(topology_spec)
    problem = schedule_problem(workload, topology, mode=options["mode"], source=model_path,
                               costs=cost_table_for(options.get("cost_table"), topology))
    plan = {op["id"]: op["option"] for op in payload["comm_ops"]}
    order = {"fifo": "fifo", "lifo": "lifo", "exec-only": "fifo", "hand": "needed"}.get(payload["algorithm"],
                                                                                       "critical")
    issue = "framework" if payload["algorithm"] in ("fifo", "lifo", "exec-only") else "enforcer"
    try:
        makespan = optsched(issued(problem, issue), plan, order).makespan_us
    except ValueError as exc:
        raise InputError(source, "$.payload.comm_ops", str(exc)) from None
    predicted = payload["predicted"]["makespan_us"]
    if not math.isclose(makespan, predicted, rel_tol=1e-9, abs_tol=1e-6):
        raise InputError(source, "$.payload.predicted.makespan_us",
                         f"{predicted} but optSched gives {makespan} with the plan's execution options")
    bound = payload["predicted"].get("bound_makespan_us")
    if bound is not None:
        recomputed = lower_bound_us(problem)
        if not math.isclose(bound, recomputed, rel_tol=1e-9, abs_tol=1e-6):
            raise InputError(source, "$.payload.predicted.bound_makespan_us",
                             f"{bound} but the lower bounds (optsched.lower_bound_us) give {recomputed}")


def validate_schedule_plan(plan: PlanFile, source: str, model_path: str | None, topology_spec: str | None) -> str:
    payload = plan.payload
    for key in REQUIRED:
        if key not in payload:
            raise InputError(source, f"$.payload.{key}", "missing required field")
    _check_motifs(payload, source)
    proven, unproven = _prove_decompositions(payload, source)
    programs = _check_programs(payload, source)
    bound = payload["predicted"].get("bound_makespan_us")
    if bound is not None and bound > payload["predicted"]["makespan_us"] * (1 + 1e-9) + 1e-6:
        raise InputError(source, "$.payload.predicted.bound_makespan_us",
                         f"the lower bound {bound} us exceeds the plan's makespan {payload['predicted']['makespan_us']} us")
    replayed = ""
    if model_path is not None and topology_spec is not None:
        _replay(payload, source, model_path, topology_spec)
        replayed = ", replayed by optSched"
    motifs = sum(len(op["motifs"]) for op in payload["comm_ops"])
    predicted = payload["predicted"]
    proofs = f", {proven} decompositions proven" + (f" ({unproven} too fine to prove)" if unproven else "")
    unrunnable = sum(1 for entry in payload.get("programs") or () if entry.get("xml") is None)
    proofs += (f", {programs - unrunnable} motif programs proven" if payload.get("programs") is not None
               else ", no motif programs carried (the enforcer makes them at run time)")
    if unrunnable:
        proofs += f", {unrunnable} too large for the MSCCL executor (the enforcer refuses their motifs)"
    return (f"{len(payload['comm_ops'])} comm-ops, {motifs} motifs, iteration {predicted['iteration_us']:.1f} us "
            f"({predicted['iterations']} unrolled: {predicted['makespan_us']:.1f} us){proofs}{replayed}")
