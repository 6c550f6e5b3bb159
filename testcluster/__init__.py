"""A real Kubernetes control plane for tests and the demo, built from upstream Go modules (never shipped in the wheel).

What runs: etcd (data on tmpfs, --unsafe-no-fsync), kube-apiserver (RBAC, service-account issuer and keys so
TokenRequest works, client-certificate users, aggregator routing, front-proxy certificates, a Metadata-level audit
log), kube-controller-manager (only `cluster.CONTROLLERS`, each with its own service-account credentials),
kube-scheduler and kwok (fake nodes; pods on them go Running/Ready as a kubelet would report). The binaries come
from `make cluster-bin` (a cache outside the clone, see scripts/build-cluster-bin.sh).

Network: every component runs inside a network namespace of its own with no route out (testcluster.netns), set up
fail-closed and proven before anything starts, entered through a pin of this cluster's own so a cluster started
beside it never shares it; the host reaches the API server at the namespace's veth address.
Needs root and CAP_NET_ADMIN: without them `start` raises `NetnsError` saying so.

API (everything else is internal):

    from testcluster import cluster, nodes
    with cluster.running(tmp_dir) as kube:        # or kube = cluster.start(dir) ... kube.stop()
        kube.server, kube.kubeconfig, kube.ca_file    # https://172.29.S.2:6443, admin kubeconfig path, CA
        kube.kubectl("apply", "-f", path)             # the real kubectl as admin (check=True raises ClusterError)
        kube.token_kubeconfig(ns, sa, path)           # a kubeconfig with a TokenRequest token of that SA
        kube.audit_events()                           # parsed audit log: one event per completed request
        kube.log("kube-apiserver")                    # a component's log file
        kube.kubectl("apply", "-f", "-", input=nodes.node_yaml("gpu-1", labels=..., gpus=1))
    cluster.load(dir)                                  # a Cluster started by another process (`up`)

    from testcluster import images, node              # a real node: kubelet + containerd + runc (testcluster.node)
    n = node.start(kube, "node-a", index=0, directory=d, archives=[images.busybox()])   # Ready when it returns
    n.ip, n.pod_cidr, n.enter(), n.ctr("images", "ls")  # its address, its pods' /24, nsenter prefix, containerd
    n.crash()                                          # SIGKILL its kubelet, containerd, shims and containers
    n.stop()                                           # or node.stop(node.load(d, kube).state)

Command line: `python -m testcluster up [--dir DIR]` (prints the kubeconfig), `python -m testcluster down [--dir DIR]`.
"""
