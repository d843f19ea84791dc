"""Credentials for TLS and SuperNode authentication: a CA, a server certificate for the hosts, node key pairs."""

from __future__ import annotations

import ipaddress
import stat

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.exceptions import InvalidSignature  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.federated.credentials import make_credentials  # noqa: E402


def test_the_server_certificate_is_signed_by_the_ca_for_the_hosts(tmp_path):
    c = make_credentials(tmp_path / "certs", nodes=3, hosts=("localhost", "127.0.0.1", "10.0.0.7"))
    ca = x509.load_pem_x509_certificate(c.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(c.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                        ipaddress.ip_address("10.0.0.7")]
    key = serialization.load_pem_private_key(c.server_key.read_bytes(), password=None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    other = make_credentials(tmp_path / "other", nodes=1, hosts="example.org")  # one name, not its letters
    one = x509.load_pem_x509_certificate(other.server_cert.read_bytes())
    assert one.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["example.org"]
    with pytest.raises((ValueError, InvalidSignature)):  # another CA (same name, other key) did not issue it
        server.verify_directly_issued_by(x509.load_pem_x509_certificate(other.ca_cert.read_bytes()))


def test_node_keys_are_p384_pairs_in_the_formats_flower_takes(tmp_path):
    c = make_credentials(tmp_path / "certs", nodes=2)
    assert len(c.node_private_keys) == len(c.node_public_keys) == 2
    seen = set()
    for priv_p, pub_p in zip(c.node_private_keys, c.node_public_keys, strict=True):
        priv = serialization.load_ssh_private_key(priv_p.read_bytes(), password=None)
        pub = serialization.load_ssh_public_key(pub_p.read_bytes())
        assert isinstance(priv, ec.EllipticCurvePrivateKey) and isinstance(priv.curve, ec.SECP384R1)
        assert pub.public_numbers() == priv.public_key().public_numbers()
        assert pub_p.read_text().startswith("ecdsa-sha2-nistp384 ")
        seen.add(pub_p.read_bytes())
    assert len(seen) == 2  # every node has its own key


def test_private_keys_are_owner_only_and_nothing_is_overwritten(tmp_path):
    c = make_credentials(tmp_path / "certs", nodes=1)
    for p in (c.ca_key, c.server_key, *c.node_private_keys):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    before = c.ca_key.read_bytes()
    with pytest.raises(InputError, match="not empty"):
        make_credentials(tmp_path / "certs", nodes=1)
    assert c.ca_key.read_bytes() == before
    (tmp_path / "empty").mkdir()
    assert make_credentials(tmp_path / "empty", nodes=1).folder == tmp_path / "empty"


def test_flower_options_name_the_files(tmp_path):
    c = make_credentials(tmp_path / "certs", nodes=2)
    link = c.superlink_args()
    assert link[link.index("--ssl-certfile") + 1] == str(c.server_cert) and "--enable-supernode-auth" in link
    node = c.supernode_args(1)
    assert node == ["--root-certificates", str(c.ca_cert), "--auth-supernode-private-key",
                    str(c.node_private_keys[1])]
    with pytest.raises(ConfigError, match="node 2 has no key"):
        c.supernode_args(2)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"nodes": 0}, "nodes is 0"),
    ({"nodes": True}, "nodes is True"),
    ({"nodes": 1, "days": 0}, "days is 0"),
    ({"nodes": 1, "hosts": ()}, "hosts"),
    ({"nodes": 1, "hosts": ("",)}, "hosts"),
])
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_credentials(tmp_path / "certs", **kwargs)
    assert not (tmp_path / "certs").exists()


# ------------------------------------------------------------------------------------- with real processes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_tls_superlink_admits_a_registered_node_and_refuses_an_unregistered_one(tmp_path):
    """Real ``flower-superlink`` / ``flower-supernode`` processes on loopback ports, TLS and node authentication
    with :func:`make_credentials`' files: node 0 is registered (``flwr supernode register``) and goes online,
    node 1 is not and is refused."""
    import json
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    bindir = Path(sys.executable).parent
    tools = {t: shutil.which(t, path=str(bindir)) or shutil.which(t)
             for t in ("flower-superlink", "flower-supernode", "flwr")}
    if not all(tools.values()):
        pytest.skip("Flower's command-line tools are not installed (the federated extra)")
    c = make_credentials(tmp_path / "certs", nodes=2)
    port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{port}"\nroot-certificates = "{c.ca_cert}"\n')
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
           "PATH": os.pathsep.join([str(bindir), os.environ.get("PATH", "")])}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(p)
        return p

    def nodes() -> list[dict[str, str]]:
        out = subprocess.run([tools["flwr"], "supernode", "list", "local", "--format", "json"], env=env,
                             capture_output=True, text=True, timeout=60)
        try:
            return list(json.loads(out.stdout).get("nodes", []))
        except ValueError:
            return []

    try:
        start("superlink", [tools["flower-superlink"], *c.superlink_args(), "--disable-runtime-dependency-installation",
                            "--host", "127.0.0.1", "--port", str(port)])
        deadline = time.monotonic() + 60
        registered = None
        while registered is None and time.monotonic() < deadline:
            r = subprocess.run([tools["flwr"], "supernode", "register", str(c.node_public_keys[0]), "local",
                                "--format", "json"], env=env, capture_output=True, text=True, timeout=60)
            try:
                registered = json.loads(r.stdout).get("node-id")
            except ValueError:
                time.sleep(1)
        assert registered is not None, (tmp_path / "superlink.log").read_text(errors="replace")[-2000:]
        for k in (0, 1):
            start(f"node-{k}", [tools["flower-supernode"], *c.supernode_args(k), "--superlink", f"127.0.0.1:{port}",
                                "--host", "127.0.0.1", "--port", str(_free_port())])
        deadline = time.monotonic() + 90
        online = refused = False
        while time.monotonic() < deadline and not (online and refused):
            online = online or any(n.get("status") == "online" for n in nodes())
            refused = refused or "Failed to activate SuperNode" in (tmp_path / "node-1.log").read_text(errors="replace")
            time.sleep(1)
        assert online, (tmp_path / "node-0.log").read_text(errors="replace")[-2000:]
        assert refused, (tmp_path / "node-1.log").read_text(errors="replace")[-2000:]
        assert len(nodes()) == 1  # only the registered key is known to the SuperLink
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
