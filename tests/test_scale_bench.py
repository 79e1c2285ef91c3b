"""benchmarks/scale.py without a lab: its inventories, its loop over sizes (a failure at one size
is recorded and the next size runs), its table, JSON and plot, with fake timings."""

from __future__ import annotations

import json

import pytest

from pdkit.inventory.loader import load
from pdkit.lab.model import planned_lab
from pdkit.render.plan import plan_cluster
from tests.conftest import REPO, load_script

scale = load_script("benchmarks/scale.py", "pdkit_bench_scale")


@pytest.fixture()
def no_lab(tmp_path, monkeypatch):
    """The lab is down: lab.json is absent from the state directory."""
    monkeypatch.setenv("PDKIT_LAB_DIR", str(tmp_path / "lab-state"))


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("nodes", [1, 4])
def test_the_synthetic_inventory_validates_with_a_pd_pair_per_node(tmp_path, nodes):
    spec = load(_write(tmp_path, f"syn{nodes}.py", scale.synthetic_inventory_text(nodes)))
    assert len(spec.gpu_hosts) == nodes and len(spec.hosts) == nodes + 2
    assert [e.role for _, e in spec.engines()] == ["prefill", "decode"] * nodes
    assert {e.pd_group for _, e in spec.engines()} == {f"n{i}" for i in range(nodes)}
    assert [h.name for h in spec.router_hosts] == ["router01"] and spec.monitoring_hosts[0].monitoring.grafana


def test_render_only_times_the_cli_and_counts_the_files(tmp_path):
    rows = scale.render_bench([1, 2], repeat=2, tmp=tmp_path)
    assert [r.nodes for r in rows] == [1, 2] and not any(r.error for r in rows)
    assert all(len(r.validate_s) == 2 and len(r.render_s) == 2 for r in rows)
    spec = load(_write(tmp_path, "two.py", scale.synthetic_inventory_text(2)))
    assert rows[1].files == sum(len(p.files) for p in plan_cluster(spec).values())
    assert rows[1].hosts == 4 and rows[1].engines == 4


def test_render_table_and_target_with_fake_timings():
    rows = [scale.RenderRow(1, 3, 2, 24, [0.01, 0.02, 0.03], [0.05, 0.04, 0.06]),
            scale.RenderRow(512, 514, 1024, 5134, [0.2], [0.9]),
            scale.RenderRow(16, error="pdkit validate exited 2: boom")]
    table = scale.render_table(rows)
    assert "| 1 | 3 | 2 | 24 | 20 ms | 50 ms | **70 ms** |" in table
    assert "| 512 | 514 | 1024 | 5134 | 200 ms | 900 ms | **1100 ms** |" in table
    assert "failed: pdkit validate exited 2: boom" in table
    assert scale.target_verdict(rows).endswith("1.10 s, met")
    assert scale.target_verdict([scale.RenderRow(512, validate_s=[1.5], render_s=[0.6])]).endswith("2.10 s, NOT met")
    assert scale.target_verdict(rows[:1]).endswith("not measured")


@pytest.mark.parametrize("n", [1, 4, 16])
def test_the_lab_inventory_is_inventories_lab_py_on_n_hosts(tmp_path, no_lab, n):
    spec = load(_write(tmp_path, f"lab{n}.py", scale.lab_inventory_text(n)))
    planned = planned_lab(n)
    assert [h.name for h in spec.gpu_hosts] == [h.name for h in planned.gpu_hosts]
    assert {h.name: h.address for h in spec.hosts} == {h.name: h.address for h in planned.hosts}
    # the same per-node plan as inventories/lab.py (the lab of 3): the first node's engines
    base = load(REPO / "inventories" / "lab.py")
    # the engines' ready timeout grows with the lab: 120 s up to four GPU hosts, 10 s per host beyond
    assert spec.cluster.ready_timeout_s == 120 + 10 * max(0, n - 4)
    assert spec.cluster.model_copy(update={"ready_timeout_s": 0}) == base.cluster.model_copy(update={"ready_timeout_s": 0})
    assert [e for e in spec.gpu_hosts[0].node.engines] == list(base.gpu_hosts[0].node.engines)
    assert spec.gpu_hosts[0].router == base.gpu_hosts[0].router


def test_the_rolled_change_is_one_field(tmp_path, no_lab):
    base = plan_cluster(load(_write(tmp_path, "b.py", scale.lab_inventory_text(4))))
    rolled_spec = load(_write(tmp_path, "r.py", scale.lab_inventory_text(4, max_bs=scale.ROLL_TO)))
    assert rolled_spec.cluster.tuning.decode.cuda_graph_max_bs == scale.ROLL_TO
    rolled = plan_cluster(rolled_spec)
    changed = {h: sorted(f.path for f in rolled[h].files if f.sha256 != base[h].file(f.path).sha256) for h in base}
    for host, paths in changed.items():
        if host.startswith("lab-gpu"):
            assert paths == ["/etc/pdkit/exporter.json", "/etc/pdkit/release.json", "/etc/systemd/system/pdkit-engine-decode.service"], (host, paths)
        else:
            assert paths == [], (host, paths)


def test_the_lab_inventory_refuses_a_lab_of_another_size(tmp_path, monkeypatch):
    state = tmp_path / "lab-state"
    state.mkdir()
    (state / "lab.json").write_text(planned_lab(3).model_dump_json())
    monkeypatch.setenv("PDKIT_LAB_DIR", str(state))
    from pdkit.inventory.loader import load_with_problems

    spec, problems = load_with_problems(_write(tmp_path, "l4.py", scale.lab_inventory_text(4)))
    assert spec is None
    assert "the running lab has 3 GPU hosts, this inventory is for 4: pdkit lab down && pdkit lab up --hosts 4" in problems[0].message
    spec, problems = load_with_problems(_write(tmp_path, "l3.py", scale.lab_inventory_text(3)))
    assert spec is not None and len(spec.gpu_hosts) == 3


class FakeSteps:
    """Timings that grow with N; the step named in FAIL raises at that size."""

    def __init__(self, fail: dict[int, str] | None = None):
        self.fail = fail or {}
        self.calls: list[tuple] = []
        self.n = 0

    def _maybe_fail(self, step: str):
        if self.fail.get(self.n) == step:
            raise scale.StepFailed(f"{step} broke at {self.n}")

    def lab_up(self, n):
        self.n = n
        self.calls.append(("lab_up", n))
        self._maybe_fail("lab_up")
        return 1.0 + 0.1 * n

    def deploy(self, inventory):
        first = not any(c[0] == "deploy" and c[2] == self.n for c in self.calls)
        self.calls.append(("deploy", inventory.name, self.n))
        self._maybe_fail("converge" if first else "noop")
        assert f"_N = {self.n}" in inventory.read_text()
        return (10.0 * self.n, 20) if first else (1.5 + 0.01 * self.n, 0)

    def memory_mib(self):
        return 200.0 * self.n

    def roll(self, inventory, batch):
        self.calls.append(("roll", inventory.name, batch))
        self._maybe_fail("roll")
        assert f"cuda_graph_max_bs'] = {scale.ROLL_TO}" in inventory.read_text()
        return 3.0 * self.n / batch

    def scrape(self):
        self._maybe_fail("scrape")
        return [("sglang", "a", 0.004, True), ("sglang", "b", 0.006, True), ("node", "a", 0.020, True), ("pdkit-exporter", "a", 0.030, False)]


def test_run_lab_records_a_failure_and_goes_on(tmp_path):
    steps = FakeSteps(fail={4: "converge", 16: "roll"})
    seen: list[int] = []
    rows = scale.run_lab([1, 4, 16, 32], batch=4, steps=steps, workdir=tmp_path, on_row=lambda rows: seen.append(len(rows)))
    assert seen == [1, 2, 3, 4]
    one, four, sixteen, thirty_two = rows
    assert one.batch == 1 and one.failed == "" and one.noop_changed == 0 and one.roll_s == 3.0
    assert four.failed == "first converge: converge broke at 4" and four.lab_up_s == pytest.approx(1.4)
    assert four.converge_s is None and four.noop_s is None and four.roll_s is None
    assert sixteen.failed == "roll --batch 4: roll broke at 16" and sixteen.noop_s == pytest.approx(1.66) and sixteen.scrape_max_s is None
    assert thirty_two.failed == "" and thirty_two.roll_s == pytest.approx(24.0) and thirty_two.memory_mib == 6400.0
    assert thirty_two.scrape_targets == 4 and thirty_two.targets_up == 3 and thirty_two.targets_down == ["pdkit-exporter a"]
    assert thirty_two.scrape_median_s == pytest.approx(0.013) and thirty_two.scrape_max_s == pytest.approx(0.030)
    assert thirty_two.scrape_by_job == {"sglang": 0.006, "node": 0.020, "pdkit-exporter": 0.030}
    # every size had its own lab, and the roll ran on the rolled inventory of that size
    assert [c[1] for c in steps.calls if c[0] == "lab_up"] == [1, 4, 16, 32]
    assert [c[2] for c in steps.calls if c[0] == "roll"] == [1, 4, 4]


def test_lab_results_table_json_and_plot(tmp_path):
    rows = scale.run_lab([1, 4, 16], batch=4, steps=FakeSteps(fail={4: "scrape"}), workdir=tmp_path)
    written = scale.write_lab_results(rows, tmp_path / "out", when="2026-12-01 12:00 UTC")
    md = written["md"].read_text()
    assert "| 1 | 1.1 s | 10.0 s | 1.5 s (0) | 3.0 s (`--batch 1`) | 13 ms / 30 ms (3/4; down: pdkit-exporter a) | 0.2 GiB | ok |" in md
    assert "| 4 | 1.4 s | 40.0 s | 1.5 s (0) | 4.0 s (`--batch 3`) | - | 0.8 GiB | FAILED at scrape durations: scrape broke at 4 |" in md
    assert "![time against N](scale-lab.png)" in md and "2026-12-01 12:00 UTC" in md
    data = json.loads(written["json"].read_text())
    assert [r["gpu_hosts"] for r in data["rows"]] == [1, 4, 16] and data["rows"][1]["failed"].startswith("scrape durations")
    assert written["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_copes_with_every_size_failed(tmp_path):
    rows = [scale.LabRow(1, 1, failed="lab up: no root"), scale.LabRow(4, 3, failed="lab up: no root")]
    assert scale.write_plot(rows, tmp_path / "p.png").stat().st_size > 0


def test_changed_operations_reads_pyinfra_json():
    out = json.dumps({"results": {"operations": [{"name": "a", "success": ["h1"]}, {"name": "b", "success": []}, {"name": "c"}]}})
    assert scale.changed_operations(out) == 1
    assert scale.changed_operations("") == 0 and scale.changed_operations("not json") == -1
