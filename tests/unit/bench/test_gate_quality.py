"""Pure helpers of bench/gate_quality.py: the calibration loader, the scenario generators' planted effects,
the Kayenta judge's classification and the competitors' counting rules. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlm_testing.benches import load_bench

ROOT = Path(__file__).resolve().parents[3]


gq = load_bench("gate_quality")


def _window(loop: float, pi: float, end: float, i: int) -> dict:
    rb = 1.0 - pi - 0.1
    return {
        "id": i, "tp_rank": 0, "start": end - 5, "end": end, "samples": 5000, "loop_mean_seconds": loop,
        "loop_p95_seconds": loop * 1.6, "iterations": int(5 / loop),
        "stage_shares": {"recv_requests": 0.03, "process_input_requests": pi, "get_next_batch_to_run": 0.03,
                         "run_batch": rb, "process_batch_result": 0.04, "idle": 0.0, "other": 0.0},
        "function_shares": {"process_input_requests": pi, "hash_feature": 0.05, "reconstruct": pi - 0.06,
                            "run_batch": rb, "event_loop_overlap": 1.0},
        "self_shares": {"process_input_requests": 0.0, "hash_feature": 0.05, "reconstruct": pi - 0.06,
                        "run_batch": rb, "event_loop_overlap": 0.0},
        "stale": False, "error": None, "ttft_seconds": loop * 3, "itl_seconds": loop, "throughput": 1000.0,
    }


@pytest.fixture
def noise_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    raw = {
        "cache_off": [_window(0.026 * float(np.exp(rng.normal(0, 0.03))), 0.24 + rng.normal(0, 0.01), 100 + 6 * i, i)
                      for i in range(20)],
        "cache_on": [_window(0.020 * float(np.exp(rng.normal(0, 0.03))), 0.08 + rng.normal(0, 0.01), 100 + 6 * i, i)
                     for i in range(20)],
    }
    path = tmp_path / "gate_noise.json"
    path.with_name("gate_noise_windows.json").write_text(json.dumps(raw))
    path.write_text(json.dumps({"recorded": {"command": "test"}}))
    gq.rederive_noise(path)
    return path


def test_derive_and_load_noise(noise_file: Path):
    cal = json.loads(noise_file.read_text())
    assert cal["recorded"] == {"command": "test"}  # kept across a re-derivation
    off = cal["phases"]["cache_off"]
    assert off["windows"] == 20 and len(off["loop_log_residuals"]) == 20
    assert abs(sum(off["loop_log_residuals"])) < 1e-3  # residuals around the pod's own mean
    assert 0.01 < off["loop_log_sd"] < 0.06
    noise = gq.load_noise(noise_file)
    assert noise.source.endswith(":cache_off")  # the quieter stable phase (the only one here)
    assert len(noise.loop_resid) == 20
    assert noise.loop_s == pytest.approx(0.026, rel=0.05)
    # The IPC cache removes the input stage's time: (0.24 * 26 ms - 0.08 * 20 ms) / 26 ms, about 18%.
    # The IPC cache removes input time; the other stages keep theirs: 1 - (1 - 0.24) / (1 - 0.08).
    assert noise.input_speedup == pytest.approx(1 - 0.76 / 0.92, abs=0.02)
    assert noise.ttft_over_loop == pytest.approx(3.0, rel=1e-6)
    assert noise.share_conc > 100


def test_derive_noise_refuses_too_few_windows():
    with pytest.raises(ValueError):
        gq.derive_noise([{"label": "x", "windows": [_window(0.02, 0.2, 10, 0)]}])


def _sim(noise_file: Path, key: str, mode: str = "Stable", seed: int = 1):
    noise = gq.load_noise(noise_file)
    sc = next(s for s in gq.scenarios() if s.key == key)
    cad = gq.Cadence()
    return gq.simulate(np.random.default_rng(seed), noise, sc, cad, mode), noise, sc, cad


def _mean_log(ws, key="loop_mean_seconds"):
    return float(np.mean(np.log([w[key] for w in ws])))


def test_cadence_and_shape_at_the_defaults(noise_file: Path):
    (base, can, dash, ref), noise, _sc, cad = _sim(noise_file, "aa0")
    assert ref == []  # Stable: the baseline is the stable pods themselves
    assert gq.cadence_from_api() == cad  # the API's defaults: 5 s every 15 s, 1 m / 30 m / 5 m, one pod
    assert len({w["pod"] for w in base}) == 3 and len({w["pod"] for w in can}) == 1
    per_pod = [w for w in can if w["pod"] == "canary-0"]
    assert len(per_pod) in (127, 128)  # (30 min + 2 analysis intervals, for the gate's last look) / 15 s
    assert np.allclose(np.diff([w["end"] for w in per_pod]), 15.0)
    w = can[0]
    assert set(w["function_shares"]) == set(w["self_shares"]) == set(w["exported_functions"])
    assert set(gq.WATCH) <= set(w["exported_functions"])
    assert sum(w["stage_shares"].values()) == pytest.approx(1.0)
    fs = w["function_shares"]  # inclusive: a caller holds its callees
    assert fs["process_input_requests"] >= fs["hash_feature"] + fs["reconstruct_on_target_device"] - 1e-9
    # Window.from_sidecar takes them as they are.
    gw = gq.gate.Window.from_sidecar("canary", w["pod"], w)
    assert gw.loop_mean_seconds == w["loop_mean_seconds"] and gw.iterations == w["iterations"]
    assert dash == pytest.approx(noise.loop_s)  # pod spread 0


def test_exported_set_churns(noise_file: Path):
    (base, _can, _d, _r), *_ = _sim(noise_file, "aa1")
    sets = {frozenset(w["exported_functions"]) for w in base}
    assert len(sets) > 3  # the top-N cut moves from window to window


def test_planted_loop_regression(noise_file: Path):
    (base, can, _d, _r), _noise, sc, _cad = _sim(noise_file, "up10")
    (base0, can0, _d0, _r0), *_ = _sim(noise_file, "aa1")  # same seed: same noise, no effect
    assert _mean_log(can) - _mean_log(can0) == pytest.approx(np.log(1.10), abs=0.002)
    assert _mean_log(base) == pytest.approx(_mean_log(base0))
    # The time went into reconstruct_on_target_device: its inclusive share r became (r + 0.10) / 1.10.
    f = sc.truth_function
    r = np.mean([w["function_shares"][f] for w in can0])
    assert np.mean([w["function_shares"][f] for w in can]) == pytest.approx((r + 0.10) / 1.10, abs=0.01)


def test_faster_and_input_speedup(noise_file: Path):
    (_b, can, _d, _r), noise, _sc, _cad = _sim(noise_file, "down10")
    (_b0, can0, _d0, _r0), *_ = _sim(noise_file, "aa1")
    assert _mean_log(can) - _mean_log(can0) == pytest.approx(np.log(0.90), abs=0.002)
    (_b, ipc, _d, _r), *_ = _sim(noise_file, "ipc")
    assert _mean_log(ipc) - _mean_log(can0) == pytest.approx(np.log(1 - noise.input_speedup), abs=0.005)
    # Only the input stage's time shrinks; run_batch's time per iteration stays, so its SHARE grows.
    def stage_time(ws, s):
        return np.mean([w["stage_shares"][s] * w["loop_mean_seconds"] for w in ws])

    assert stage_time(ipc, "run_batch") == pytest.approx(stage_time(can0, "run_batch"), rel=0.03)
    assert np.mean([w["stage_shares"]["run_batch"] for w in ipc]) > np.mean(
        [w["stage_shares"]["run_batch"] for w in can0]) + 0.05


def test_wrapper_scenario(noise_file: Path):
    (base, can, _d, _r), *_ = _sim(noise_file, "wrapper")
    for ws in (base, can):
        assert np.mean([w["function_shares"][gq.WRAPPER] for w in ws if gq.WRAPPER in w["function_shares"]]) > 0.99
    grow = np.mean([w["function_shares"]["hash_feature"] for w in can]) - np.mean(
        [w["function_shares"]["hash_feature"] for w in base])
    assert grow == pytest.approx(0.05 / 1.05, abs=0.01)


def test_ttft_and_drift(noise_file: Path):
    (_b, can, _d, _r), *_ = _sim(noise_file, "ttft")
    (_b0, can0, _d0, _r0), *_ = _sim(noise_file, "aa1")
    assert _mean_log(can, "ttft_seconds") - _mean_log(can0, "ttft_seconds") == pytest.approx(np.log(1.2), abs=0.01)
    assert _mean_log(can) == pytest.approx(_mean_log(can0))
    (base, can, _d, _r), *_ = _sim(noise_file, "drift")
    late = [w for w in base if w["end"] > gq.T0 + 1500]
    early = [w for w in base if w["end"] < gq.T0 + 300]
    assert _mean_log(late) - _mean_log(early) > 0.3  # +2%/min over ~25 min, both revisions


def test_fresh_mode_has_one_baseline_pod(noise_file: Path):
    (base, can, _d, ref), *_ = _sim(noise_file, "aa2", mode="Fresh")
    assert {w["pod"] for w in base} == {"fresh-0"} and {w["pod"] for w in can} == {"canary-0"}
    assert {w["pod"] for w in ref} == {"stable-0", "stable-1", "stable-2"}  # for the gate's spread estimate
    (_base_s, can_s, _d, _r), *_ = _sim(noise_file, "aa2", mode="Stable")
    assert [w["loop_mean_seconds"] for w in can] != [w["loop_mean_seconds"] for w in can_s]  # own streams


def test_mann_whitney_hl():
    x = np.arange(10, dtype=float) + 5.0
    y = np.arange(10, dtype=float)
    low, est, ratio = gq.mann_whitney_hl(x, y, 0.98)
    assert est == 5.0  # Hodges-Lehmann shift
    assert 0 < low < 5.0
    assert ratio == pytest.approx(x.mean() / y.mean())
    assert all(np.isnan(gq.mann_whitney_hl(x, np.array([]), 0.98)))


def test_kayenta_classification():
    # High only when the CI's lower bound clears 25% of |estimate| AND the mean ratio reaches the allowed increase.
    assert gq.kayenta_classify(0.8, 1.0, 1.10) == "High"
    assert gq.kayenta_classify(0.2, 1.0, 1.10) == "Pass"  # CI reaches into the tolerance band
    assert gq.kayenta_classify(-0.5, 1.0, 1.10) == "Pass"  # test does not reject
    assert gq.kayenta_classify(0.8, 1.0, 1.02, allowed_increase=1.03) == "Pass"  # effect below the allowance
    assert gq.kayenta_classify(-2.0, -1.0, 0.9) == "Pass"  # lower is better for an `increase` metric
    assert gq.kayenta_classify(float("nan"), 1.0, 1.0) == "Nodata"
    assert gq.kayenta_score(["Pass", "High", "Pass", "Pass"]) == 75.0
    assert gq.kayenta_score([]) == 0.0


def _series(ratio, cmax=None, kay=None, dashboard=1.0):
    ratio = np.asarray(ratio, float)
    cmax = np.asarray(cmax if cmax is not None else np.ones_like(ratio), float)
    kay = np.asarray(kay if kay is not None else np.tile([-1.0, 0.0, 1.0], (len(ratio), 1)), float)
    return gq.Series(ratio, cmax, kay, dashboard)


def test_flagger_argo_ome_counting():
    cad = gq.Cadence()
    bad, good = 1.2, 1.0
    # Flagger: failed checks do not advance; 5 failures roll back; 5 passes promote.
    assert gq.flagger(_series([bad, good, bad, good, bad, good, bad, bad] + [good] * 22), 1.05, cad) == ("Rollback", 8)
    assert gq.flagger(_series([bad, good, good, good, good, good] + [good] * 24), 1.05, cad) == ("Promote", 6)
    assert gq.flagger(_series([np.nan] * 30), 1.05, cad) == ("Rollback", 5)  # no data fails the check
    # Argo: count 5, failed once failures exceed failureLimit.
    assert gq.argo(_series([good, bad] + [good] * 28), 1.05, cad, 0) == ("Rollback", 2)
    assert gq.argo(_series([good, bad, bad] + [good] * 27), 1.05, cad, 2) == ("Promote", 5)
    assert gq.argo(_series([bad, bad, bad] + [good] * 27), 1.05, cad, 2) == ("Rollback", 3)
    # OME: worst canary window so far against the dashboard x (1 + over).
    s = _series([good] * 30, cmax=[1.0, 1.05, 1.2] + [1.2] * 27)
    assert gq.ome(s, 0.10, cad) == ("Rollback", 3)
    assert gq.ome(s, 0.25, cad) == ("Promote", 5)


def test_kayenta_rule():
    cad = gq.Cadence()
    high = [0.9, 1.0, 1.2]
    ok = [-0.1, 0.2, 1.0]
    assert gq.kayenta(_series([1.0] * 30, kay=[ok, ok, high] + [ok] * 27), 1.0, cad) == ("Rollback", 3)
    assert gq.kayenta(_series([1.0] * 30, kay=[ok] * 30), 1.0, cad) == ("Promote", 5)
    assert gq.kayenta(_series([1.0] * 30, kay=[ok, ok, high] + [ok] * 27), 1.25, cad) == ("Promote", 5)


def test_tune_picks_best_detection_within_target():
    name = next(iter(gq.COMPETITORS))
    grid = gq.COMPETITORS[name][1]
    fr = [0.5 - 0.05 * j for j in range(len(grid))]
    dr = [1.0 - 0.05 * j for j in range(len(grid))]

    def rows(vals):
        return {n: [{"rollback": v, "promote": 1 - v, "median_min": 5.0} for v in vals] for n in gq.COMPETITORS}

    res = {"Stable": {"aa1": {"gate": {"rollback": 0.2}, "competitors": rows(fr)},
                      "up5": {"gate": {"rollback": 1.0}, "competitors": rows(dr)}}}
    c = gq.tune(res, target=0.2)[name]
    assert c["meets_target"] and c["fr"] <= 0.2 + 1e-12 and c["index"] == 6  # first at or below 20%


def _frontend_window(i: int, busy: float, rate: float) -> dict:
    return {"result": "ok", "request_rate": rate, "end": 100.0 + 6 * i,
            "frontend": {"roles": {"mm_processor": {"busy_share": busy}, "tokenizer_manager": {"busy_share": 0.02},
                                   "tokenizer_worker": None}}}


def test_derive_frontend_scales_each_window_to_the_median_rate():
    # Work per request constant (busy proportional to the rate): scaled to the median rate, no spread is left.
    ws = [_frontend_window(i, 0.1 * r / 20, r) for i, r in enumerate([18, 20, 22, 19, 21, 20])]
    ws.append({"result": "error", "request_rate": 20})  # a failed window is left out
    fe = gq.derive_frontend(ws)
    assert fe["windows"] == 6 and set(fe["roles"]) == {"mm_processor", "tokenizer_manager"}  # a None role: absent
    mm = fe["roles"]["mm_processor"]
    assert mm["scaled_mean"] == pytest.approx(0.1) and mm["scaled_sd"] == pytest.approx(0.0, abs=1e-12)
    assert fe["request_rate"]["median"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="usable windows"):
        gq.derive_frontend(ws[:3])


@pytest.fixture
def frontend_noise_file(noise_file: Path, tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    cal = json.loads(noise_file.read_text())
    cal["frontend"] = gq.derive_frontend([_frontend_window(i, 0.1 + rng.normal(0, 0.01), 20.0 + rng.normal(0, 1))
                                          for i in range(30)])
    path = tmp_path / "fe" / noise_file.name
    path.parent.mkdir()
    path.write_text(json.dumps(cal))
    path.with_name("gate_noise_windows.json").write_text(noise_file.with_name("gate_noise_windows.json").read_text())
    gq.rederive_noise(path)  # a re-derivation of the scheduler phases keeps the front end
    assert "frontend" in json.loads(path.read_text())
    return path


def _busy_at_ref(ws: list[dict], noise, role: str = "mm_processor") -> float:
    return float(np.mean([w["frontend"]["roles"][role]["busy_share"] * noise.request_rate / w["request_rate"]
                          for w in ws]))


def test_frontend_scenarios(noise_file: Path, frontend_noise_file: Path):
    (base, can, _d, _r), noise, _sc, _cad = _sim(frontend_noise_file, "aa1fe")
    assert all("frontend" in w and w["request_rate"] > 0 for w in (*base, *can))
    assert _busy_at_ref(can, noise) == pytest.approx(0.1, abs=0.01)
    (_b, up, _d, _r), *_ = _sim(frontend_noise_file, "fe15")
    assert _busy_at_ref(up, noise) - _busy_at_ref(can, noise) == pytest.approx(0.15, abs=0.002)
    assert _busy_at_ref(up, noise, "tokenizer_manager") == pytest.approx(_busy_at_ref(can, noise, "tokenizer_manager"))
    assert _mean_log(up) == pytest.approx(_mean_log(can))  # the scheduler loop unchanged
    (_b, fast, _d, _r), *_ = _sim(frontend_noise_file, "fefast")
    assert _busy_at_ref(fast, noise) == pytest.approx(0.5 * _busy_at_ref(can, noise), abs=0.01)
    # The gate reads them: the front-end family is compared and the +15 points found.
    gw = [gq.gate.Window.from_sidecar(w["revision"], w["pod"], w) for w in up[:20]]
    assert gw[0].frontend["mm_processor"].busy_share > 0.1 and gw[0].request_rate == up[0]["request_rate"]
    # Without a recorded front end, a front-end scenario says how to record one.
    with pytest.raises(ValueError, match="record-frontend-noise"):
        _sim(noise_file, "aa1fe")


def _recorded_copy(tmp_path: Path) -> Path:
    """The shipped calibration and its raw windows, copied (the run may write the calibration again)."""
    for name in ("gate_noise.json", "gate_noise_windows.json"):
        (tmp_path / name).write_text((gq.NOISE_FILE.parent / name).read_text())
    return tmp_path / "gate_noise.json"


def test_rederive_noise_alone_writes_the_same_calibration_shape(tmp_path: Path):
    noise = _recorded_copy(tmp_path)
    before = json.loads(noise.read_text())
    assert gq.main(["--rederive-noise", "--noise", str(noise), "--trials", "0"]) == 0
    after = json.loads(noise.read_text())
    assert set(after["phases"]) == set(before["phases"]) and "cache_off" in after["phases"]
    assert after["phases"]["cache_off"]["loop_mean_seconds"] == pytest.approx(before["phases"]["cache_off"]["loop_mean_seconds"])


@pytest.mark.slow  # about 90 s on the shared 2-core machine: one trial is a whole simulated rollout per scenario
def test_a_tiny_run_through_main_writes_its_table_and_json(tmp_path: Path, capsys):
    # Every flag that changes the path taken: raw residuals, a named phase, scaled noise, more canary pods.
    noise = _recorded_copy(tmp_path)
    out, js = tmp_path / "results", tmp_path / "gate_quality.json"
    assert gq.main(["--trials", "1", "--jobs", "1", "--only", "aa1", "--noise", str(noise), "--raw-residuals",
                    "--phase", "cache_off", "--noise-scale", "1.5", "--canary-pods", "2", "--out", str(out),
                    "--json", str(js)]) == 0
    md = (out / "gate_quality.md").read_text()
    assert md in capsys.readouterr().out
    r = json.loads(js.read_text())
    assert r["meta"]["trials"] == 1 and "--canary-pods 2" in r["meta"]["command"] and "Fresh 2" in r["meta"]["config"]
    assert set(r["results"]) == set(gq.MODES)  # each baseline mode ran aa1 and up5 (always run) and no other
    for mode, by_key in r["results"].items():
        assert set(by_key) == {"aa1", "up5"}, (mode, set(by_key))
