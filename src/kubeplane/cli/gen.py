"""`kubeplane gen`: machine configs, secrets bundles, and the manual PKI commands (ca, key, csr, crt).

The PKI commands follow the admin certificate renewal flow of the original's PKI guide::

    kubeplane gen key --name admin
    kubeplane gen csr --key admin.key --ip 127.0.0.1
    kubeplane gen crt --ca ca --csr admin.csr --name admin

Every command refuses to overwrite an existing output file unless ``--force`` is given, and checks
all of its outputs before writing any, so a refused run leaves nothing half-written. Files that hold
private keys (including machine configs and client configs) are written with mode 0600, atomically
and with that mode from the start (:mod:`kubeplane.fileio`); an overwritten file gets the new mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import click

from kubeplane import fileio, pki
from kubeplane.config import client, defaults
from kubeplane.config import generate as gen_config

_PRIVATE = fileio.SECRET_MODE
_PUBLIC = fileio.PUBLIC_MODE
_FORCE_HELP = "Overwrite existing output files."


def register(group: click.Group) -> None:
    """Add this family's commands to the root group."""
    group.add_command(gen)


@click.group()
def gen() -> None:
    """Generate machine configs, secrets, CAs, keys, CSRs and certificates."""


# --- files ------------------------------------------------------------------------------------


def write_files(files: Sequence[tuple[Path, bytes, int]], *, force: bool) -> None:
    """Write ``(path, content, mode)`` triples; with ``force`` off, refuse if any path exists."""
    if not force:
        existing = [str(path) for path, _, _ in files if path.exists()]
        if existing:
            raise click.ClickException(
                f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: "
                "pass --force to overwrite or choose another output"
            )
    for path, content, mode in files:
        # A missing output directory will hold keys: only its owner may enter it.
        path.parent.mkdir(mode=fileio.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        fileio.write_atomic(path, content, mode=mode)
        click.echo(f"created {path}")


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {path}: {exc.strerror}") from exc


def _split(values: Sequence[str]) -> list[str]:
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


# --- gen secrets / gen config -----------------------------------------------------------------


@gen.command("secrets")
@click.option(
    "-o", "--output", "output", default="secrets.yaml", show_default=True, help="Bundle file to write."
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def secrets_cmd(output: str, force: bool) -> None:
    """Generate a secrets bundle (CAs, keys, tokens) to reuse with `gen config --from-secrets`."""
    bundle = gen_config.new_secrets()
    text = gen_config.dump_yaml(gen_config.secrets_to_dict(bundle))
    write_files([(Path(output), text.encode(), _PRIVATE)], force=force)


@gen.command("config")
@click.argument("name")
@click.argument("endpoint")
@click.option(
    "-o", "--output-dir", "output_dir", default=".", show_default=True, help="Directory for the files."
)
@click.option(
    "--kubernetes-version", default=defaults.KUBERNETES_VERSION, show_default=True, help="Kubernetes version."
)
@click.option(
    "--additional-sans",
    multiple=True,
    metavar="SAN[,SAN]",
    help="Extra names/IPs for the API server certificate.",
)
@click.option(
    "--dns-domain", default=defaults.DEFAULT_DNS_DOMAIN, show_default=True, help="Cluster DNS domain."
)
@click.option(
    "--registry-mirror",
    "registry_mirrors",
    multiple=True,
    metavar="HOST=URL",
    help="Registry mirror (repeatable).",
)
@click.option(
    "--config-patch",
    "config_patches",
    multiple=True,
    metavar="PATCH|@FILE",
    help="RFC 6902 JSON patch (a list) or merge patch (a mapping), JSON or YAML, applied to every config.",
)
@click.option(
    "--node-api-port",
    type=click.IntRange(1, 65535),
    help=f"machine.ports.nodeAPI of every config (default {defaults.DEFAULT_NODE_API_PORT}); "
    "the client config's endpoint gets it too.",
)
@click.option(
    "--trustd-port",
    type=click.IntRange(1, 65535),
    help=f"machine.ports.trustd of every config (default {defaults.DEFAULT_TRUSTD_PORT}).",
)
@click.option("--with-init", is_flag=True, help="Also write init.yaml (type init) for the first node.")
@click.option(
    "--from-secrets", type=click.Path(dir_okay=False), help="Reuse the PKI of a `gen secrets` bundle."
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def config_cmd(
    *,
    name: str,
    endpoint: str,
    output_dir: str,
    kubernetes_version: str,
    additional_sans: tuple[str, ...],
    dns_domain: str,
    registry_mirrors: tuple[str, ...],
    config_patches: tuple[str, ...],
    node_api_port: int | None,
    trustd_port: int | None,
    with_init: bool,
    from_secrets: str | None,
    force: bool,
) -> None:
    """Generate machine configs for cluster NAME whose Kubernetes API is at ENDPOINT (https://HOST:PORT).

    Writes controlplane.yaml, worker.yaml (init.yaml with --with-init) and kubeplaneconfig, a client
    config with an admin certificate; merge it into your client config to talk to the nodes.
    """
    try:
        if from_secrets:
            bundle = gen_config.load_secrets(
                _read(from_secrets, "secrets bundle").decode(), source=from_secrets
            )
        else:
            bundle = gen_config.new_secrets()
        options = gen_config.GenOptions(
            cluster_name=name,
            endpoint=endpoint,
            kubernetes_version=kubernetes_version,
            additional_sans=tuple(_split(additional_sans)),
            dns_domain=dns_domain,
            registry_mirrors=gen_config.parse_mirrors(registry_mirrors),
            with_init=with_init,
            node_api_port=node_api_port,
            trustd_port=trustd_port,
            patches=tuple(_load_patch(value) for value in config_patches),
        )
        generated = gen_config.generate(options, bundle)
    except gen_config.GenerateError as exc:
        raise click.ClickException(str(exc)) from exc
    out = Path(output_dir)
    files = [
        (out / f"{machine_type}.yaml", gen_config.dump_yaml(document).encode(), _PRIVATE)
        for machine_type, document in generated.documents.items()
    ]
    files.append((out / "kubeplaneconfig", client.dumps(generated.client_config).encode(), _PRIVATE))
    write_files(files, force=force)


def _load_patch(value: str) -> gen_config.Patch:
    if value.startswith("@"):
        return gen_config.parse_patch(_read(value[1:], "config patch file").decode(), source=value[1:])
    return gen_config.parse_patch(value, source="--config-patch")


# --- manual PKI -------------------------------------------------------------------------------


def _hours(value: int) -> timedelta:
    if value <= 0:
        raise click.BadParameter("must be a positive number of hours", param_hint="--hours")
    return timedelta(hours=value)


@gen.command("ca")
@click.option("--organization", required=True, help="Organization (and file name) of the CA.")
@click.option("--hours", default=87600, show_default=True, help="Validity in hours.")
@click.option("--rsa", is_flag=True, help="RSA 4096 instead of ECDSA P-256.")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def ca_cmd(*, organization: str, hours: int, rsa: bool, force: bool) -> None:
    """Generate a self-signed CA: ORG.crt, ORG.key and ORG.sha256 (its kubeadm-style hash)."""
    try:
        ca = pki.new_ca(
            organization,
            organization=organization,
            algorithm="rsa-4096" if rsa else "ecdsa-p256",
            lifetime=_hours(hours),
        )
    except pki.PKIError as exc:
        raise click.ClickException(str(exc)) from exc
    write_files(
        [
            (Path(f"{organization}.crt"), ca.cert, _PUBLIC),
            (Path(f"{organization}.key"), ca.key, _PRIVATE),
            (Path(f"{organization}.sha256"), (pki.ca_cert_hash(ca.cert) + "\n").encode(), _PUBLIC),
        ],
        force=force,
    )


@gen.command("key")
@click.option("--name", required=True, help="Base name of the key file (NAME.key).")
@click.option(
    "--algorithm",
    type=click.Choice(pki.KEY_ALGORITHMS),
    default="ecdsa-p256",
    show_default=True,
    help="Key type.",
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def key_cmd(*, name: str, algorithm: pki.KeyAlgorithm, force: bool) -> None:
    """Generate a private key NAME.key."""
    write_files([(Path(f"{name}.key"), pki.generate_key(algorithm), _PRIVATE)], force=force)


@gen.command("csr")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False), help="Private key file.")
@click.option("--ip", "ips", required=True, multiple=True, help="IP address SAN (repeatable).")
@click.option("--dns", "dns_names", multiple=True, help="DNS name SAN (repeatable).")
@click.option(
    "--roles",
    multiple=True,
    default=(pki.ROLE_ADMIN,),
    show_default=True,
    help=f"Node API roles, carried as Organizations ({', '.join(pki.ROLES)}).",
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def csr_cmd(
    *, key_path: str, ips: tuple[str, ...], dns_names: tuple[str, ...], roles: tuple[str, ...], force: bool
) -> None:
    """Generate a CSR for KEY, written next to it as <key name>.csr."""
    path = Path(key_path)
    roles_list = _split(roles)
    unknown = [role for role in roles_list if role not in pki.ROLES]
    if unknown:
        raise click.BadParameter(
            f"unknown role(s) {', '.join(unknown)}: use {', '.join(pki.ROLES)}", param_hint="--roles"
        )
    try:
        csr = pki.new_csr(
            key=_read(path, "key"),
            common_name=path.stem,
            organizations=roles_list,
            dns_names=_split(dns_names),
            ip_addresses=_split(ips),
        )
    except pki.PKIError as exc:
        raise click.ClickException(f"{key_path}: {exc}") from exc
    write_files([(path.with_suffix(".csr"), csr, _PUBLIC)], force=force)


@gen.command("crt")
@click.option("--ca", "ca_name", required=True, help="CA base name: reads CA.crt and CA.key.")
@click.option("--csr", "csr_path", required=True, type=click.Path(dir_okay=False), help="CSR file to sign.")
@click.option("--name", required=True, help="Base name of the certificate file (NAME.crt).")
@click.option("--hours", default=24, show_default=True, help="Validity in hours.")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def crt_cmd(*, ca_name: str, csr_path: str, name: str, hours: int, force: bool) -> None:
    """Sign a CSR with a CA, writing NAME.crt."""
    ca = pki.CertKey(cert=_read(f"{ca_name}.crt", "CA certificate"), key=_read(f"{ca_name}.key", "CA key"))
    try:
        cert = pki.sign_csr(ca=ca, csr=_read(csr_path, "CSR"), lifetime=_hours(hours))
    except pki.PKIError as exc:
        raise click.ClickException(f"signing {csr_path} with {ca_name}.crt/{ca_name}.key: {exc}") from exc
    write_files([(Path(f"{name}.crt"), cert, _PUBLIC)], force=force)
