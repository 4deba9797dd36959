"""bench.sizing's arithmetic: per member from the idle members over etcd alone, per 1000 nodes
and per 1000 pods from the states around them (the measuring itself runs in `make bench`)."""

from __future__ import annotations

from typing import Any

from bench.sizing import sizing


def state(name: str, **roles: tuple[float, float]) -> dict[str, Any]:
    return {"state": name, "etcdByCluster": {}, "etcd": {"dbSize": 0, "dbSizeInUse": 0},
            "processes": [{"name": f"{role} {index}", "role": role, "rss_mib": rss / 2,
                           "cpu_per_second": cpu / 2}
                          for role, (rss, cpu) in roles.items() for index in range(2)]}


def test_figures_are_differences_between_states_divided() -> None:
    result = {"clusters": 2, "nodesPerCluster": 501, "podsPerCluster": 250, "states": [
        state("etcd alone", etcd=(40, 0.01)),
        state("members", etcd=(60, 0.02), **{"kube-apiserver": (500, 0.02)},
              engine=(160, 0.0)),
        state("nodes", etcd=(260, 0.42), **{"kube-apiserver": (900, 1.02)},
              engine=(560, 0.2)),
        state("pods", etcd=(310, 0.42), **{"kube-apiserver": (1000, 1.02)},
              engine=(580, 0.2)),
    ]}
    rows = {(what, role): (round(rss, 3), round(cpu, 4))
            for what, role, rss, cpu in sizing(result)}
    assert rows[("per member cluster (idle, 1 node)", "kube-apiserver")] == (250, 0.01)
    assert rows[("per member cluster (idle, 1 node)", "etcd")] == (10, 0.005)
    # 2 x 500 nodes added (each engine served one node already).
    assert rows[("per 1000 Ready nodes", "engine")] == (400, 0.2)
    assert rows[("per 1000 Ready nodes", "kube-apiserver")] == (400, 1.0)
    assert rows[("per 1000 Running pods", "etcd")] == (100, 0.0)
