"""The webhook's self-signed TLS (vlm_operator.cluster.certs): made, kept while valid, renewed before expiry, and a
real TLS handshake against the CA bundle for each of the Service's names."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import tempfile
import threading

import pytest
from cryptography import x509

from vlm_operator.cluster import certs

# The real time: the handshakes check validity against the system clock (plan takes it as an argument).
NOW = dt.datetime.now(dt.UTC)
HOSTS = certs.service_hosts("vlm-operator-webhook", "vlm-system", ["127.0.0.1"])


def _handshake(bundle: certs.Bundle, server_name: str, ca: bytes | None = None) -> None:
    """A TLS handshake: a server with the bundle's pair, a client trusting `ca` (the caBundle) and checking
    `server_name` as the API server does."""
    with tempfile.NamedTemporaryFile() as crt, tempfile.NamedTemporaryFile() as key:
        crt.write(bundle.tls_crt), key.write(bundle.tls_key)
        crt.flush(), key.flush()
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(crt.name, key.name)
    client_ctx = ssl.create_default_context(cadata=(ca or bundle.ca_bundle).decode())
    listener = socket.create_server(("127.0.0.1", 0))
    errors: list[BaseException] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            errors.append(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with socket.create_connection(listener.getsockname()) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=server_name) as s:
            s.sendall(b"x")
    finally:
        t.join(5)
        listener.close()


def _issued_by(crt: bytes, ca: bytes) -> None:
    x509.load_pem_x509_certificate(crt).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))


def test_fresh_bundle_serves_every_service_name():
    bundle, why = certs.plan(None, HOSTS, NOW)
    assert bundle is not None and why == "no CA" and not bundle.previous_ca
    for name in ("vlm-operator-webhook.vlm-system.svc", "vlm-operator-webhook.vlm-system.svc.cluster.local",
                 "127.0.0.1"):
        _handshake(bundle, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(bundle, "other.vlm-system.svc")
    # Another CA does not verify it.
    other, _ = certs.plan(None, HOSTS, NOW)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(bundle, HOSTS[2], ca=other.ca_crt)


def test_kept_while_valid_and_round_trips_through_the_secret():
    bundle, _ = certs.plan(None, HOSTS, NOW)
    again = certs.Bundle.from_secret_data(bundle.secret_data())
    assert again == bundle
    assert certs.plan(again, HOSTS, NOW + dt.timedelta(days=200)) == (None, "valid")


def test_serving_certificate_renewed_before_expiry_under_the_same_ca():
    bundle, _ = certs.plan(None, HOSTS, NOW)
    later = NOW + dt.timedelta(days=250)  # 115 days left of 365: under a third
    renewed, why = certs.plan(bundle, HOSTS, later)
    assert why == "certificate renewal due"
    assert renewed.ca_crt == bundle.ca_crt and renewed.tls_crt != bundle.tls_crt
    assert certs.not_after(renewed.tls_crt) > later + dt.timedelta(days=300)
    # The caBundle already written still trusts it.
    _issued_by(renewed.tls_crt, bundle.ca_crt)


def test_hosts_change_or_a_foreign_certificate_reissue_it():
    bundle, _ = certs.plan(None, HOSTS, NOW)
    moved, why = certs.plan(bundle, certs.service_hosts("hook", "other"), NOW)
    assert why == "hosts changed" and moved.ca_crt == bundle.ca_crt
    other, _ = certs.plan(None, HOSTS, NOW)
    mixed = certs.Bundle(bundle.ca_crt, bundle.ca_key, other.tls_crt, other.tls_key)
    assert certs.plan(mixed, HOSTS, NOW)[1] == "certificate not signed by the CA"
    garbled = certs.Bundle(bundle.ca_crt, bundle.ca_key, b"junk", b"junk")
    fixed, why = certs.plan(garbled, HOSTS, NOW)
    assert why == "certificate unreadable" and fixed.ca_crt == bundle.ca_crt
    _handshake(fixed, HOSTS[0])


def test_ca_renewal_keeps_the_old_ca_trusted_until_it_expires():
    bundle, _ = certs.plan(None, HOSTS, NOW)
    late = NOW + dt.timedelta(days=2500)  # 1150 days of 3650 left: under a third
    renewed, why = certs.plan(bundle, HOSTS, late)
    assert why == "CA renewal due" and renewed.ca_crt != bundle.ca_crt
    assert renewed.previous_ca == bundle.ca_crt
    assert renewed.ca_bundle == renewed.ca_crt + bundle.ca_crt
    # The new serving cert chains to the new CA; the caBundle trusts both.
    assert len(x509.load_pem_x509_certificates(renewed.ca_bundle)) == 2
    _issued_by(renewed.tls_crt, renewed.ca_crt)
    # Once the old CA has expired, it leaves the bundle.
    after = NOW + dt.timedelta(days=3651)
    gone, why = certs.plan(renewed, HOSTS, after)
    assert why == "certificate renewal due" and gone.previous_ca == b""
    crt, key = certs.new_serving(renewed.ca_crt, renewed.ca_key, HOSTS, after)
    current = certs.Bundle(renewed.ca_crt, renewed.ca_key, crt, key, renewed.previous_ca)
    gone, why = certs.plan(current, HOSTS, after)
    assert why == "previous CA expired" and gone.previous_ca == b"" and gone.tls_crt == crt


def test_secret_without_a_serving_pair_or_ca_key():
    assert certs.Bundle.from_secret_data({}) is None
    assert certs.Bundle.from_secret_data(None) is None
    bundle, _ = certs.plan(None, HOSTS, NOW)
    # cert-manager's Secret has no ca.key: the operator would make its own CA (it never plans for cert-manager).
    data = {k: v for k, v in bundle.secret_data().items() if k != "ca.key"}
    read = certs.Bundle.from_secret_data(data)
    assert read is not None and read.ca_key == b""
    assert certs.plan(read, HOSTS, NOW)[1] == "CA unreadable"
