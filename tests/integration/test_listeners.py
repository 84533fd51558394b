"""Nothing the default `sloserve serve` starts listens beyond 127.0.0.1.

The gateway and every process of its embedded Ray (GCS, raylet, agents, workers, the Serve controller
and replicas): every socket they listen on is on a loopback address, and a connection to each of those ports through the host's own network address is refused.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.shared_ray]  # servers("ray"): the shared Ray server


def listeners(pid: int) -> list[tuple[str, str, int]]:
    """(process, address, port) of every listening TCP socket of ``pid``, its descendants (Ray's
    workers: the Serve controller and replicas) and its process group (Ray's daemons)."""
    root = psutil.Process(pid)
    procs = {root, *root.children(recursive=True)}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == os.getpgid(pid):
                procs.add(p)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    out = []
    for p in procs:
        try:
            # the executable's own name first: a command line's path prefix depends on where
            # the checkout lives, and Ray's daemons are named by their binaries
            cmd = p.cmdline()
            exe = os.path.basename(cmd[0]) if cmd else ""
            name = f"{p.name()} {exe} {' '.join(cmd[1:3])}"[:160]
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.append((name, c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return out


def on_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(a, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's IPv4 loopback
    return (mapped or a).is_loopback


def host_address() -> str | None:
    """This host's own non-loopback address (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if on_loopback(ip) else ip


def test_the_default_server_and_its_ray_listen_on_loopback_only(servers):
    srv = servers("ray")
    found = listeners(srv.proc.pid)
    ports = {port for _, _, port in found}
    assert srv.http_port in ports and srv.grpc_port in ports, found
    names = " ".join(name for name, _, _ in found)
    for part in ("gcs_server", "raylet", "ServeReplica"):
        assert part in names, f"no listener of {part} found: {found}"
    print("listeners:", *sorted(found, key=lambda x: x[2]), sep="\n  ")
    beyond = [x for x in found if not on_loopback(x[1])]
    assert not beyond, f"listening beyond loopback: {beyond}"
    host = host_address()
    if host is None:
        pytest.skip("this host has no non-loopback address to connect from")
    for name, _, port in found:
        with socket.socket() as s:
            s.settimeout(2)
            with pytest.raises(OSError):
                s.connect((host, port))
                pytest.fail(f"{name} answered on {host}:{port}")


def test_the_default_servers_replicas_run_at_the_gateways_priority(servers):
    """Ray starts its workers at niceness 15 unless told otherwise: a replica would then wait behind
    the gateway and the clients on a busy host. The embedded Ray starts them at the gateway's."""
    srv = servers("ray")
    gateway = psutil.Process(srv.proc.pid)
    replicas = [p for p in gateway.children(recursive=True) if "ServeReplica" in " ".join(p.cmdline()[:1])]
    for p in psutil.process_iter():  # Ray's workers may belong to the raylet rather than the gateway
        try:
            if "ServeReplica" in " ".join(p.cmdline()[:1]) and os.getpgid(p.pid) == os.getpgid(srv.proc.pid):
                replicas.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    assert replicas, "no Serve replica process found"
    assert {p.nice() for p in replicas} == {gateway.nice()}, [(p.cmdline()[:1], p.nice()) for p in replicas]
