"""The soak's checks judge sightings the way the run needs: each rule catches what it names and
lets through what the run asked for."""

from __future__ import annotations

import math

from bench import soakcheck
from bench.soakcheck import Kill, Scale, Sighting, Verdict, Window


def node(at: float, name: str, ready: str = "True", uid: str = "u1", *, deleted: bool = False,
         cluster: str = "a") -> Sighting:
    return Sighting(at=at, cluster=cluster, kind="Node", name=name, uid=uid, ready=ready,
                    deleted=deleted)


def pod(at: float, name: str, *, ready: str = "True", phase: str = "Running", restarts: int = 0,
        node_name: str = "a-cpu-0", uid: str = "p1", deleted: bool = False) -> Sighting:
    return Sighting(at=at, cluster="a", kind="Pod", name=name, uid=uid, ready=ready, phase=phase,
                    restarts=restarts, node=node_name, deleted=deleted, labels={"app": "soak"})


def window(kind: str, name: str, start: float, end: float, fault: str = "NotReady") -> Window:
    return Window("a", kind, name, fault, start, end, "soak", "step", 0)


def test_sightings_are_read_from_objects() -> None:
    seen = soakcheck.pod_sighting(3.0, "a", {
        "metadata": {"name": "p", "uid": "x", "labels": {"app": "soak"}},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                   "containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]}})
    assert (seen.ready, seen.phase, seen.restarts, seen.node) == ("False", "Running", 3, "n")
    assert soakcheck.node_sighting(1.0, "a", {"metadata": {"name": "n"}}).ready == ""


def test_windows_come_from_the_recorded_injections() -> None:
    found = soakcheck.windows("soak", 100.0, [
        {"step": "nodes-down", "occurrence": 1, "injectAt": 30, "recoverAt": 60,
         "recoveredAt": "T", "targets": ["a/Node//a-cpu-3"]},
        {"step": "pods-exit", "injectAt": 90, "injectedAt": "U",
         "targets": ["b/Pod/default/soak-x:c"]},
        {"step": "later", "injectAt": None, "targets": ["a/Node//n"]}],
        {"nodes-down": "NotReady", "pods-exit": "ContainerExit"},
        lambda text: {"T": 165.0, "U": 191.0}[text])
    assert [(w.cluster, w.kind, w.name, w.fault) for w in found] == [
        ("a", "Node", "a-cpu-3", "NotReady"), ("b", "Pod", "soak-x", "ContainerExit")]
    assert found[0].start == 128.0
    assert found[0].end == 165.0 + soakcheck.NODE_GRACE
    assert found[1].end == 191.0 + soakcheck.POD_GRACE


def test_a_node_made_twice_or_deleted_unasked_is_caught() -> None:
    assert soakcheck.nodes_made_once([node(1, "a-cpu-0"), node(5, "a-cpu-0", uid="u2")], []) == [
        "a/a-cpu-0: made again (u2) while u1 still existed"]
    assert soakcheck.nodes_made_once([node(1, "a-cpu-0"), node(5, "a-cpu-0", deleted=True)],
                                     []) == ["a/a-cpu-0: node u1 deleted unasked"]


def test_a_scale_down_explains_a_deletion_and_the_node_made_again() -> None:
    scales = [Scale(10, "b", "b-elastic", 6), Scale(20, "b", "b-elastic", 3),
              Scale(30, "b", "b-elastic", 6)]
    seen = [node(11, "b-elastic-4", cluster="b"),
            node(21, "b-elastic-4", deleted=True, cluster="b"),
            node(31, "b-elastic-4", uid="u2", cluster="b")]
    assert soakcheck.nodes_made_once(seen, scales) == []
    # Index 2 stays below every size the run set: deleting it was nobody's wish.
    assert soakcheck.nodes_made_once([node(21, "b-elastic-2", deleted=True, cluster="b")],
                                     scales) == ["b/b-elastic-2: node u1 deleted unasked"]


def test_a_node_not_ready_outside_a_window_is_invented() -> None:
    seen = [node(0, "a-cpu-0", ready=""), node(1, "a-cpu-0"), node(50, "a-cpu-0", "False"),
            node(70, "a-cpu-0")]
    assert soakcheck.invented_node_faults(seen, [], []) == [
        "a/a-cpu-0: Ready=False at 50 with no fault over it"]
    assert soakcheck.invented_node_faults(seen, [window("Node", "a-cpu-0", 40, 90)], []) == []
    # Not yet Ready after its creation is no fault.
    assert soakcheck.invented_node_faults(seen[:1], [], []) == []


def test_a_pod_restarted_or_not_ready_outside_a_window_is_invented() -> None:
    base = [pod(0, "p", ready="False", phase="Pending"), pod(5, "p")]
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", restarts=1)], [], "soak") == [
        "a/p: restarted at 40 with no fault over it"]
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", ready="False")], [], "soak") == [
        "a/p: Ready=False at 40 with no fault over it"]
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", deleted=True)], [], "soak") == [
        "a/p: deleted with no fault over it"]
    # Its own window, or its node's, excuses it; other apps are not judged.
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", restarts=1)],
                                         [window("Pod", "p", 30, 60, "ContainerExit")],
                                         "soak") == []
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", ready="False")],
                                         [window("Node", "a-cpu-0", 30, 60)], "soak") == []
    assert soakcheck.invented_pod_faults([*base, pod(40, "p", ready="False")], [], "other") == []


def test_each_victim_is_counted_once_missed_repeated_or_unrecovered() -> None:
    down = window("Node", "n", 10, 60)
    once = [node(5, "n"), node(15, "n", "False"), node(45, "n")]
    twice = [*once, node(50, "n", "Unknown"), node(55, "n")]
    stuck = [node(5, "n"), node(15, "n", "False")]
    assert soakcheck.occurrences(once, [down])["once"] == [down.label]
    assert soakcheck.occurrences(twice, [down])["repeated"] == [down.label]
    assert soakcheck.occurrences([node(5, "n"), node(20, "n")], [down])["missed"] == [down.label]
    assert soakcheck.occurrences(stuck, [down])["unrecovered"] == [down.label]
    exit_ = window("Pod", "p", 10, 60, "ContainerExit")
    assert soakcheck.occurrences([pod(5, "p", restarts=2), pod(20, "p", restarts=3)],
                                 [exit_])["once"] == [exit_.label]
    assert soakcheck.occurrences([pod(5, "p"), pod(20, "p", restarts=2)],
                                 [exit_])["repeated"] == [exit_.label]


def test_a_job_made_twice_is_caught_across_clusters() -> None:
    def job(cluster: str, uid: str, name: str = "j-0") -> Sighting:
        return Sighting(at=1, cluster=cluster, kind="Job", name=name, uid=uid,
                        labels={"fakefleet.dev/workload": "w1"})
    count, repeated = soakcheck.jobs_made_once(
        [job("a", "1"), job("a", "1"), job("b", "2"), job("a", "3", "j-1")],
        "fakefleet.dev/workload")
    assert count == 2
    assert repeated == ["w1/j-0: 2 times (a, b)"]


def kill(killed_at: float | None, back_after: float | None, target: str = "operator",
         cluster: str = "") -> Kill:
    return Kill(at=killed_at or 0.0, target=target, cluster=cluster, pid=9 if killed_at else 0,
                killed_at=killed_at, tries=1, back_after=back_after)


def test_a_kills_downtime_runs_until_its_successor_is_back() -> None:
    assert kill(100, 20).downtime(aftermath=5) == (100, 125)
    assert kill(100, None).downtime(aftermath=5) == (100, math.inf)
    assert kill(None, None).downtime(aftermath=5) is None
    assert Kill(90, "hub", "", 9, 94.5, 3, 2.0).drift == 4.5


def test_a_verdict_changed_while_a_process_was_down_is_reported_apart() -> None:
    window = Verdict("soak/nodes-down#1/v", "Failed", 200, 240)
    # Killed before the window opened, back only inside it: the kill's, not the product's.
    assert soakcheck.compare_verdicts([window], [kill(150, 60, "engine", "a")], expected=None,
                                      aftermath=0)["changedDuringKills"] == [
        "soak/nodes-down#1/v: Failed, Passed as designed (down meanwhile: engine/a)"]
    # Never back: down to the end of the run.
    assert soakcheck.compare_verdicts([window], [kill(10, None)], expected=None,
                                      aftermath=0)["changedDuringKills"]
    # Back well before, or a kill that never went: nothing explains it.
    for kills in ([kill(150, 20)], [kill(None, None)]):
        assert soakcheck.compare_verdicts([window], kills, expected=None,
                                          aftermath=15)["changedOtherwise"] == [
            "soak/nodes-down#1/v: Failed, Passed as designed"]
    # The aftermath of a comeback still counts.
    assert soakcheck.compare_verdicts([window], [kill(150, 40)], expected=None,
                                      aftermath=15)["changedDuringKills"]


def test_verdicts_are_compared_with_the_run_without_kills() -> None:
    verdicts = [Verdict("x", "Failed", 0, 10), Verdict("y", "Passed", 0, 10),
                Verdict("z", "Pending", 0, 10), Verdict("w", "Passed", 0, 10),
                Verdict("v", "Failed", 0, 10)]
    found = soakcheck.compare_verdicts(
        verdicts, [], expected={"x": "Failed", "y": "Failed", "z": "Failed", "w": "Passed"},
        aftermath=0)
    assert found == {
        "same": ["w: Passed"],
        # Failed without kills too: no kill explains it.
        "notPassedWithoutKills": ["x: Failed"],
        "changedDuringKills": [],
        # Better than without kills is a change too; never judged is neither Passed nor
        # Failed; an occurrence the baseline did not reach is held to the design.
        "changedOtherwise": ["y: Passed, Failed without kills", "z: Pending, Failed without kills",
                             "v: Failed, Passed as designed"]}


def test_occurrences_due_are_injected_and_finished_once() -> None:
    planned = {("down", 0): 30.0, ("down", 1): 150.0, ("down", 2): 270.0, ("exit", 0): 90.0,
               ("exit", 1): 210.0, ("exit", 2): 330.0}
    injections = [{"step": "down", "occurrence": 0, "state": "Recovered"},
                  {"step": "down", "occurrence": 1, "state": "Recovering"},
                  {"step": "down", "occurrence": 2, "state": "Scheduled"},
                  {"step": "exit", "occurrence": 0, "state": "Done"},
                  {"step": "exit", "occurrence": 0, "state": "Done"},
                  {"step": "exit", "occurrence": 1, "state": "Skipped"},
                  {"step": "exit", "occurrence": 2, "state": "Scheduled"},
                  {"step": "other", "occurrence": 0, "state": "Done"}]
    found = soakcheck.occurrences_done(injections, planned, until=300)
    assert found == {
        "due": 5, "recorded": 8, "finished": 2,
        "missed": ["down#2: Scheduled", "exit#1: Skipped"],
        "unfinished": ["down#1: Recovering"],
        "repeated": ["exit#0: recorded 2 times"],
        "unplanned": ["other#0: Done"]}
    assert soakcheck.occurrences_done([], planned, until=100)["missed"] == [
        "down#0: not recorded", "exit#0: not recorded"]


def test_a_workload_lost_or_sent_again_is_caught() -> None:
    def job(index: int, state: str = "Succeeded", attempt: int = 1) -> dict[str, object]:
        return {"index": index, "name": f"w1-{index}", "state": state, "attempt": attempt}

    def seen(name: str) -> Sighting:
        return Sighting(at=1, cluster="a", kind="Job", name=name, uid=name,
                        labels={"fakefleet.dev/workload": "w1"})
    workload = {"id": "w1", "name": "soak-0", "phase": "Succeeded",
                "jobs": [job(0), job(1, attempt=2)]}
    found = soakcheck.workloads_done([workload], [seen("w1-0"), seen("w1-1")],
                                     "fakefleet.dev/workload", jobs=2)
    assert found == {"lost": [], "retried": ["soak-0/1: attempt 2"]}
    workload |= {"phase": "Running", "jobs": [job(0), job(1, "Pending")]}
    assert soakcheck.workloads_done([workload], [seen("w1-0")], "fakefleet.dev/workload",
                                    jobs=3)["lost"] == [
        "soak-0: Running", "soak-0: 2 of 3 Jobs", "soak-0/1: Pending",
        "soak-0/1: Job w1-1 never seen in a member"]


def test_failed_pods_of_workloads_are_reported_once_each() -> None:
    def pod_of(at: float, phase: str, labels: dict[str, str]) -> Sighting:
        return Sighting(at=at, cluster="b", kind="Pod", name="w1-0-x", uid="u", phase=phase,
                        labels=labels)
    label = {"fakefleet.dev/workload": "w1"}
    assert soakcheck.failed_workload_pods(
        [pod_of(1, "Running", label), pod_of(5, "Failed", label), pod_of(6, "Failed", label),
         pod_of(7, "Failed", {"app": "soak"})], "fakefleet.dev/workload") == [
        "b/w1-0-x (workload w1): Failed at 5"]


def test_a_container_exit_window_allows_the_kubelets_back_off() -> None:
    """Defect: a flat 45 s judged a pod hit 3 times in ten minutes, which a real kubelet makes
    wait 20 s more (at once, then 10 s, then 20 s), unrecovered."""
    history = [pod(0.0, "p"),
               pod(100.0, "p", restarts=1),  # exited, restarted at once
               pod(200.0, "p", ready="False", restarts=2), pod(210.0, "p", restarts=2)]
    assert soakcheck.kubelet_wait(history, 300.0) == 20.0
    assert soakcheck.kubelet_wait(history, 811.0) == 0.0  # 600 s after its last restart
    exit_window = window("Pod", "p", 298.0, 345.0, fault="ContainerExit")
    node_window = window("Node", "a-cpu-0", 298.0, 345.0)
    assert [w.end for w in soakcheck.allow_backoff([exit_window, node_window], history)] == \
        [365.0, 345.0]
    late = [*history, pod(300.0, "p", ready="False", restarts=3), pod(360.0, "p", restarts=3)]
    assert soakcheck.occurrences(late, soakcheck.allow_backoff([exit_window], late)) == {
        "once": [exit_window.label], "missed": [], "repeated": [], "unrecovered": []}


def test_failed_workload_jobs_are_kept_with_their_conditions() -> None:
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
              "message": "Job has reached the specified backoff limit",
              "lastTransitionTime": "2026-12-03T12:36:00Z"}
    jobs = [{"metadata": {"name": "w-0", "labels": {"fakefleet.dev/workload": "w"}},
             "status": {"failed": 1, "conditions": [failed]}},
            {"metadata": {"name": "w-1", "labels": {"fakefleet.dev/workload": "w"}},
             "status": {"succeeded": 1}},
            {"metadata": {"name": "other"}, "status": {"failed": 1}}]
    assert soakcheck.failed_jobs("a", jobs, "fakefleet.dev/workload") == [
        {"cluster": "a", "name": "w-0", "failed": 1, "succeeded": 0, "conditions": [failed]}]


def test_workload_pods_deleted_before_they_finished_are_listed_earliest_first() -> None:
    """The Job controller counts them failed: the first one names why a Job failed."""
    def job_pod(at: float, uid: str, phase: str, **flags: bool) -> Sighting:
        return Sighting(at=at, cluster="a", kind="Pod", name=f"w-{uid}", uid=uid, phase=phase,
                        labels={"fakefleet.dev/workload": "w"}, **flags)
    seen = [job_pod(5.0, "1", "Running", deleting=True), job_pod(6.0, "1", "Running",
                                                                 deleted=True),
            job_pod(3.0, "2", "Pending", deleting=True),
            job_pod(4.0, "3", "Succeeded", deleted=True)]
    assert soakcheck.unfinished_workload_pods(seen, "fakefleet.dev/workload") == [
        "a/w-2 (workload w): deleting while Pending at 3",
        "a/w-1 (workload w): deleting while Running at 5"]
