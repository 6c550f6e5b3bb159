"""Certificates for the admission webhook: a long-lived CA and the short-lived serving certificates it signs.

Why our own and not kopf's: kopf's self-signed certificate is one certificate generated per start (no CA, so the
caBundle would change on every restart) and loaded once; the API server must trust the serving certificate across
restarts and rotations. A CA kept in a Secret gives a caBundle that changes only when the CA itself is renewed,
while serving certificates are reissued freely (every start, and before expiry) without touching the webhook
configuration. Why not cert-manager by default: the chart must work with no extra components (it stays an option).

Pure functions over PEM bytes (the `cryptography` library; ECDSA P-256 keys: fast to generate, accepted by Go's
TLS stack in kube-apiserver).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=3650)
CA_RENEW_BEFORE = dt.timedelta(days=365)  # old and new CA overlap this long in the caBundle
SERVING_LIFETIME = dt.timedelta(days=30)
SERVING_RENEW_BEFORE = dt.timedelta(days=10)
CLOCK_SKEW = dt.timedelta(minutes=5)  # certificates start this much in the past: nodes' clocks differ


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def not_after(self) -> dt.datetime:
        return self.cert.not_valid_after_utc


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_ca(common_name: str, now: dt.datetime, lifetime: dt.timedelta = CA_LIFETIME) -> KeyPair:
    """A self-signed CA that may sign only end-entity certificates (path length 0)."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving(ca: KeyPair, dns_names: Sequence[str], now: dt.datetime,
                  lifetime: dt.timedelta = SERVING_LIFETIME) -> KeyPair:
    """A TLS server certificate for `dns_names` (the first is the subject), signed by `ca`, never outliving it."""
    if not dns_names:
        raise ValueError("a serving certificate needs at least one DNS name")
    ca_cert = ca.cert
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA's key is not an ECDSA key")
    key = _key()
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def due(cert_pem: bytes, now: dt.datetime, renew_before: dt.timedelta) -> bool:
    """True when the certificate expires within `renew_before` (or has expired)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc - renew_before <= now


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether `ca_pem` signed `cert_pem` (a serving certificate from before a CA renewal is not)."""
    try:
        x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def bundle(cas: Iterable[bytes], now: dt.datetime) -> bytes:
    """The caBundle: every CA certificate given that has not expired, each once, in order."""
    out: list[bytes] = []
    for raw in cas:
        pem = raw.strip() + b"\n"
        if pem not in out and x509.load_pem_x509_certificate(pem).not_valid_after_utc > now:
            out.append(pem)
    return b"".join(out)


def split_bundle(pem: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as PEM."""
    return [c.public_bytes(serialization.Encoding.PEM) for c in x509.load_pem_x509_certificates(pem)] if pem.strip() \
        else []
