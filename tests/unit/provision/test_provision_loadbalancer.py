"""haproxy config rendering and admin-socket answers parsing (no haproxy process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.provision import loadbalancer as lb

pytestmark = pytest.mark.unit

BACKENDS = [lb.Backend("cp1", "10.5.0.2"), lb.Backend("cp2", "10.5.0.3")]


def _render(tmp_path: Path, backends: list[lb.Backend] = BACKENDS) -> str:
    return lb.render_config(
        bind_address="10.5.0.1",
        backends=backends,
        admin_socket=tmp_path / "admin.sock",
        server_state_file=tmp_path / "servers.state",
    )


def test_config_is_a_tcp_endpoint_with_ssl_readyz_checks(tmp_path: Path) -> None:
    lines = [line.strip() for line in _render(tmp_path).splitlines()]
    assert "mode tcp" in lines
    assert "bind 10.5.0.1:6443" in lines
    assert "option httpchk GET /readyz" in lines
    assert "http-check expect status 200" in lines
    assert "default-server inter 1s fall 2 rise 1" in lines
    assert "server cp1 10.5.0.2:6443 check check-ssl verify none" in lines
    assert "server cp2 10.5.0.3:6443 check check-ssl verify none" in lines
    assert f"stats socket {tmp_path / 'admin.sock'} mode 600 level admin" in lines
    assert f"server-state-file {tmp_path / 'servers.state'}" in lines
    assert "load-server-state-from-file global" in lines


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    assert _render(tmp_path) == _render(tmp_path)


def test_duplicate_server_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(lb.LoadBalancerError, match="unique"):
        _render(tmp_path, [lb.Backend("cp1", "10.5.0.2"), lb.Backend("cp1", "10.5.0.3")])


def test_too_long_socket_path_is_refused_with_a_remedy(tmp_path: Path) -> None:
    with pytest.raises(lb.LoadBalancerError, match="KUBEPLANE_STATE"):
        lb.render_config(
            bind_address="10.5.0.1",
            backends=BACKENDS,
            admin_socket=Path("/" + "x" * 120),
            server_state_file=tmp_path / "s",
        )


SHOW_STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,check_status,addr\n"
    "control-plane-endpoint,FRONTEND,,,0,0,,0,OPEN,,\n"
    "control-plane,cp1,0,0,3,3,,5,UP,L7OK,10.5.0.2:6443\n"
    "control-plane,cp2,0,0,0,0,,0,MAINT,L7OK,10.5.0.3:6443\n"
    "control-plane,cp3,0,0,0,0,,0,DRAIN,L7OK,10.5.0.4:6443\n"
    "control-plane,cp4,0,0,0,0,,0,UP 1/2,L7STS,10.5.0.5:6443\n"
    "control-plane,BACKEND,0,0,3,3,,5,UP,,\n"
    "\n"
)


def test_server_states_parse_show_stat(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proxy = lb.HAProxy(tmp_path)
    monkeypatch.setattr(proxy, "admin", lambda command: SHOW_STAT)
    states = proxy.server_states()
    assert list(states) == ["cp1", "cp2", "cp3", "cp4"]
    assert states["cp1"] == lb.ServerStatus("cp1", "10.5.0.2:6443", "UP", "L7OK", 3)
    assert [s.in_rotation for s in states.values()] == [True, False, False, True]
    # Going down (UP 1/2) still takes connections but is not healthy.
    assert [s.healthy for s in states.values()] == [True, False, False, False]


def test_set_server_state_refuses_unknown_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proxy = lb.HAProxy(tmp_path)
    sent: list[str] = []

    def admin(command: str) -> str:
        sent.append(command)
        return SHOW_STAT if command == "show stat" else ""

    monkeypatch.setattr(proxy, "admin", admin)
    proxy.set_server_state("cp2", "drain")
    assert sent[-1] == "set server control-plane/cp2 state drain"
    with pytest.raises(lb.LoadBalancerError, match="no control plane server 'cp9'"):
        proxy.set_server_state("cp9", "maint")


def test_unexpected_admin_answer_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    proxy = lb.HAProxy(tmp_path)
    monkeypatch.setattr(proxy, "admin", lambda command: "Unknown command.\n")
    with pytest.raises(lb.LoadBalancerError, match="show stat"):
        proxy.server_states()
