"""The injection webhook's own TLS: a self-signed CA and the serving certificate it signs, and when to renew them.

Pure: the clock is an argument, nothing is read or written here (`vlm_operator.admission.webhook` keeps the result in a
Secret and the CA in the MutatingWebhookConfiguration's caBundle). ECDSA P-256 keys, made in about a millisecond.

Lifetimes: the CA 10 years, the serving certificate 1 year; each is renewed once less than a third of its
lifetime is left, or when it no longer fits (other hosts, not signed by the CA, unreadable). A renewed CA keeps
the previous one in the caBundle until that expires, so the API server trusts the certificate served before
the renewal and the one served after it.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=3650)
SERVING_LIFETIME = dt.timedelta(days=365)
# Renew once less than this fraction of the lifetime is left.
RENEW_FRACTION = 1 / 3
# Backdated, for API servers whose clock is a little behind the operator's.
CLOCK_SKEW = dt.timedelta(minutes=5)
ORGANIZATION = "vlm-operator"
# The Secret's keys: tls.crt/tls.key as kubernetes.io/tls has them, ca.crt as cert-manager writes it.
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
PREVIOUS_CA = "ca-previous.crt"


@dataclass(frozen=True)
class Bundle:
    """PEM bytes: the CA (its key only when the operator made it), the serving pair, and a CA being retired."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes
    previous_ca: bytes = b""

    @property
    def ca_bundle(self) -> bytes:
        """What the webhook's caBundle holds: the CA, and the previous one while it is still valid."""
        return self.ca_crt + self.previous_ca

    def secret_data(self) -> dict[str, str]:
        data = dict(zip(KEYS, (self.ca_crt, self.ca_key, self.tls_crt, self.tls_key), strict=True))
        if self.previous_ca:
            data[PREVIOUS_CA] = self.previous_ca
        return {k: base64.b64encode(v).decode() for k, v in data.items()}

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str] | None) -> Bundle | None:
        """The bundle in a Secret's `data`; None when the serving pair is missing (ca.key may be: cert-manager's)."""
        data = data or {}
        raw = {k: base64.b64decode(data.get(k) or "") for k in (*KEYS, PREVIOUS_CA)}
        if not (raw["tls.crt"] and raw["tls.key"]):
            return None
        return cls(raw["ca.crt"], raw["ca.key"], raw["tls.crt"], raw["tls.key"], raw[PREVIOUS_CA])


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The names the API server may dial the webhook's Service by, then `extra` (names or IP addresses)."""
    names = (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")
    return tuple(dict.fromkeys((*names, *extra)))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(out)


def new_ca(now: dt.datetime) -> tuple[bytes, bytes]:
    key = _key()
    name = _name(f"{ORGANIZATION} webhook CA")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_serving(ca_crt: bytes, ca_key: bytes, hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_crt)
    signer = serialization.load_pem_private_key(ca_key, None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)  # only ever our own CA's key
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(min(now + SERVING_LIFETIME, ca.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
            .sign(signer, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _renew_due(cert: x509.Certificate, lifetime: dt.timedelta, now: dt.datetime) -> bool:
    return cert.not_valid_after_utc - now < lifetime * RENEW_FRACTION or cert.not_valid_before_utc > now


def _hosts_of(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {*san.get_values_for_type(x509.DNSName), *(str(i) for i in san.get_values_for_type(x509.IPAddress))}


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def plan(existing: Bundle | None, hosts: Sequence[str], now: dt.datetime) -> tuple[Bundle | None, str]:
    """The bundle to store instead of `existing` (None: keep it) and why, for `hosts` at `now`."""
    ca: x509.Certificate | None = None
    if existing is not None and existing.ca_key:
        try:
            ca = x509.load_pem_x509_certificate(existing.ca_crt)
            serialization.load_pem_private_key(existing.ca_key, None)
        except ValueError:
            ca = None
    if ca is None or _renew_due(ca, CA_LIFETIME, now):
        ca_crt, ca_key = new_ca(now)
        previous = b""
        if ca is not None and ca.not_valid_after_utc > now:
            previous = existing.ca_crt  # type: ignore[union-attr]  # ca came from it
        crt, key = new_serving(ca_crt, ca_key, hosts, now)
        why = "no CA" if existing is None else ("CA unreadable" if ca is None else "CA renewal due")
        return Bundle(ca_crt, ca_key, crt, key, previous), why
    reason = ""
    try:
        serving = x509.load_pem_x509_certificate(existing.tls_crt)  # type: ignore[union-attr]
        serialization.load_pem_private_key(existing.tls_key, None)  # type: ignore[union-attr]
    except ValueError:
        reason = "certificate unreadable"
    else:
        if _renew_due(serving, SERVING_LIFETIME, now):
            reason = "certificate renewal due"
        elif _hosts_of(serving) != set(hosts):
            reason = "hosts changed"
        elif not _signed_by(serving, ca):
            reason = "certificate not signed by the CA"
    previous = existing.previous_ca  # type: ignore[union-attr]
    if previous:
        try:
            expired = x509.load_pem_x509_certificate(previous).not_valid_after_utc <= now
        except ValueError:
            expired = True
        if expired:
            previous, reason = b"", reason or "previous CA expired"
    if not reason:
        return None, "valid"
    assert existing is not None
    if reason.startswith("certificate") or reason == "hosts changed":
        crt, key = new_serving(existing.ca_crt, existing.ca_key, hosts, now)
        return Bundle(existing.ca_crt, existing.ca_key, crt, key, previous), reason
    return Bundle(existing.ca_crt, existing.ca_key, existing.tls_crt, existing.tls_key, previous), reason


def not_after(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
