"""A machine's TLS identity: a self-signed certificate kept with its key (0600), and the
SHA-256 fingerprint that pairing pins. No certificate authority: the pairing code is what
makes a host trust a worker's certificate, and the fingerprint is what it checks after."""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def short(fingerprint_hex: str) -> str:
    """The first 16 hex digits in groups of four, for people to compare."""
    return " ".join(fingerprint_hex[i:i + 4] for i in range(0, 16, 4))


def ensure_identity(folder: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) in `folder`, created on first use."""
    cert, key = folder / "gateway.crt", folder / "gateway.key"
    if cert.exists() and key.exists():
        return cert, key
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"homerack worker {name}"[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .sign(private, hashes.SHA256()))
    _write_private(key, private.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    _write_private(cert, certificate.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def certificate_fingerprint(cert: Path) -> str:
    der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    return fingerprint(der)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    return context


def client_context() -> ssl.SSLContext:
    """Encryption without a CA: the caller checks the peer's fingerprint itself
    (`peer_fingerprint`) before sending anything."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def peer_fingerprint(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> str:
    return fingerprint(ssl_object.getpeercert(binary_form=True))
