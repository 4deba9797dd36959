# The fakefleet operator's image, as charts/fakefleet runs it.
#
# Stage 1 builds etcd, kube-apiserver, kube-scheduler and kube-controller-manager with
# fakefleet's own build code (`fakefleet binaries`: a wrapper module over k8s.io/kubernetes,
# from the Go module proxy) into a cache directory. Stage 2 is Python and fakefleet only, with
# that cache copied in: no Go toolchain, so a FakeCluster of another Kubernetes version, or
# with the Kueue, Karpenter or KubeRay add-on (which read their module source), says in its
# status that it cannot be served by this image.
#
#   docker build -t REGISTRY/fakefleet:0.1.0 --build-arg KUBERNETES_VERSION=v1.36.3 .
#
# Python packages come pinned from constraints.txt ('make constraints' writes it). The base
# images are tags; to pin them as well, on a machine that reaches the registry, resolve each to
# its digest and pass it in:
#
#   docker buildx imagetools inspect golang:1.26-bookworm --format '{{json .Manifest.Digest}}'
#   docker build --build-arg GO_IMAGE=golang:1.26-bookworm@sha256:<digest> \
#                --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> ...
ARG GO_IMAGE=golang:1.26-bookworm
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${GO_IMAGE} AS binaries
ARG KUBERNETES_VERSION=v1.36.3
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operators ./operators
COPY federation ./federation
COPY primitives ./primitives
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -c constraints.txt .
ENV FAKEFLEET_CACHE_DIR=/opt/fakefleet/cache
RUN /venv/bin/fakefleet binaries --kubernetes-version "${KUBERNETES_VERSION}" \
      --no-kueue --no-karpenter --no-kuberay --no-helm \
 && find /opt/fakefleet/cache -name '.*.work' -prune -exec rm -rf {} + \
 && find /opt/fakefleet/cache -name '.*.lock' -delete

FROM ${PYTHON_IMAGE}
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operators ./operators
COPY federation ./federation
COPY primitives ./primitives
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf /src
COPY --from=binaries /opt/fakefleet/cache /opt/fakefleet/cache
ENV FAKEFLEET_CACHE_DIR=/opt/fakefleet/cache \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The chart runs it as this user, with the state directory on a volume and /tmp an emptyDir;
# without a volume the directory is the image's own, writable by that user.
RUN mkdir -p /var/lib/fakefleet && chown 65532:65532 /var/lib/fakefleet
USER 65532:65532
WORKDIR /var/lib/fakefleet
ENTRYPOINT ["python", "-m", "operators"]
CMD ["--state-dir", "/var/lib/fakefleet"]
