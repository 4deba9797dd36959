"""Each node's /metrics/resource body rendered once per second: the same bytes within one
bucket, new ones in the next, and at once when the node's pods change (pure, fake clock)."""

from __future__ import annotations

from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import pods as podlife
from operators.engine.caching import Bodies
from operators.engine.pods import PodFacts, PodLife
from operators.engine.usage import UsageBook
from operators.k8s.times import rfc3339
from operators.metrics import kubelet
from tests.fakes.clocks import FakeClock

SPEC = FakeNodePoolSpec.model_validate({"clusterRef": "c"})


class Renders:
    """A render function that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def __call__(self, node: str, now: float) -> bytes:
        self.calls.append((node, now))
        return f"{node} at {now} (render {len(self.calls)})".encode()


async def test_one_render_per_node_and_bucket() -> None:
    clock, renders = FakeClock(), Renders()
    bodies = Bodies(renders, clock=clock, bucket=1.0)
    first = bodies.get("cpu-0", 1)
    assert bodies.get("cpu-0", 1) is first, "the same round: the same bytes"
    await clock.advance(0.5)
    assert bodies.get("cpu-0", 1) is first, "still the same bucket"
    assert renders.calls == [("cpu-0", clock.now() - 0.5)], "stamped when first rendered"
    other = bodies.get("cpu-1", 1)
    assert other != first, "each node its own"
    assert len(renders.calls) == 2
    await clock.advance(0.5)
    later = bodies.get("cpu-0", 1)
    assert later != first, "a new bucket"
    assert renders.calls[-1] == ("cpu-0", clock.now())
    assert len(bodies) == 1, "only the current bucket's bodies are kept"


def test_a_new_version_of_the_node_s_pods_renders_anew_within_the_bucket() -> None:
    clock, renders = FakeClock(), Renders()
    bodies = Bodies(renders, clock=clock)
    first = bodies.get("cpu-0", 1)
    changed = bodies.get("cpu-0", 2)
    assert changed != first
    assert len(renders.calls) == 2
    assert bodies.get("cpu-0", 2) is changed


def _facts(name: str, node: str, **annotations: str) -> PodFacts:
    return PodFacts({"metadata": {"uid": f"uid-{name}", "namespace": "ns", "name": name,
                                  "annotations": annotations},
                     "spec": {"nodeName": node, "containers": [{"name": "main", "image": "i"}]}})


def test_a_node_s_version_changes_with_its_pods_and_only_its_own() -> None:
    clock = FakeClock()
    now = clock.now()
    book = UsageBook(pool_of=lambda node: ("cpu", SPEC), created=lambda node: rfc3339(now))
    versions = [book.version("cpu-0")]

    def changed() -> bool:
        versions.append(book.version("cpu-0"))
        return versions[-1] != versions[-2]

    pod = _facts("web", "cpu-0")
    book.seen(pod, PodLife(), now)
    assert changed(), "a pod seen"
    book.lived(pod.uid, PodLife(phase=podlife.RUNNING, started_at=rfc3339(now)), now)
    assert changed(), "started"
    assert book.annotated(pod.uid, now) == ()
    assert not changed(), "nothing that shows changed"
    pod.recorded({"annotations": {"fakefleet.dev/usage-cpu": "2"}})
    book.annotated(pod.uid, now)
    assert changed(), "its usage annotation"
    other = _facts("db", "cpu-1")
    book.seen(other, PodLife(), now)
    assert not changed(), "another node's pod"
    book.gone(pod.uid, now)
    assert changed(), "gone"


def test_the_engine_s_bodies_follow_time_and_pods() -> None:
    clock = FakeClock()
    start = clock.now()
    book = UsageBook(pool_of=lambda node: ("cpu", SPEC), created=lambda node: rfc3339(start))
    renders = Renders()

    def render(node: str, now: float) -> bytes:
        renders(node, now)
        return kubelet.render(book.node_sample(node, now)).encode()

    bodies = Bodies(render, clock=clock)
    empty = bodies.get("cpu-0", book.version("cpu-0"))
    pod = _facts("web", "cpu-0")
    book.seen(pod, PodLife(phase=podlife.RUNNING, started_at=rfc3339(start)), start)
    with_pod = bodies.get("cpu-0", book.version("cpu-0"))
    assert b'pod="web"' not in empty
    assert b'pod="web"' in with_pod, "at once, within the same second"
    assert bodies.get("cpu-0", book.version("cpu-0")) is with_pod
    book.gone(pod.uid, start)
    assert b'pod="web"' not in bodies.get("cpu-0", book.version("cpu-0")), "gone at once"
    assert len(renders.calls) == 3
