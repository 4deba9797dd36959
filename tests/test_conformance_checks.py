"""The AI-conformance runner and checks over the in-memory API: each check failing alone with
its reason, its deadline or its error, cleaned up after; the per-requirement messages for a
cluster without GPUs, an add-on that is off, and an add-on this build lacks."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from operators.conformance import checklists, faulting, running
from operators.conformance.checking import Context, Evidence, Unmet, Verdict
from operators.conformance.checks import CHECKS, Check
from operators.conformance.checks import metrics as metric_checks
from operators.conformance.results import Result
from operators.k8s.client import Client
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport


class Member:
    """A FakeCluster and its member API in memory."""

    def __init__(self, tmp: Path, cluster: dict[str, Any] | None = None,
                 nodes: list[dict[str, Any]] | None = None) -> None:
        self.clock = FakeClock()
        self.api = MemoryTransport(self.clock)
        self.host_api = MemoryTransport(self.clock)
        for node in nodes or []:
            self.api.put("/api/v1/nodes", node)
        self.cluster = cluster or {"metadata": {"name": "c", "namespace": "default"},
                                   "spec": {}, "status": {}}
        self.target = running.Target(member=Client(self.api, clock=self.clock),
                                     host=Client(self.host_api, clock=self.clock),
                                     cluster=self.cluster, pools=[], output=tmp, run="t1")

    def context(self, id: str) -> Context:
        return Context(member=self.target.member, host=self.target.host, cluster=self.cluster,
                       pools=[], evidence=Evidence(self.target.output, id), clock=self.clock,
                       run="t1")


async def test_each_check_fails_alone_with_its_reason_deadline_and_cleanup(
        tmp_path: Path) -> None:
    member = Member(tmp_path)
    member.api.put("/api/v1/namespaces", {"metadata": {"name": "made"}})

    async def hangs(ctx: Context) -> Verdict:
        ctx.created("/api/v1/namespaces/made")
        ctx.at("waiting for something that never comes")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def unmet(ctx: Context) -> Verdict:
        ctx.evidence.write("seen.txt", "what it saw\n")
        raise Unmet("Kueue is off: set spec.addons.kueue")

    async def breaks(ctx: Context) -> Verdict:
        raise RuntimeError("boom")

    async def holds(ctx: Context) -> Verdict:
        return Verdict("Implemented", "held")

    checks = {"gang_scheduling": Check(hangs, 0.05), "cluster_autoscaling": Check(unmet, 5),
              "pod_autoscaling": Check(breaks, 5), "accelerator_metrics": Check(holds, 5)}
    lines: list[tuple[str, str]] = []
    found = {r.id: r for r in await running.run(
        checklists.load(), member.target, clock=member.clock, checks=checks, extra={},
        say=lambda id, line: lines.append((id, line)))}
    assert list(found) == list(checklists.load().ids)
    gang = found["gang_scheduling"]
    assert gang.status == "Not Implemented"
    assert gang.deadline == "0s, waiting for something that never comes"
    assert "deadline of 0s passed while waiting for something that never comes" in gang.notes
    assert member.api.object("/api/v1/namespaces/made") is None, "cleaned up after it"
    assert found["cluster_autoscaling"].notes == "Kueue is off: set spec.addons.kueue"
    assert found["cluster_autoscaling"].evidence == ("evidence/cluster_autoscaling/seen.txt",)
    assert (tmp_path / "evidence/cluster_autoscaling/seen.txt").read_text() == "what it saw\n"
    assert found["pod_autoscaling"].notes == "the check failed while starting: RuntimeError: boom"
    assert found["accelerator_metrics"].passed
    assert found["robust_controller"].notes.startswith("fakefleet has no check")
    assert not found["secure_accelerator_access"].automated
    assert ("gang_scheduling", "waiting for something that never comes") in lines


async def test_only_checks_what_it_names_and_says_so_of_the_rest(tmp_path: Path) -> None:
    member = Member(tmp_path)

    async def holds(ctx: Context) -> Verdict:
        return Verdict("Implemented", "held")
    found = await running.run(checklists.load(), member.target, clock=member.clock,
                              only={"accelerator_metrics"},
                              checks={"accelerator_metrics": Check(holds, 5)}, extra={})
    by_id = {r.id: r for r in found}
    assert by_id["accelerator_metrics"].passed
    assert by_id["gang_scheduling"].notes == ("not checked in this run (it checked only "
                                              "accelerator_metrics)")


def gpu_node(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"nvidia.com/gpu": str(count)}}}


async def test_a_cluster_without_gpus_is_told_so_per_requirement(tmp_path: Path) -> None:
    member = Member(tmp_path, nodes=[{"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": "cpu-0"}, "status": {}}])
    with pytest.raises(Unmet, match=r"FakeCluster default/c has no GPUs: .* add a FakeNodePool "
                                    r"with spec\.gpu"):
        await metric_checks.accelerators(member.context("accelerator_metrics"))


async def test_an_addon_that_is_off_names_the_field_that_turns_it_on(tmp_path: Path) -> None:
    member = Member(tmp_path, nodes=[gpu_node("gpu-0", 8)])
    with pytest.raises(Unmet, match=r"spec\.addons\.kueue is not enabled on FakeCluster "
                                    r"default/c: set spec\.addons\.kueue"):
        await CHECKS["gang_scheduling"].run(member.context("gang_scheduling"))
    with pytest.raises(Unmet, match=r"spec\.addons\.karpenter is not enabled"):
        await CHECKS["cluster_autoscaling"].run(member.context("cluster_autoscaling"))
    for id in ("pod_autoscaling", "ai_service_metrics"):
        with pytest.raises(Unmet, match=r"spec\.addons\.customMetrics is not enabled on "
                                        r"FakeCluster default/c: set spec\.addons\.customMetrics"):
            await CHECKS[id].run(member.context(id))


DCGM_PAGE = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",Hostname="gpu-0",modelName="NVIDIA H100 80GB HBM3"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",Hostname="gpu-0",modelName="NVIDIA H100 80GB HBM3"} 0
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",Hostname="gpu-0"} 65536
"""


def test_dcgm_samples_are_read_with_their_labels() -> None:
    found = metric_checks.samples(DCGM_PAGE, metric_checks.DCGM_METRICS)
    assert [(labels["gpu"], labels["Hostname"], value)
            for labels, value in found["DCGM_FI_DEV_GPU_UTIL"]] == [("0", "gpu-0", "90"),
                                                                   ("1", "gpu-0", "0")]
    assert found["DCGM_FI_DEV_GPU_UTIL"][0][0]["modelName"] == "NVIDIA H100 80GB HBM3"
    assert len(found["DCGM_FI_DEV_FB_USED"]) == 1
    assert found["DCGM_FI_DEV_POWER_USAGE"] == []


POOLS = [{"metadata": {"name": "h100"}, "spec": {"gpu": {"preset": "H100-SXM5-80GB"}}},
         {"metadata": {"name": "burst"}, "spec": {"provisioner": "karpenter",
                                                  "gpu": {"preset": "H100-SXM5-80GB"}}},
         {"metadata": {"name": "cpu"}, "spec": {}}]
CLUSTER = {"metadata": {"name": "c", "namespace": "default"}, "spec": {}, "status": {}}


def test_a_fault_plan_hits_only_the_checked_cluster_s_pools_with_a_fixed_seed() -> None:
    plan = faulting.plan(CLUSTER, POOLS, "gang_scheduling", "ab12")
    assert plan is not None
    assert plan["metadata"] == {"name": "ffc-ab12-gang-scheduling", "namespace": "default",
                                "labels": {"fakefleet.dev/conformance": "ab12"}}
    [step] = plan["spec"]["steps"]
    assert plan["spec"]["seed"] == faulting.SEED
    assert step["target"] == {"clusters": {"names": ["c"]}, "nodes": {"pools": ["h100"]},
                              "mode": "one"}, "a static GPU pool, never Karpenter's"
    assert step["fault"] == {"type": "GPUXid", "xid": 79}
    lost = faulting.plan(CLUSTER, POOLS, "robust_controller", "ab12")
    assert lost is not None
    assert lost["spec"]["steps"][0]["target"]["nodes"]["pools"] == ["h100", "cpu"]
    assert faulting.plan(CLUSTER, [POOLS[1]], "gang_scheduling", "ab12") is None


async def test_under_faults_runs_what_held_again_under_its_plan_and_deletes_it(
        tmp_path: Path) -> None:
    member = Member(tmp_path, cluster=CLUSTER, nodes=[{
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "h100-0"},
        "spec": {"taints": [{"key": "fakefleet.dev/gpu-xid", "value": "79",
                             "effect": "NoExecute"}]}}])
    target = dataclasses.replace(member.target, pools=POOLS)
    plans = "/apis/fakefleet.dev/v1alpha1/namespaces/default/faultplans"
    seen: list[str] = []

    async def gang(ctx: Context) -> Verdict:
        seen.extend(p["metadata"]["name"] for p in member.host_api.objects(plans))
        seen.append(ctx.run)
        # The fault ends as the engine would end it once the plan is gone.
        await ctx.member.patch("/api/v1/nodes/h100-0", {"spec": {"taints": None}})
        return Verdict("Implemented", "admitted whole")

    clean = [Result("gang_scheduling", "Implemented", "held"),
             Result("robust_controller", "Not Implemented", "no KubeRay"),
             Result("accelerator_metrics", "Implemented", "held")]
    found = await running.under_faults(target, clean, clock=member.clock,
                                       checks={"gang_scheduling": Check(gang, 5)})
    assert [r.id for r in found] == ["gang_scheduling-under-gpu-xid-79",
                                     "robust_controller-under-node-lost"]
    gang_result, ray = found
    assert gang_result.passed
    assert gang_result.extra
    assert gang_result.notes == ("under Xid 79 (GPU fallen off the bus) on one GPU node while "
                                 "the gangs run: admitted whole")
    assert seen == ["ffc-t1f-gang-scheduling", "t1f"], "a plan and names of the rerun's own"
    assert "evidence/gang_scheduling-under-gpu-xid-79/faultplan.yaml" in gang_result.evidence
    assert member.host_api.objects(plans) == [], "the plan deleted after the check"
    assert ray.status == "N/A"
    assert "does not hold without it" in ray.notes
