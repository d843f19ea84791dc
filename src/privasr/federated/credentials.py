"""Credentials for a Flower deployment with TLS and SuperNode authentication, made with ``cryptography``.

Flower (``flwr`` 1.42) secures the SuperLink with ``flower-superlink --ssl-ca-certfile CA --ssl-certfile CERT
--ssl-keyfile KEY`` (SuperNodes verify it with ``--root-certificates CA``) and authenticates SuperNodes with
``--enable-supernode-auth``: each SuperNode holds an elliptic-curve key pair (NIST P-384,
``--auth-supernode-private-key``), and only nodes whose public key (OpenSSH format) was registered with the
SuperLink may connect. :func:`make_credentials` writes what a test or a first deployment needs:

* ``ca.crt`` / ``ca.key``: a private certificate authority (keep ``ca.key`` off the nodes);
* ``server.crt`` / ``server.key``: the SuperLink's certificate for the given host names and addresses, signed
  by the CA;
* ``nodes/node-K.key`` / ``nodes/node-K.pub``: one P-384 key pair per SuperNode, both in OpenSSH format
  (what ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` read).

Private keys are written with mode 0600. Nothing existing is overwritten. For production, use your
organisation's CA and key management; these are for tests and first deployments.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     creds = make_credentials(Path(d) / "certs", nodes=2)
...     [p.name for p in creds.node_public_keys], creds.server_cert.name
(['node-0.pub', 'node-1.pub'], 'server.crt')
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.errors import ConfigError, InputError

__all__ = ["Credentials", "make_credentials", "DEFAULT_HOSTS"]

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Names and addresses the server certificate is valid for by default (a loopback deployment)."""


@dataclass(frozen=True)
class Credentials:
    """The files :func:`make_credentials` wrote."""

    folder: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    node_private_keys: tuple[Path, ...]
    node_public_keys: tuple[Path, ...]

    @classmethod
    def in_folder(cls, folder: str | os.PathLike[str], nodes: int) -> Credentials:
        """The files :func:`make_credentials` writes into ``folder`` for ``nodes`` SuperNodes (paths only; nothing
        is read or checked).

        >>> Credentials.in_folder("certs", 2).node_public_keys[1].as_posix()
        'certs/nodes/node-1.pub'
        """
        out = Path(folder)
        return cls(out, out / "ca.crt", out / "ca.key", out / "server.crt", out / "server.key",
                   tuple(out / "nodes" / f"node-{k}.key" for k in range(nodes)),
                   tuple(out / "nodes" / f"node-{k}.pub" for k in range(nodes)))

    def superlink_args(self) -> list[str]:
        """The ``flower-superlink`` TLS and authentication options for these files."""
        return ["--ssl-ca-certfile", str(self.ca_cert), "--ssl-certfile", str(self.server_cert),
                "--ssl-keyfile", str(self.server_key), "--enable-supernode-auth"]

    def supernode_args(self, node: int) -> list[str]:
        """The ``flower-supernode`` options of node ``node``: verify the SuperLink, sign with its key."""
        if not 0 <= node < len(self.node_private_keys):
            raise ConfigError(f"node {node} has no key", expected=f"0 to {len(self.node_private_keys) - 1}")
        return ["--root-certificates", str(self.ca_cert),
                "--auth-supernode-private-key", str(self.node_private_keys[node])]


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write a new file (never an existing one); private keys get mode 0600 from the start."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(hosts: Sequence[str]) -> Any:
    from cryptography import x509

    names: list[Any] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "privasr"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, public_key: Any, issuer: str, issuer_key: Any, days: int, *, ca: bool,
                 hosts: Sequence[str] = ()) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(public_key).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                          crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    else:
        b = b.add_extension(_san(hosts), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_credentials(folder: str | os.PathLike[str], nodes: int, *, hosts: Sequence[str] = DEFAULT_HOSTS,
                     days: int = 365) -> Credentials:
    """Write a private CA, a SuperLink certificate for ``hosts`` and ``nodes`` SuperNode key pairs into ``folder``.

    Raises:
        ConfigError: ``nodes`` or ``days`` is not a positive integer, ``hosts`` is empty.
        InputError: ``folder`` exists and is not empty (nothing is overwritten).
    """
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:  # pragma: no cover - cryptography comes with flwr
        raise ConfigError("making credentials needs the cryptography package",
                          expected="pip install privasr[federated]") from None
    for name, v in (("nodes", nodes), ("days", days)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} is {v!r}", expected="an integer >= 1")
    if isinstance(hosts, str):
        hosts = (hosts,)
    if not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError(f"hosts is {list(hosts)!r}", expected="host names or IP addresses of the SuperLink")
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError("the credentials folder exists and is not empty", path=out,
                         expected="a new or empty folder (existing keys are never overwritten)")
    (out / "nodes").mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = _certificate("privasr federation CA", ca_key.public_key(), "privasr federation CA", ca_key, days,
                           ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = _certificate("privasr SuperLink", server_key.public_key(), "privasr federation CA", ca_key, days,
                               ca=False, hosts=hosts)
    creds = Credentials.in_folder(out, nodes)
    _write(creds.ca_cert, ca_cert.public_bytes(pem), False)
    _write(creds.ca_key, ca_key.private_bytes(pem, pkcs8, plain), True)
    _write(creds.server_cert, server_cert.public_bytes(pem), False)
    _write(creds.server_key, server_key.private_bytes(pem, pkcs8, plain), True)
    for p, q in zip(creds.node_private_keys, creds.node_public_keys, strict=True):
        key = ec.generate_private_key(ec.SECP384R1())
        _write(p, key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, plain), True)
        _write(q, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                serialization.PublicFormat.OpenSSH) + b"\n", False)
    return creds
