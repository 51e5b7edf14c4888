"""machine.time read into what runs: servers as HOST[:PORT], the chrony.conf rendered from them
(only the node's own paths, no NTP service, no UDP command port), and chronyc's tracking line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeplane.config import models
from kubeplane.services import timesync, timesync_io
from kubeplane.services.timesync import Server

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("value", "server"),
    [
        ("time.cloudflare.com", Server("time.cloudflare.com")),
        ("10.5.0.1", Server("10.5.0.1")),
        ("10.5.0.1:11123", Server("10.5.0.1", 11123)),
        ("ntp.example.org:123", Server("ntp.example.org", 123)),
        ("fd00::1", Server("fd00::1")),
        ("[fd00::1]:1123", Server("fd00::1", 1123)),
    ],
)
def test_servers_are_host_and_optional_port(value: str, server: Server) -> None:
    assert timesync.parse_server(value) == server
    assert str(server) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10.5.0.1:0", "the port must be 1-65535"),
        ("10.5.0.1:70000", "the port must be 1-65535"),
        ("10.5.0.1:ntp", "the port must be 1-65535"),
        ("[fd00::1]", "an IPv6 address with a port is"),
        ("[nope]:123", '"nope" is not an IPv6 address'),
        ("bad host", '"bad host" is not a host name or address'),
        ("-x", "is not a host name or address"),
    ],
)
def test_a_server_that_is_not_host_port_says_why(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        timesync.parse_server(value)


def test_no_time_section_runs_nothing_and_waits_for_nothing() -> None:
    wanted = timesync.desired(None)
    assert not wanted.runs
    assert wanted == timesync.Desired()


def test_servers_run_unless_disabled() -> None:
    time = models.Time(servers=["a.example", "10.5.0.1:1123", "a.example"], boot_timeout="30s")
    wanted = timesync.desired(time)
    assert wanted.runs
    assert wanted.servers == (Server("a.example"), Server("10.5.0.1", 1123))  # duplicates once
    assert wanted.boot_timeout == 30.0
    assert not timesync.desired(models.Time(servers=["a.example"], disabled=True)).runs
    assert not timesync.desired(models.Time(servers=[])).runs
    assert timesync.desired(models.Time(servers=["a.example"])).boot_timeout == timesync.DEFAULT_BOOT_TIMEOUT


def test_a_bad_server_is_an_error_naming_the_field_and_nothing_runs() -> None:
    wanted = timesync.desired(models.Time(servers=["a.example", "b.example:x"]))
    assert not wanted.runs
    assert wanted.errors == (
        'machine.time.servers[1]: "b.example:x" is not HOST[:PORT]: the port must be 1-65535',
    )


def test_chrony_conf_keeps_everything_in_the_node_directory() -> None:
    where = timesync.files(Path("/node"))
    text = timesync.render_config((Server("time.example"), Server("10.5.0.1", 11123)), where)
    assert text == (
        "# Written by kubeplane from machine.time; chronyd runs with -x: it never sets the clock.\n"
        "server time.example iburst\n"
        "server 10.5.0.1 port 11123 iburst\n"
        "# No NTP service and no UDP command port: only this node's command socket.\n"
        "port 0\n"
        "cmdport 0\n"
        "bindcmdaddress /node/var/lib/kubeplane/chrony/chronyd.sock\n"
        "pidfile /node/var/lib/kubeplane/chrony/chronyd.pid\n"
        "driftfile /node/var/lib/kubeplane/chrony/chrony.drift\n"
    )
    assert "/etc/chrony" not in text and "/run/chrony" not in text
    assert "-x" in timesync.DAEMON_FLAGS


def test_tracking_of_a_synced_daemon() -> None:
    line = (
        "7F000001,127.0.0.1,9,1795566204.293386280,-0.000001761,-0.000000435,0.000001961,0.085,"
        "-0.015,1.752,0.000007225,0.000003911,0.5,Normal\n"
    )
    tracking = timesync.parse_tracking(line)
    assert tracking == timesync.Tracking(
        source="127.0.0.1", stratum=9, offset=0.000001761, leap_status="Normal"
    )
    assert tracking.synced


def test_tracking_of_a_daemon_without_a_source() -> None:
    line = (
        "00000000,,0,0.000000000,0.000000000,0.000000000,0.000000000,0.000,0.000,0.000,1.0,1.0,0.0,"
        "Not synchronised\n"
    )
    tracking = timesync.parse_tracking(line)
    assert tracking == timesync.Tracking(source="", stratum=0, offset=0.0, leap_status="Not synchronised")
    assert not tracking.synced


def test_tracking_output_that_is_not_csv_is_an_error() -> None:
    with pytest.raises(ValueError, match="unexpected chronyc tracking output"):
        timesync.parse_tracking("506 Cannot talk to daemon\n")


def test_a_root_too_deep_for_chronycs_socket_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    with pytest.raises(timesync_io.TimeSyncError, match="too long for a unix socket"):
        timesync_io.prepare(timesync.files(deep), "")
    assert not deep.exists()
