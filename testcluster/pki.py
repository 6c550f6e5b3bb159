"""The certificates and keys a bare control plane needs, made with `cryptography` (no openssl or cfssl binary).

One cluster CA signs the API server's serving certificate and the client certificates of the users (admin, the
controller manager, the scheduler, kwok); a second CA signs the front-proxy client the API server presents to
aggregated API servers (they trust it through `--requestheader-client-ca-file`); one key pair signs and verifies
service-account tokens, so TokenRequest works. EC P-256 keys: they are generated in milliseconds where RSA takes
seconds per key, and every component accepts them.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class Authority:
    """A CA that issues leaf certificates into one directory."""

    def __init__(self, directory: Path, name: str, *, existing: bool = False) -> None:
        self.directory = directory
        self.pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
        if existing:  # a CA written earlier (the cluster's, for nodes that join after it started)
            key = serialization.load_pem_private_key(self.pair.key.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise TypeError(f"{self.pair.key} is not an EC key")
            self._key = key
            self._cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())
            return
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.pair.key)

    def issue(self, filename: str, common_name: str, *, orgs: tuple[str, ...] = (), server: bool = False,
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> Pair:
        """A leaf certificate: a client certificate for `common_name`/`orgs`, or a serving one with the SANs."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server \
            else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, orgs)).issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.directory / f"{filename}.crt", self.directory / f"{filename}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


@dataclass(frozen=True)
class ClusterPKI:
    """Every file the components are started with."""

    ca: Pair
    front_proxy_ca: Pair
    apiserver: Pair
    front_proxy_client: Pair
    service_account_key: Path
    service_account_pub: Path
    users: dict[str, Pair]
    kubelet_client: Pair  # what the API server presents to kubelets (logs, exec, port-forward)


# user name -> (certificate file stem, groups). The controller manager and the scheduler get the identities their
# bootstrap ClusterRoleBindings name; admin and kwok are cluster admins.
USERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("admin", ("system:masters",)),
    "system:kube-controller-manager": ("kube-controller-manager", ()),
    "system:kube-scheduler": ("kube-scheduler", ()),
    "kwok": ("kwok", ("system:masters",)),
}


def make_pki(directory: Path, *, advertise_address: str, service_ip: str) -> ClusterPKI:
    """Write a fresh PKI for one cluster into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority(directory, "ca")
    front = Authority(directory, "front-proxy-ca")
    apiserver = ca.issue(
        "apiserver", "kube-apiserver", server=True,
        dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
             "localhost"),
        ips=(advertise_address, service_ip, "127.0.0.1"),
    )
    front_client = front.issue("front-proxy-client", "front-proxy-client")
    users = {user: ca.issue(stem, user, orgs=groups) for user, (stem, groups) in USERS.items()}
    # kubeadm's name for it; a kubelet authorizes each of its requests by a SubjectAccessReview like any other
    # caller's (authorization mode Webhook), which system:masters passes
    kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",))
    sa_key = _key()
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_key, sa_key_path)
    sa_pub_path.write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
    return ClusterPKI(ca=ca.pair, front_proxy_ca=front.pair, apiserver=apiserver, front_proxy_client=front_client,
                      service_account_key=sa_key_path, service_account_pub=sa_pub_path, users=users,
                      kubelet_client=kubelet_client)


def node_credentials(directory: Path, node: str, node_ip: str) -> tuple[Pair, Pair]:
    """A node's client certificate (system:node:<name> in system:nodes: the Node authorizer's and NodeRestriction's
    identity for its kubelet) and its kubelet's serving certificate for its address, from the cluster's CA in
    `directory` (the API server verifies that one: --kubelet-certificate-authority)."""
    ca = Authority(directory, "ca", existing=True)
    client = ca.issue(f"node-{node}", f"system:node:{node}", orgs=("system:nodes",))
    serving = ca.issue(f"node-{node}-serving", f"system:node:{node}", server=True, dns=(node,), ips=(node_ip,))
    return client, serving


def proxy_credentials(directory: Path, node: str) -> Pair:
    """A node's kube-proxy client certificate: user system:kube-proxy, whom the API server's bootstrap
    ClusterRoleBinding system:node-proxier grants what kube-proxy reads (Services, EndpointSlices, Nodes, events)."""
    return Authority(directory, "ca", existing=True).issue(f"node-{node}-proxy", "system:kube-proxy")
