"""The collective planner's entry in the registry (mlopt.planners.registry): an MSCCL-EF XML and its JSON
sidecar (the plan envelope) per collective."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from mlopt.errors import InputError
from mlopt.formats.importers.taccl import import_taccl_sketch
from mlopt.formats.io import read_document, sha256_bytes, write_files
from mlopt.formats.loaders import resolve_topology
from mlopt.formats.plan import PlanFile, sidecar_path
from mlopt.formats.sizes import parse_size, parse_size_range
from mlopt.planners.collective import from_trace
from mlopt.planners.collective.output import collective_plan_files, write_collective_plan
from mlopt.planners.collective.planner import CollectiveOptions, plan_collective
from mlopt.planners.collective.size_bands import BandPlan, band_file_name, plan_size_bands
from mlopt.planners.collective.validate import validate_collective_plan
from mlopt.planners.options import PLANNER_COMMAND_OPTIONS, TOPOLOGY_COMMAND_OPTIONS, CommandOption, \
    PlannerOptions, planner_options_from_args, topology_options_from_args
from mlopt.planners.protocol import PlannedFiles, PlannerKind, PlanRequest, SimulationFacts, StalenessFacts, \
    envelope_metrics


def files(output: str) -> list[str]:
    """`-o X.xml` writes X.xml and its sidecar X.json (the envelope, last)."""
    return [str(PurePosixPath(output)), sidecar_path(PurePosixPath(output)).as_posix()]


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    payload = doc.get("payload", {})
    bound = payload.get("lower_bound") or {}
    return {**envelope_metrics(doc), "algorithm": payload.get("algorithm"), "buffer_bytes": payload.get("size_bytes"),
            "time_us": payload.get("predicted_time_us"), "algbw_GBps": payload.get("algbw_GBps"),
            "bound_us": bound.get("time_us"), "ratio_to_bound": payload.get("ratio_to_bound")}


def plan_file(path: Path) -> Path:
    """A collective plan given as its MSCCL-EF XML is read from its sidecar."""
    if path.suffix != ".xml":
        return path
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        raise InputError(str(path), "$", f"no JSON sidecar {sidecar.name} beside it (the plan --check reads)")
    return sidecar


def _short(digest: str) -> str:
    return f"{digest[:12]}.."


def xml_changed(path: Path, plan: PlanFile) -> list[str]:
    """The plan's XML must still be the one its sidecar names by hash."""
    name, digest = plan.payload.get("xml"), plan.payload.get("xml_sha256")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise InputError(str(path), "$.payload.xml", "missing: not a collective plan sidecar")
    xml = path.with_name(name)
    if not xml.is_file():
        return [f"its XML {xml} is missing"]
    now = sha256_bytes(xml.read_bytes())
    if now != digest:
        return [f"its XML {xml} changed after planning (sha256 {_short(digest)} in $.payload.xml_sha256 -> "
                f"{_short(now)})"]
    return []


def xml_name(path: Path, plan: PlanFile) -> str:
    """A re-run is written to the XML's name (its sidecar then gets the committed sidecar's name)."""
    name = plan.payload.get("xml")
    if not isinstance(name, str) or not name or "/" in name:
        raise InputError(str(path), "$.payload.xml", "missing or not a file name")
    return name


# `mlopt plan collective`'s own options (CollectiveOptions' fields, the topology and the sketches)
COMMAND_OPTIONS = (
    CommandOption("topology", "text", "Topology preset or file (ndv2x2, dgx2x2, ...).", required=True),
    *TOPOLOGY_COMMAND_OPTIONS,
    CommandOption("collective", "choice", "", required=True,
                  choices=("allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce")),
    CommandOption("size", "text", "Buffer size, nccl-tests' convention: output per rank (allgather, alltoall), the "
                                  "buffer (allreduce), input per rank (reducescatter). E.g. 1GiB. The XML claims "
                                  "this size only (minBytes = maxBytes = it).",
                  size_range_axis=True),
    CommandOption("sizes", "text", "Instead of --size: LO..HI (x4 steps, as mlopt simulate) or a comma list; -o is "
                                   "then a folder with one XML (+ sidecar) per band of sizes that share the best "
                                   "program, the bands tiling LO..HI (docs/collective.md)."),
    CommandOption("sketch", "text", "TACCL communication sketch JSON (repeatable; implies --algorithm taccl).",
                  default=(), multiple=True),
    CommandOption("algorithm", "choice", "auto: every applicable family, best simulated time wins.", default="auto",
                  choices=("auto", "taccl", "ring", "tree", "direct", "hierarchical", "trees"), show_default=True),
    CommandOption("instances", "int", "Copies of the program over sub-chunks, each on its own channels.", default=1,
                  min=1, max=32, show_default=True),
    CommandOption("proto", "choice", "", default="Simple", choices=("Simple", "LL", "LL128"), show_default=True),
    CommandOption("xml-dialect", "choice", "executor: the current MSCCL executor's strict dialect; legacy: the "
                                           "older msccl runtime.", default="executor",
                  choices=("executor", "legacy"), show_default=True),
    CommandOption("root", "int", "Root of broadcast/reduce.", default=0, min=0, show_default=True),
)


def prepare_plan(args: dict[str, Any]) -> PlanRequest:
    """`mlopt plan collective`: the topology and sketches read, the options built (args by flag name)."""
    topology = resolve_topology(args["topology"], topology_options_from_args(args))
    sketch_paths = args["sketch"]
    sketches = [(import_taccl_sketch(read_document(p), p), p) for p in sketch_paths]
    algorithm = "taccl" if sketches and args["algorithm"] == "auto" else args["algorithm"]
    sizes = _sizes(args)
    copts = CollectiveOptions(args["collective"], sizes[0], algorithm, args["instances"],
                              args["proto"], args["xml-dialect"], args["root"])
    options = planner_options_from_args(args)
    inputs = {"topology": args["topology"], **{f"sketch{i}": p for i, p in enumerate(sketch_paths)}}

    def write(output: Path, progress) -> PlannedFiles:
        result = plan_collective(topology, copts, options, inputs=inputs, sketches=sketches, progress=progress)
        xml_path, sidecar = write_collective_plan(result, str(output), copts, options)
        return PlannedFiles([xml_path, sidecar], result.plan)

    def write_bands(output: Path, progress) -> PlannedFiles:
        bands = plan_size_bands(topology, copts, options, sizes, inputs=inputs, sketches=sketches, progress=progress)
        return write_band_files(bands, output, options)

    title = f"planning {copts.collective} on {topology.name}"
    if args.get("sizes") is not None:
        return PlanRequest(inputs, options, vars(copts), f"{title} for {len(sizes)} sizes", write_bands)
    return PlanRequest(inputs, options, vars(copts), title, write)


def _sizes(args: dict[str, Any]) -> list[int]:
    """--size S -> [S]; --sizes LO..HI -> the grid mlopt simulate uses (exactly one is given: KIND.one_of,
    checked by `PlannerKind.request`)."""
    size, sizes = args.get("size"), args.get("sizes")
    return [parse_size(size)] if size is not None else sorted(set(parse_size_range(sizes)))


def write_band_files(bands: list[BandPlan], folder: Path, options: PlannerOptions) -> PlannedFiles:
    """One XML and its sidecar per band, named in size order, into `folder` (all of them or none)."""
    if folder.suffix == ".xml" or folder.is_file():
        raise InputError(str(folder), "$", "--sizes writes a folder of XMLs: give -o a folder")
    contents: dict[Path, str] = {}
    for index, band in enumerate(bands):
        xml = folder / band_file_name(band.copts.collective, index, band.band)
        contents.update(collective_plan_files(band.planned, xml, band.copts, options, band.band))
    # An earlier sweep's bands would overlap these ones in the folder MSCCL reads: refuse rather than mix them.
    leftovers = sorted(set(folder.glob(f"{bands[0].copts.collective}-[0-9][0-9]-*.xml")) - set(contents))
    if leftovers:
        raise InputError(str(folder), "$", f"holds {leftovers[0].name} from another sweep ({len(leftovers)} file(s)); "
                                           "its bands would overlap these: remove it or give another folder")
    folder.mkdir(parents=True, exist_ok=True)
    write_files(contents)
    return PlannedFiles(list(contents), bands[-1].planned.plan)


def summary(planned: PlannedFiles, output: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`mlopt plan collective`'s --json summary and its one line about what was written."""
    if len(planned.files) > 2:
        return _bands_summary(planned)
    xml_path, sidecar = planned.files
    plan_obj, p = planned.plan, planned.plan.payload
    summary = {**plan_obj.summary(), "xml": str(xml_path), "sidecar": str(sidecar), "algorithm": p["algorithm"],
               "ratio_to_bound": p["ratio_to_bound"]}
    return summary, (f"{p['algorithm']}: {p['predicted_time_us']:.1f} us ({p['algbw_GBps']:.2f} GB/s algbw), "
                     f"{p['ratio_to_bound']:.2f}x the lower bound {p['lower_bound']['time_us']:.1f} us "
                     f"({plan_obj.status.value}); wrote {xml_path} and {sidecar}")


def _bands_summary(planned: PlannedFiles) -> tuple[dict[str, Any], str]:
    """`mlopt plan collective --sizes`: each band's file, sizes and algorithm."""
    xmls = [f for f in planned.files if f.suffix == ".xml"]
    bands = []
    for xml in xmls:
        payload = read_document(str(sidecar_path(xml)))["payload"]
        bands.append({"xml": str(xml), "algorithm": payload["algorithm"], **payload["size_band"]})
    lines = "; ".join(f"{b['min_bytes']}..{b['max_bytes']} B: {b['algorithm']}" for b in bands)
    return {"bands": bands}, f"{len(bands)} band(s): {lines}; wrote {len(planned.files)} files in {xmls[0].parent}"


KIND = PlannerKind(
    name="collective",
    options_type=CollectiveOptions,
    why_not=from_trace.why_not,
    run=from_trace.run,
    output_suffix=".xml",
    files=files,
    file_inputs=("sketch",),
    named_inputs=("topology",),
    validate=validate_collective_plan,
    metrics=metrics,
    staleness=StalenessFacts(plan_file=plan_file, file_checks=xml_changed, rerun_name=xml_name),
    # no apply: the plan is its MSCCL-EF XML, which the system layer applies (mlopt.sim.evaluate.classify_plans)
    simulation=SimulationFacts(),
    command_options=COMMAND_OPTIONS,
    shared_options=PLANNER_COMMAND_OPTIONS,
    prepare_plan=prepare_plan,
    one_of=(("size", "sizes"),),
    command_help='Synthesize a collective algorithm as MSCCL-EF XML (-o ag.xml) plus a JSON sidecar (ag.json).',
    summary=summary,
)
