"""The real NVML path without a GPU: pynvml and NvmlBackend over a stand-in libnvidia-ml.so.1.

pynvml resolves every NVML function by name in ``libnvidia-ml.so.1`` through ctypes, so a
small C library exporting the same symbols (tests/nvml_standin/nvml_standin.c, built here
with gcc) exercises pynvml's real structs, return codes and error classes, and rankwatch's
real ``NvmlBackend`` and sampler above them. Each scenario runs in its own process
(tests/nvml_standin/probe.py, or the real CLI) with ``LD_LIBRARY_PATH`` set, since the
loader reads it at process start. These tests fail when ``NvmlBackend`` breaks;
``FakeBackend`` (tests/test_gpu.py) stays for the detector logic.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from faultlib import free_port, stop_processes

HERE = Path(__file__).parent / "nvml_standin"
pytestmark = pytest.mark.tool

HEALTHY = """\
count 2
driver 550.54.15
gpu0.util 87
gpu0.mem_util 41
gpu0.mem_total 85520809984
gpu0.mem_used 42949672960
gpu0.mem_reserved 553648128
gpu0.temp 64
gpu0.power_mw 612500
gpu0.power_limit_mw 700000
gpu0.energy_mj 3600000000
gpu0.sm_clock 1980
gpu0.mem_clock 2619
gpu0.throttle 0x4
gpu0.pcie_tx_kbs 1000
gpu0.pcie_rx_kbs 2000
gpu0.violation0_ns 2500000000
gpu0.violation1_ns 0
gpu0.field82 71
gpu0.field91 2
gpu0.field138.0 100
gpu0.field138.1 300
gpu0.field139.0 50
gpu0.field139.1 50
gpu0.field38 0
gpu0.field45 0
gpu0.field52 7
gpu0.field59 0
gpu0.gpm 1
gpu0.gpm2 82.0
gpu0.gpm3 41.0
gpu0.gpm5 55.5
gpu0.gpm10 38.0
gpu1.util 3
gpu1.name NVIDIA A100-SXM4-80GB
gpu1.cc 8.0
"""


def _build(out: Path, *defines: str) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("gcc not installed (apt-get install gcc): the NVML stand-in cannot be built")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", *defines, "-Wl,-soname,libnvidia-ml.so.1",
         "-o", str(out / "libnvidia-ml.so.1"), str(HERE / "nvml_standin.c"), "-lpthread"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def standin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvml")
    return {"full": _build(root / "full"), "minimal": _build(root / "minimal", "-DSTANDIN_MINIMAL")}


def _env(lib: Path, state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(lib)
    env["RANKWATCH_NVML_STANDIN"] = str(state)
    return env


def probe(
    lib: Path,
    tmp: Path,
    steps: list[dict[str, Any]],
    *,
    state: str = HEALTHY,
    timeout: float = 5.0,
    calls: Path | None = None,
) -> dict:
    """``calls``: a folder where the stand-in writes the probe's NVML call counts."""
    path = tmp / "nvml-state.txt"
    path.write_text(state)
    env = _env(lib, path)
    if calls is not None:
        env["RANKWATCH_NVML_STANDIN_CALLS"] = str(calls)
    res = subprocess.run(
        [sys.executable, str(HERE / "probe.py"), str(path), json.dumps(steps), str(timeout)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def series(metrics: str, metric: str, /, **labels: str) -> list[float]:
    out = []
    for line in metrics.splitlines():
        if not line.startswith(metric + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def test_healthy_readings_reach_samples_and_metrics_in_base_units(
    standin: dict[str, Path], tmp_path: Path
) -> None:
    doc = probe(standin["full"], tmp_path, [{"sample": 2}])
    assert doc["started"], doc["reason"]
    assert doc["devices"]["0"]["driver_version"] == "550.54.15"
    assert doc["devices"]["0"]["compute_capability"] == "9.0"
    assert doc["devices"]["1"]["compute_capability"] == "8.0"
    first, second = doc["rounds"]
    assert first["up"] and second["up"] and second["errors"] == 0
    g0, g1 = second["samples"]
    assert g0["uuid"].startswith("GPU-") and g0["name"] == "NVIDIA H100 80GB HBM3"
    assert g0["pci_bus_id"] == "00000000:18:00.0"
    assert g0["utilization"] == pytest.approx(0.87) and g0["memory_utilization"] == pytest.approx(0.41)
    # memory_used counts as v1 does (allocated plus reserved), read from the one v2 record.
    assert g0["memory_used"] == 42949672960 + 553648128 and g0["memory_total"] == 85520809984
    assert g0["memory_reserved"] == 553648128
    assert g0["memory_free"] == 85520809984 - 553648128 - 42949672960
    assert g0["temperature"] == 64.0 and g0["memory_temperature"] == 71.0
    assert g0["power"] == pytest.approx(612.5) and g0["power_limit"] == 700.0
    assert g0["sm_clock"] == 1.98e9 and g0["memory_clock"] == 2.619e9
    assert g0["throttle"]["sw_power_cap"] is True and g0["throttle"]["hw_slowdown"] is False
    assert g0["energy"] == 3.6e6  # mJ -> J
    assert (g0["pcie_tx"], g0["pcie_rx"]) == (1000 * 1024.0, 2000 * 1024.0)
    assert g0["violations"] == {"power": 2.5, "thermal": 0.0}  # ns -> s; unsupported policies left out
    assert (g0["nvlink_tx"], g0["nvlink_rx"]) == (400 * 1024.0, 100 * 1024.0)  # summed over 2 links
    assert g0["nvlink_errors"] == {"crc_flit": 0, "crc_data": 0, "replay": 7, "recovery": 0}
    # GPM needs two samples: nothing on the first, ratios on the second.
    assert first["samples"][0]["sm_active"] is None
    assert g0["sm_active"] == pytest.approx(0.82) and g0["tensor_active"] == pytest.approx(0.555)
    assert g0["sm_occupancy"] == pytest.approx(0.41) and g0["dram_active"] == pytest.approx(0.38)
    # GPU 1 has no NVLink, no GPM, no violation counters: not read, never zero.
    assert g1["utilization"] == pytest.approx(0.03)
    assert g1["nvlink_tx"] is None and g1["sm_active"] is None and g1["violations"] is None

    m = doc["metrics"]
    assert series(m, "rankwatch_gpu_utilization_ratio", gpu="0") == [0.87]
    assert series(m, "rankwatch_gpu_energy_joules_total", gpu="0") == [3.6e6]
    assert series(m, "rankwatch_gpu_clock_event_seconds_total", gpu="0", reason="power") == [2.5]
    assert series(m, "rankwatch_gpu_nvlink_data_bytes_total", gpu="0", direction="tx") == [409600.0]
    assert series(m, "rankwatch_gpu_nvlink_errors_total", gpu="0", type="replay") == [7.0]
    assert series(m, "rankwatch_gpu_pcie_throughput_bytes_per_second", gpu="0", direction="rx") == [2048000.0]
    assert series(m, "rankwatch_gpu_tensor_active_ratio", gpu="0") == [0.555]
    assert series(m, "rankwatch_gpu_memory_reserved_bytes", gpu="0") == [553648128.0]
    assert series(m, "rankwatch_gpu_info", gpu="1", name="NVIDIA A100-SXM4-80GB", compute_capability="8.0",
                  driver_version="550.54.15", attribution="unattributed") == [1.0]  # fmt: skip
    assert series(m, "rankwatch_gpu_sm_active_ratio", gpu="1") == []
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    res = subprocess.run([promtool, "check", "metrics"], input=m, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_nvlink_throughput_is_read_summed_and_link_by_link_where_the_driver_does_not_sum(
    standin: dict[str, Path], tmp_path: Path
) -> None:
    summed = probe(standin["full"], tmp_path, [{"sample": 3}])["rounds"]
    no_sum = HEALTHY + "gpu0.no_link_sum 1\n"
    links = probe(standin["full"], tmp_path, [{"sample": 3}], state=no_sum)["rounds"]
    for rounds in (summed, links):
        for r in rounds:
            g0 = r["samples"][0]
            assert (g0["nvlink_tx"], g0["nvlink_rx"]) == (400 * 1024.0, 100 * 1024.0)
            assert g0["nvlink_errors"] == {"crc_flit": 0, "crc_data": 0, "replay": 7, "recovery": 0}


def test_functions_an_old_driver_lacks_are_not_supported_once_never_errors(
    standin: dict[str, Path], tmp_path: Path
) -> None:
    doc = probe(standin["minimal"], tmp_path, [{"sample": 3}])
    assert doc["started"], doc["reason"]
    for r in doc["rounds"]:
        assert r["up"] and r["errors"] == 0
        g0 = r["samples"][0]
        assert g0["utilization"] == pytest.approx(0.87) and g0["temperature"] == 64.0
        assert g0["energy"] is None and g0["pcie_tx"] is None and g0["nvlink_tx"] is None
        assert g0["violations"] is None and g0["sm_active"] is None
        assert g0["memory_free"] == 85520809984 - 42949672960 and g0["memory_reserved"] is None  # v1 only
        assert g0["throttle"] is not None  # the pre-535 throttle-reason call stands in
    log = doc["log"]
    for name in ("energy", "pcie_throughput", "violations", "nvlink", "gpm"):
        said = [x for x in log if f": {name} not supported" in x]
        assert len(said) == 1, (name, log)  # once, not per sample or per GPU
        assert said[0].startswith("INFO")
    assert not [x for x in log if x.startswith(("WARNING", "ERROR"))], log
    assert doc["devices"]["0"]["compute_capability"] is None


def _call_counts(folder: Path) -> dict[str, int]:
    (written,) = folder.glob("calls-*.txt")  # the one probe process, its counts at exit
    return {fn: int(n) for fn, n in (line.split() for line in written.read_text().splitlines())}


@pytest.mark.parametrize("build", ["full", "minimal"])
def test_memory_and_the_field_values_are_one_nvml_call_a_gpu_and_round(
    standin: dict[str, Path], tmp_path: Path, build: str
) -> None:
    """Used, total, free and reserved come from one v2 record per GPU and round; a driver
    without v2 (r510-) is read through v1 once per round, its v2 never asked again. The
    readings themselves are checked in the tests above, over the same calls."""
    calls = tmp_path / "calls"
    calls.mkdir()
    rounds = probe(standin[build], tmp_path, [{"sample": 3}], calls=calls)["rounds"]
    assert all(r["samples"][0]["memory_free"] is not None for r in rounds)
    n = _call_counts(calls)
    v1, v2 = n.get("nvmlDeviceGetMemoryInfo", 0), n.get("nvmlDeviceGetMemoryInfo_v2", 0)
    assert (v1, v2) == ((0, 2 * 3) if build == "full" else (2 * 3, 0))  # 2 GPUs, 3 rounds
    if build == "full":
        # GPU 0's NVLink counters ride in its memory-temperature field request once they are
        # known to be read summed: 3 requests in round 1 (with the link count), then 1 a round;
        # GPU 1 (no HBM sensor, no NVLink) is asked twice in round 1, then never.
        assert n["nvmlDeviceGetFieldValues"] == (3 + 1 + 1) + 2
        # Links that answer neither summed nor per link (the bench's GPUs): asked summed each
        # round, in the same request; one more request in round 1 for the per-link try.
        silent = "".join(line + "\n" for line in HEALTHY.splitlines() if ".field13" not in line)
        calls = tmp_path / "calls-silent"
        calls.mkdir()
        rounds = probe(standin[build], tmp_path, [{"sample": 3}], state=silent, calls=calls)["rounds"]
        assert all((r["samples"][0]["nvlink_tx"], r["samples"][0]["nvlink_rx"]) == (0.0, 0.0) for r in rounds)
        assert _call_counts(calls)["nvmlDeviceGetFieldValues"] == (4 + 1 + 1) + 2


def test_not_supported_code_skips_that_reading_only(standin: dict[str, Path], tmp_path: Path) -> None:
    state = HEALTHY + "ret.nvmlDeviceGetTemperature 3\ngpu1.ret.nvmlDeviceGetPowerUsage 3\n"
    doc = probe(standin["full"], tmp_path, [{"sample": 2}], state=state)
    g0, g1 = doc["rounds"][-1]["samples"]
    assert g0["temperature"] is None and g1["temperature"] is None
    assert g0["power"] == pytest.approx(612.5) and g1["power"] is None
    assert doc["rounds"][-1]["errors"] == 0 and doc["rounds"][-1]["up"]
    assert "rankwatch_gpu_temperature_celsius{" not in doc["metrics"]


def test_gpu_is_lost_then_xid_through_the_event_set(standin: dict[str, Path], tmp_path: Path) -> None:
    doc = probe(
        standin["full"],
        tmp_path,
        [{"sample": 1}, {"set": {"xid.1": "0:79", "gpu1.lost": 1}, "sample": 1}, {"sample": 1}],
    )
    before, during, after = doc["rounds"]
    assert not before["samples"][1]["lost"]
    g0, g1 = during["samples"]
    assert g1["lost"] and "GPU is lost" in g1["lost_reason"]
    assert g0["xids"] == [79] and g0["xid_counts"] == {"79": 1}
    assert after["samples"][0]["xids"] == []  # delivered once
    assert series(doc["metrics"], "rankwatch_gpu_xid_errors_total", gpu="0", xid="79") == [1.0]
    assert series(doc["metrics"], "rankwatch_gpu_lost", gpu="1") == [1.0]
    assert any("GPU 1 is lost" in x for x in doc["log"])


def test_a_hung_call_skips_samples_then_recovers(standin: dict[str, Path], tmp_path: Path) -> None:
    doc = probe(
        standin["full"],
        tmp_path,
        [
            {"sample": 1},
            {"set": {"hang.nvmlDeviceGetPowerUsage": 1}, "sample": 2},
            {"set": {"hang.nvmlDeviceGetPowerUsage": None}},
            {"sample": 1},
        ],
        timeout=0.5,
    )
    ok, hung, skipped, *rest = doc["rounds"]
    assert ok["up"] and ok["samples"]
    assert hung["samples"] == [] and hung["hung"] and not hung["up"]
    assert skipped["samples"] == [] and skipped["hung"]  # no second thread piled onto the hung one
    assert any("did not answer within 0.5s" in x for x in doc["log"])
    # The hung call returns once released; a sample a moment later reads again.
    last = rest[-1]
    assert last["samples"] or last["hung"]


def test_nvml_vanishing_mid_run_is_one_line_and_comes_back(standin: dict[str, Path], tmp_path: Path) -> None:
    doc = probe(
        standin["full"],
        tmp_path,
        [{"sample": 1}, {"set": {"vanish": 9}, "sample": 3}, {"set": {"vanish": None}, "sample": 1}],
    )
    r = doc["rounds"]
    assert r[0]["up"]
    assert [x["up"] for x in r[1:4]] == [False, False, False]
    assert r[4]["up"] and r[4]["samples"][0]["utilization"] == pytest.approx(0.87)
    down = [x for x in doc["log"] if "NVML fails every reading" in x]
    assert len(down) == 1 and "Driver Not Loaded" in down[0]


def test_init_failure_disables_gpu_metrics_with_one_line(standin: dict[str, Path], tmp_path: Path) -> None:
    doc = probe(standin["full"], tmp_path, [{"sample": 1}], state="init_ret 9\n")
    assert not doc["started"] and "Driver Not Loaded" in doc["reason"]
    assert doc["rounds"] == [{"samples": [], "up": False, "hung": False, "errors": 0}]
    assert series(doc["metrics"], "rankwatch_gpu_collector_up") == [0.0]


def test_gpus_tied_to_processes_through_nvmls_process_list(standin: dict[str, Path], tmp_path: Path) -> None:
    me = os.getpid()
    state = HEALTHY + f"gpu1.pids 1,{me}\n"
    doc = probe(standin["full"], tmp_path, [{"map": {"pids": [me]}, "sample": 1}], state=state)
    assert doc["mapped"] == [1]
    (g1,) = doc["rounds"][0]["samples"]
    assert g1["index"] == 1 and g1["attribution"] == "nvml_process"
    doc = probe(
        standin["full"],
        tmp_path,
        [{"map": {"pids": [me], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "sample": 1}],
    )
    assert doc["mapped"] == [0] and doc["rounds"][0]["samples"][0]["attribution"] == "cuda_visible_devices"
    doc = probe(standin["full"], tmp_path, [{"map": {"pids": [me]}, "sample": 1}])
    assert len(doc["rounds"][0]["samples"]) == 2
    assert {s["attribution"] for s in doc["rounds"][0]["samples"]} == {"unattributed"}
    assert [x for x in doc["log"] if "may belong to other jobs" in x and x.startswith("WARNING")]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_live_agent_exports_changing_readings(standin: dict[str, Path], tmp_path: Path) -> None:
    """`rankwatch run` over the stand-in: the GPU of the child (CUDA_VISIBLE_DEVICES) on /metrics,
    following the readings as the state file changes, and an Xid becoming a finding."""
    state = tmp_path / "nvml-state.txt"
    state.write_text(HEALTHY)
    port = free_port()
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: standin}}\n"
        f"gpu: {{interval: 200ms, xid_wait: 50ms}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}}}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f'server: {{listen: "127.0.0.1:{port}"}}\n'
    )
    env = _env(standin["full"], state)
    env["CUDA_VISIBLE_DEVICES"] = "1"
    jsonl = tmp_path / "findings.jsonl"
    child = "import time; print('step 1 loss 2.0', flush=True); time.sleep(60)"
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl", str(jsonl),
           "--", sys.executable, "-c", child]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:

        def wait_for(pred: Any, what: str, timeout: float = 30.0) -> str:
            deadline = time.monotonic() + timeout
            text = ""
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    text = _scrape(port)
                except OSError:
                    text = ""
                if pred(text):
                    return text
                time.sleep(0.1)
            raise AssertionError(f"{what} not seen; last scrape:\n{text}")

        text = wait_for(
            lambda t: series(t, "rankwatch_gpu_utilization_ratio", gpu="1") == [0.03], "GPU 1 utilisation"
        )
        assert series(text, "rankwatch_gpu_utilization_ratio", gpu="0") == []  # not the child's GPU
        assert series(text, "rankwatch_gpu_info", gpu="1", attribution="cuda_visible_devices") == [1.0]
        state.write_text(HEALTHY.replace("gpu1.util 3", "gpu1.util 64") + "xid.1 1:48\n")
        wait_for(lambda t: series(t, "rankwatch_gpu_utilization_ratio", gpu="1") == [0.64], "changed reading")
        wait_for(lambda t: series(t, "rankwatch_gpu_xid_errors_total", gpu="1", xid="48") == [1.0], "Xid 48")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = [json.loads(x) for x in jsonl.read_text().splitlines()] if jsonl.exists() else []
            if any(f["kind"] == "xid" for f in found):
                break
            time.sleep(0.1)
        xid = [f for f in found if f["kind"] == "xid"]
        assert xid and "48" in xid[0]["message"], found
    finally:
        stop_processes([proc])


def _real_nvml_test(
    standin: dict[str, Path], tmp_path: Path, *plugin: str
) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "nvml-state.txt"
    state.write_text(HEALTHY)
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args += [*plugin, str(Path(__file__).parent / "test_gpu_real_nvml.py")]
    env = {**_env(standin["full"], state), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def test_the_real_nvml_test_runs_on_nvml_and_fails_when_the_backend_breaks(
    standin: dict[str, Path], tmp_path: Path
) -> None:
    """Where NVML starts, tests/test_gpu_real_nvml.py must run, and a broken backend must fail it:
    it may skip only where NVML itself says there is no GPU."""
    ok = _real_nvml_test(standin, tmp_path)
    assert ok.returncode == 0 and "skipped" not in ok.stdout, ok.stdout + ok.stderr
    (tmp_path / "planted_nvml_bug.py").write_text(
        "from rankwatch.gpu.backend import NvmlBackend\n\n"
        "def _broken(self, index):\n"
        "    raise RuntimeError('planted: the backend broke')\n\n"
        "NvmlBackend.device_info = _broken\n"
    )
    broken = _real_nvml_test(standin, tmp_path, "-p", "planted_nvml_bug")
    assert broken.returncode == 1 and "1 failed" in broken.stdout, broken.stdout + broken.stderr
    assert "skipped" not in broken.stdout
