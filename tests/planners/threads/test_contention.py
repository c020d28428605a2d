"""LIBRA's contention model: fitting eq. 5-6 from samples, the sample document, the default parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlopt.errors import InputError
from mlopt.formats.io import canonical_json, parse_document
from mlopt.planners.threads import contention as ct
from mlopt.planners.threads.contention import (
    DEFAULT_PARAMETERS,
    KINDS,
    PAPER_V100_BERT_PARAMETERS,
    PARAMETER_NAMES,
    Sample,
    check_parameters,
    fit,
    parse_samples,
    predict_us,
    samples_document,
    synthetic_samples,
)

R = [128, 256, 512, 1024, 2048, 4096]  # the paper's thread set
OTHER = {  # a second, quite different parameter set (slow network, strong contention)
    "alpha1": 1.05, "alpha2": 1.0e-4,
    "gamma1": 2.5e3, "gamma2": 2.0e3, "gamma3": 0.03, "gamma4": 0.6,
    "q_gamma1": 3.0e3, "q_gamma2": 2.9e3, "q_gamma3": 0.05, "q_gamma4": 0.6,
}


def _rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@pytest.mark.parametrize("params, threads", [(DEFAULT_PARAMETERS, R), (PAPER_V100_BERT_PARAMETERS, R),
                                             (OTHER, [64, 128, 256, 512, 1024, 2048, 4096])])
def test_fit_recovers_parameters_from_noiseless_samples(params, threads):
    result = fit(synthetic_samples(params, threads, seed=0, noise=0.0), "synthetic")
    assert set(result.parameters) == set(PARAMETER_NAMES)
    for name in PARAMETER_NAMES:
        assert _rel(result.parameters[name], params[name]) < 1e-3, name
    for kind in KINDS:
        assert result.rms_rel_error[kind] < 1e-6
        assert result.max_rel_error[kind] < 1e-6
        assert result.counts[kind] == len(threads) * 2


def test_fit_with_two_percent_noise_reports_small_error_and_predicts_well():
    samples = synthetic_samples(DEFAULT_PARAMETERS, [64, *R], seed=7, noise=0.02)
    result = fit(samples, "synthetic")
    for kind in KINDS:
        assert 0.005 < result.rms_rel_error[kind] < 0.03, (kind, result.rms_rel_error)
        assert result.max_rel_error[kind] < 0.08
    # the fitted model predicts the noiseless times within a few percent over the sampled range
    grid = np.array([64, 100, 300, 700, 1500, 3000, 4096])
    for kind, base in [("compute", 10_000.0), ("overlapped_comm", 64e6), ("exposed_comm", 64e6)]:
        fitted = predict_us(result.parameters, kind, base, grid)
        truth = predict_us(DEFAULT_PARAMETERS, kind, base, grid)
        assert np.max(np.abs(fitted / truth - 1.0)) < 0.03, kind
    # positive (and monotone) over the sampled range, r >= 64
    assert check_parameters(result.parameters, max_threads=4096, min_threads=64) == []
    assert json.loads(json.dumps(result.to_dict()))["counts"] == result.counts


def test_startup_is_subtracted_before_fitting():
    samples = [
        Sample(s.kind, s.threads, s.base, s.measured_us + (50.0 if s.kind != "compute" else 0.0),
               50.0 if s.kind != "compute" else 0.0)
        for s in synthetic_samples(DEFAULT_PARAMETERS, R, seed=0)
    ]
    result = fit(samples, "synthetic")
    for name in PARAMETER_NAMES:
        assert _rel(result.parameters[name], DEFAULT_PARAMETERS[name]) < 1e-3, name


@pytest.mark.parametrize("kind, keep", [("compute", 2), ("overlapped_comm", 3), ("exposed_comm", 0)])
def test_too_few_samples_names_the_kind_and_the_count(kind, keep):
    samples = synthetic_samples(DEFAULT_PARAMETERS, R, seed=0)
    of_kind = [s for s in samples if s.kind == kind]
    samples = [s for s in samples if s.kind != kind] + of_kind[:keep]
    with pytest.raises(InputError) as info:
        fit(samples, "samples.json")
    err = info.value
    assert err.exit_code == 2
    assert err.file == "samples.json" and err.field == "$.samples"
    assert repr(kind) in err.message and f": {keep}," in err.message
    assert "at least" in err.message


def test_too_few_distinct_thread_counts_is_an_input_error():
    samples = synthetic_samples(DEFAULT_PARAMETERS, [512, 1024], seed=0, c_hat_bytes=(1e6, 2e6, 4e6))
    with pytest.raises(InputError, match="distinct thread counts for 'overlapped_comm': 2"):
        fit(samples, "samples.json")


def test_non_converging_fit_is_an_input_error(monkeypatch):
    class Failed:
        status, x, cost, nfev, message = -1, np.array([1.0, 1.0]), 1.0, 2000, "improper input parameters"

    monkeypatch.setattr(ct, "least_squares", lambda *a, **k: Failed())
    with pytest.raises(InputError, match="compute: the fit did not converge: improper input parameters"):
        fit(synthetic_samples(DEFAULT_PARAMETERS, R, seed=0), "samples.json")


def test_fitted_denominators_stay_positive_over_the_sampled_range():
    # compute samples that would pull a free linear fit through zero near the top of the range
    samples = synthetic_samples(DEFAULT_PARAMETERS, R, seed=0)
    samples = [s for s in samples if s.kind != "compute"] + [
        Sample("compute", r, 1000.0, t) for r, t in [(128, 1000.0), (256, 1100.0), (512, 1300.0), (4096, 1e9)]
    ]
    result = fit(samples, "x")
    assert ct.denominator(result.parameters, "compute", np.array(R)).min() > 0


def test_defaults_are_monotone_and_positive_up_to_8192_threads():
    p = DEFAULT_PARAMETERS
    assert set(p) == set(PARAMETER_NAMES)
    assert check_parameters(p, max_threads=8192) == []
    r = np.arange(1, 8193)
    assert np.all(p["alpha1"] - p["alpha2"] * r > 0)
    compute = predict_us(p, "compute", 1000.0, r)
    assert np.all(np.diff(compute) > 0)  # more threads, slower computation
    assert compute[0] == pytest.approx(1000.0, rel=1e-3)  # b is the time without overlap
    assert 1.10 < compute[4095] / 1000.0 < 1.20  # the stated ~15% at 4096
    for kind in ("overlapped_comm", "exposed_comm"):
        comm = predict_us(p, kind, 1e8, r)
        assert np.all(np.diff(comm) < 0)  # more threads, faster communication
        assert comm[4095] / comm[8191] < 1.01  # saturated
    # overlapped communication is never faster than exposed communication
    assert np.all(predict_us(p, "overlapped_comm", 1e8, r) >= predict_us(p, "exposed_comm", 1e8, r))
    # 10 GB/s asymptotic bus bandwidth for exposed communication: 1e8 bytes in ~10 ms
    assert predict_us(p, "exposed_comm", 1e8, 8192) == pytest.approx(1e4, rel=1e-3)


def test_paper_v100_point_is_38_percent_at_2048_and_valid_only_below_7437_threads():
    p = PAPER_V100_BERT_PARAMETERS
    assert predict_us(p, "compute", 25_700.0, 2048) / 25_700.0 == pytest.approx(1.38)
    assert check_parameters(p, max_threads=4096) == []
    assert any("compute: denominator <= 0" in msg for msg in check_parameters(p, max_threads=8192))


def test_check_parameters_reports_bad_sets():
    assert check_parameters({"alpha1": 1.0}) and "missing" in check_parameters({"alpha1": 1.0})[0]
    wrong = {**DEFAULT_PARAMETERS, "alpha2": -1e-5, "q_gamma2": -5e3}
    problems = check_parameters(wrong)
    assert any("compute: gets faster" in p for p in problems)
    assert any("exposed_comm: gets slower" in p for p in problems)


def test_sample_document_round_trip():
    samples = synthetic_samples(DEFAULT_PARAMETERS, R, seed=3, noise=0.01)
    samples[-1] = Sample("exposed_comm", 512, 1e6, 200.0, 12.5)
    doc = samples_document(samples, meta={"gpu": "synthetic"})
    assert doc["format"] == "mlopt.contention-samples" and doc["schema_version"] == "1.0"
    back = parse_samples(parse_document(canonical_json(doc), "s.json"), "s.json")
    assert len(back) == len(samples)
    for a, b in zip(samples, back):
        assert (a.kind, a.threads, a.startup_us) == (b.kind, b.threads, b.startup_us)
        assert a.base == pytest.approx(b.base, rel=1e-11) and a.measured_us == pytest.approx(b.measured_us, rel=1e-11)
    compute_row = doc["samples"][0]
    assert set(compute_row) == {"kind", "threads", "b_us", "measured_us"}
    assert set(doc["samples"][-1]) == {"kind", "threads", "c_hat_bytes", "measured_us", "startup_us"}


def _doc(*rows):
    return {"format": "mlopt.contention-samples", "schema_version": "1.0", "samples": list(rows)}


@pytest.mark.parametrize("doc, field, text", [
    ({"format": "mlopt.trace", "schema_version": "1.0"}, "$.format", "expected 'mlopt.contention-samples'"),
    ({**_doc(), "schema_version": "2.0"}, "$.schema_version", "upgrade"),
    ({**_doc(), "extra": 1}, "$", "unknown field(s): extra"),
    ({"format": "mlopt.contention-samples", "schema_version": "1.0"}, "$.samples", "missing"),
    (_doc({"kind": "gpu", "threads": 1, "b_us": 1.0, "measured_us": 1.0}), "$.samples[0].kind", "not one of"),
    (_doc({"kind": "compute", "threads": 1, "measured_us": 1.0}), "$.samples[0].b_us", "missing"),
    (_doc({"kind": "compute", "threads": 1, "c_hat_bytes": 1.0, "b_us": 1.0, "measured_us": 1.0}),
     "$.samples[0]", "unknown field(s) for kind 'compute': c_hat_bytes"),
    (_doc({"kind": "overlapped_comm", "threads": 0, "c_hat_bytes": 1.0, "measured_us": 1.0}),
     "$.samples[0].threads", "integer >= 1"),
    (_doc({"kind": "compute", "threads": 1.5, "b_us": 1.0, "measured_us": 1.0}), "$.samples[0].threads", "integer"),
    (_doc({"kind": "compute", "threads": 1, "b_us": -1.0, "measured_us": 1.0}), "$.samples[0].b_us", "> 0"),
    (_doc({"kind": "exposed_comm", "threads": 1, "c_hat_bytes": 1.0, "measured_us": 1.0, "startup_us": 2.0}),
     "$.samples[0].startup_us", "not below measured_us"),
])
def test_bad_sample_documents(doc, field, text):
    with pytest.raises(InputError) as info:
        parse_samples(doc, "s.json")
    assert info.value.field == field
    assert text in info.value.message


def test_load_samples_reads_a_file(tmp_path):
    from mlopt.formats.io import write_json

    path = tmp_path / "samples.json"
    write_json(path, samples_document(synthetic_samples(OTHER, R, seed=1)))
    result = fit(ct.load_samples(str(path)), str(path))
    assert _rel(result.parameters["gamma1"], OTHER["gamma1"]) < 1e-3


def test_synthetic_samples_are_deterministic_and_cover_every_kind():
    a = synthetic_samples(DEFAULT_PARAMETERS, R, seed=5, noise=0.02)
    b = synthetic_samples(DEFAULT_PARAMETERS, R, seed=5, noise=0.02)
    assert a == b
    assert {s.kind for s in a} == set(KINDS)
    with pytest.raises(ValueError):
        synthetic_samples(PAPER_V100_BERT_PARAMETERS, [8192], seed=0)
